"""A prompt's samples sharing one prefill, against each sample prefilling its prompt, on a
HumanEval sampling job (``bass eval humaneval --n``'s shape).

``python bench/shared_prefill.py``: the embedded default model (SmolLM2-135M-Instruct,
CPU), the first ``--problems`` (16) HumanEval prompts as plain text (no chat template, as
``bass eval humaneval`` without ``--chat``), ``--n`` (10) samples each (temperature 0.8,
seed 0), the Codex stop sequences, at most ``--max-new-tokens`` (128) a row, ``--rows``
(16) rows at once, n-gram drafting and the default policy. Two ways, side by side in one
process (the model loaded once): ``shared``, bass as it is (:func:`bass.passes.leaders`,
:func:`bass.scheduler.share_prompts`); ``each``, every row prefilling its whole prompt
(both turned off here, as bass did before 2026-12-01). ``--rounds`` (2), the order swapped
each round. Reported: wall seconds, tokens/s, the prompt tokens the prefill computed and
those copied, admissions, and shared's tokens/s over each's (the median of the rounds' and
each round's). Sampled rows are keyed by (seed, row, position): both ways must give the
same rows (checked). Writes ``bench/results/cpu_shared_prefill.{md,json}``; ``--smoke``: a
tiny random Llama (``smoke_shared_prefill.*`` under ``--out``; the tests run it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _machine import header, run_meta, write_results
from _prompts import tiny_llama

from bass import passes, scheduler

RESULTS = Path(__file__).parent / "results"
WAYS = ("shared", "each")
STOPS = ["\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#"]


def setup(args):
    """The main model, the prompts (token ids), the eos id and the tokenizer (smoke: none)."""
    if args.smoke:
        import torch

        main = tiny_llama(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2)
        gen = torch.Generator().manual_seed(1)
        prompts = [torch.randint(3, 96, (20 + 9 * i,), generator=gen).tolist() for i in range(3)]
        return main, prompts, 7, None
    from bass import load_default_pair, models
    from bass.humaneval import load_problems

    main, tok = load_default_pair()
    problems = list(load_problems().values())[: args.problems]
    prompts = [models.encode_prompt(tok, p["prompt"], False) for p in problems]
    return main, prompts, tok.eos_token_id, tok


def run_way(gen, way: str, prompts, args, eos, tok) -> tuple[dict, list]:
    saved = passes.leaders, scheduler.share_prompts
    if way == "each":  # every row its own prefill of its whole prompt
        passes.leaders = lambda prompts: list(range(len(prompts)))
        scheduler.share_prompts = lambda gen, state, slots: state.copied.clear()
    stops = {} if tok is None else {"stop_strings": STOPS, "tokenizer": tok}
    try:
        t0 = time.perf_counter()
        res = gen.generate(prompts, n=args.n, max_new_tokens=args.max_new_tokens,
                           max_rows=args.rows, do_sample=True, temperature=0.8, seed=0,
                           eos_token_id=eos, **stops)  # fmt: skip
        wall = time.perf_counter() - t0
    finally:
        passes.leaders, scheduler.share_prompts = saved
    st = res.stats
    row = {
        "wall_s": wall,
        "tokens": st.tokens_generated,
        "tokens_per_s": st.tokens_generated / wall,
        "prefill_tokens": st.prefill_tokens,
        "shared_prompt_tokens": st.shared_prompt_tokens,
        "admissions": st.admissions,
        "riding_admissions": st.riding_admissions,
    }
    return row, res.sequences


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--problems", type=int, default=16, help="the first N HumanEval prompts")
    ap.add_argument("--n", type=int, default=10, help="samples per prompt")
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    if args.smoke:
        args.n, args.rows, args.max_new_tokens, args.rounds = 3, 4, 10, 1
    import bass

    main_model, prompts, eos, tok = setup(args)
    gen = bass.Generator(main_model, "ngram")
    gen.generate(prompts[:1], max_new_tokens=2)  # first-use costs
    runs: dict = {w: [] for w in WAYS}
    seqs: dict = {}
    mismatches: list = []
    for r in range(args.rounds):
        for way in WAYS if r % 2 == 0 else WAYS[::-1]:
            row, seqs[way] = run_way(gen, way, prompts, args, eos, tok)
            runs[way].append(row)
            print(f"round {r + 1} {way}: {json.dumps(row)}", flush=True)
        bad = [i for i, (a, b) in enumerate(zip(*seqs.values(), strict=True)) if a != b]
        if bad:
            print(f"MISMATCH round {r + 1}: rows {bad} differ", flush=True)
        mismatches += bad
    ratio = [a["tokens_per_s"] / b["tokens_per_s"] for a, b in zip(runs["shared"], runs["each"])]
    table = []
    for way in WAYS:
        med = {k: statistics.median(x[k] for x in runs[way]) for k in runs[way][0]}
        table.append({"way": way, **med, "rounds": runs[way]})
    argv_shown = sys.argv[1:] if argv is None else list(argv)
    meta = run_meta("shared_prefill.py", argv_shown, problems=len(prompts), n=args.n,
                    rows=args.rows, max_new_tokens=args.max_new_tokens, rounds=args.rounds,
                    prompt_tokens=[len(p) for p in prompts])  # fmt: skip
    data = {"meta": meta, "table": table, "vs_each": statistics.median(ratio),
            "vs_each_rounds": ratio, "mismatches": mismatches}  # fmt: skip
    name = "smoke_shared_prefill" if args.smoke else "cpu_shared_prefill"
    write_results(args.out, name, data, to_markdown)
    return 0


def to_markdown(data: dict) -> str:
    meta = data["meta"]
    tokens = meta["prompt_tokens"]
    lines = header("A prompt's samples sharing one prefill, against a prefill per sample", meta)
    lines += [
        "",
        f"Job: {meta['problems']} prompts ({min(tokens)} to {max(tokens)} tokens, "
        f"{sum(tokens)} in all) x {meta['n']} samples, at most {meta['max_new_tokens']} new "
        f"tokens a row, {meta['rows']} rows at once, sampled (temperature 0.8, seed 0), n-gram "
        f"drafting; {meta['rounds']} round(s), the order swapped each round; medians, each "
        "round's in brackets.",
        "",
        "| way | wall s | tokens | tokens/s | prompt tokens computed | copied | admissions "
        "(riding) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in data["table"]:
        each = " / ".join(f"{x['tokens_per_s']:.1f}" for x in r["rounds"])
        lines.append(
            f"| {r['way']} | {r['wall_s']:.2f} | {r['tokens']:.0f} | {r['tokens_per_s']:.1f} "
            f"({each}) | {r['prefill_tokens']:.0f} | {r['shared_prompt_tokens']:.0f} | "
            f"{r['admissions']:.0f} ({r['riding_admissions']:.0f}) |"
        )
    rounds = " / ".join(f"{x:.2f}x" for x in data["vs_each_rounds"])
    lines += ["", f"shared over each (tokens/s): {data['vs_each']:.2f}x ({rounds})."]
    bad = data["mismatches"]
    lines.append(
        "Rows: every row equal in both ways." if not bad else f"**ROWS DIFFER**: {sorted(set(bad))}"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
