"""Admission under continuous batching: every free slot taken in order, against slots held
for a whole group of samples, on jobs of many samples per prompt.

``python bench/admission.py``: the embedded default model (SmolLM2-135M-Instruct, CPU), in
the chat template, two prompt sets (``--sets``): ``spread``, 8 prompts of
``_prompts.CHAT_MIXED`` spread over its answer lengths (a word to past the cap), and
``short``, its 8 prompts of one-line answers (``CHAT_MIXED[8:16]``); ``--n`` samples of
each prompt (``8,16``: one job per count), sampled (temperature 0.7, seed 0), at most
``--max-new-tokens`` (128) a row, each ending at eos, ``--rows`` (16) rows at once, n-gram
drafting and the default policy (``--draft none``: drafting off, which takes the policy's
run-to-run choices out of the comparison; writes ``cpu_admission_off.*``). Two admission
rules, side by side in one process (the model loaded once):

* ``in-order``: bass's :meth:`bass.scheduler.Queue.admit`: every free slot takes the next
  waiting prompt (a prompt's samples, side by side in the job, run side by side);
* ``group``: the rule before it (here as :func:`admit_groups`): a prompt's samples wait
  until slots are free for all of them, unless no row runs.

``--rounds`` (2) rounds, each running both rules on every job, the rules' order swapped
each round. Reported per job and rule: wall seconds, tokens/s, steps, main-model passes
(the steps' and the prefill passes of their own: a prompt admitted while rows run has its
prefill ride in their verify pass, so steps alone favour the group rule, whose waves
prefill apart), mean rows per step (of ``--rows``), admission waves, mean accepted draft
tokens per step per row; the median of the rounds' and each round's, and in-order's
tokens/s over group's. Sampled rows are keyed by (seed, row, position), so both rules must
give the same rows: checked, and any difference printed loudly. Writes
``bench/results/cpu_admission.{md,json}``; ``--smoke``: a tiny random Llama and a few
prompts (``smoke_admission.*`` under ``--out``; the tests run it).
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
from _prompts import CHAT_MIXED, tiny_llama

from bass import scheduler

RESULTS = Path(__file__).parent / "results"
RULES = ("in-order", "group")


def admit_groups(self, state) -> tuple[list[int], list[int]]:
    """The admission rule before in-order admission (bass until 2026-11-27): waiting
    prompts into the free slots, in order, equal prompts together; a group that does not
    fit waits for more free slots unless no row runs."""
    free, new, waiting = state.free(), [], self.waiting
    while waiting and len(new) < len(free):
        head = state.by_prompt[waiting[0]]
        group = 1
        while group < len(waiting) and state.by_prompt[waiting[group]] == head:
            group += 1
        room = len(free) - len(new)
        if group > room and (new or state.active()):
            break
        new += [waiting.popleft() for _ in range(min(group, room))]
    now = time.perf_counter()
    for s, p in zip(free, new):
        state.admit(s, p)
        self.started[p] = now
    return free[: len(new)], new


def setup(args):
    """The main model, each set's prompts (token ids) and the eos id."""
    if args.smoke:
        import torch

        main = tiny_llama(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2)
        gen = torch.Generator().manual_seed(1)
        prompts = [torch.randint(3, 96, (4 + 3 * i,), generator=gen).tolist() for i in range(4)]
        return main, {"smoke": prompts}, 7  # eos: common enough that rows end at varied lengths
    from bass import load_default_pair

    main, tok = load_default_pair()
    step = len(CHAT_MIXED) // 8
    texts = {
        "spread": [CHAT_MIXED[i * step + step // 2] for i in range(8)],
        "short": CHAT_MIXED[8:16],
    }

    def ids(text):
        x = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
        return x if isinstance(x, list) else x["input_ids"]

    return (
        main,
        {name: [ids(t) for t in texts[name]] for name in args.sets.split(",")},
        tok.eos_token_id,
    )


def run_rule(gen, rule: str, prompts, args, eos) -> tuple[dict, list]:
    original = scheduler.Queue.admit
    if rule == "group":
        scheduler.Queue.admit = admit_groups
    try:
        t0 = time.perf_counter()
        res = gen.generate(
            prompts,
            max_new_tokens=args.max_new_tokens,
            max_rows=args.rows,
            do_sample=True,
            temperature=0.7,
            seed=0,
            eos_token_id=eos,
        )
        wall = time.perf_counter() - t0
    finally:
        scheduler.Queue.admit = original
    st = res.stats
    steps = len(st.steps)
    row = {
        "wall_s": wall,
        "tokens": st.tokens_generated,
        "tokens_per_s": st.tokens_generated / wall,
        "steps": steps,
        "main_passes": st.main_passes,  # the steps' and the prefill passes of their own
        "rows_per_step": sum(s.num_rows for s in st.steps) / steps if steps else 0.0,
        "admissions": st.admissions,
        "mean_accepted": st.mean_accepted,
    }
    return row, res.sequences


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", default="8,16", help="samples per prompt, one job per count")
    ap.add_argument("--sets", default="spread,short", help="prompt sets: spread, short")
    ap.add_argument("--draft", default="ngram", choices=["ngram", "none"])
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    if args.smoke:
        args.rows, args.max_new_tokens, args.rounds = 3, 12, 1
        args.n = "2,3" if args.n == "8,16" else args.n
    counts = [int(c) for c in args.n.split(",")]
    import bass

    main_model, sets, eos = setup(args)
    gen = bass.Generator(main_model, None if args.draft == "none" else args.draft)
    gen.generate(next(iter(sets.values()))[:1], max_new_tokens=2)  # first-use costs
    jobs = [(name, n) for name in sets for n in counts]
    runs: dict = {}
    mismatches: dict = {}
    for r in range(args.rounds):
        order = RULES if r % 2 == 0 else RULES[::-1]
        for name, n in jobs:
            job = [p for p in sets[name] for _ in range(n)]
            seqs = {}
            for rule in order:
                row, seqs[rule] = run_rule(gen, rule, job, args, eos)
                runs.setdefault((name, n, rule), []).append(row)
                print(f"round {r + 1} {name} n={n} {rule}: {json.dumps(row)}", flush=True)
            bad = [i for i, (a, b) in enumerate(zip(*seqs.values())) if a != b]
            if bad:
                print(f"MISMATCH {name} n={n} round {r + 1}: rows {bad} differ", flush=True)
            mismatches.setdefault(f"{name} n={n}", []).extend(bad)
    table = []
    for name, n in jobs:
        ratio = [
            a["tokens_per_s"] / b["tokens_per_s"]
            for a, b in zip(runs[(name, n, RULES[0])], runs[(name, n, RULES[1])])
        ]
        for rule in RULES:
            rows = runs[(name, n, rule)]
            med = {k: statistics.median(x[k] for x in rows) for k in rows[0]}
            first = rule == RULES[0]
            table.append({"set": name, "n": n, "rule": rule, **med, "rounds": rows,
                          "vs_group": statistics.median(ratio) if first else 1.0,
                          "vs_group_rounds": ratio if first else None})  # fmt: skip
    argv_shown = sys.argv[1:] if argv is None else list(argv)
    sizes = {k: len(v) for k, v in sets.items()}
    meta = run_meta("admission.py", argv_shown, prompts=sizes, rows=args.rows, draft=args.draft,
                    max_new_tokens=args.max_new_tokens, rounds=args.rounds, n=counts)  # fmt: skip
    name = "smoke_admission" if args.smoke else "cpu_admission"
    name += "_off" if args.draft == "none" else ""
    data = {"meta": meta, "table": table, "mismatches": mismatches}
    write_results(args.out, name, data, to_markdown)
    return 0


def to_markdown(data: dict) -> str:
    meta = data["meta"]
    lines = header("Admission: every free slot in order, against slots held for a group", meta)
    lines += [
        "",
        f"Setup: prompt sets {meta['prompts']} (`spread`: answers from a word to past the cap; "
        "`short`: one-line answers), `n` samples of each prompt (sampled, temperature 0.7, "
        f"seed 0), at most {meta['max_new_tokens']} new tokens a row, each ending at eos; "
        f"{meta['rows']} rows at once; "
        + ("drafting off" if meta.get("draft") == "none" else "n-gram drafting, default policy")
        + "; one process, the "
        f"model loaded once; {meta['rounds']} round(s), the rules' order swapped each round. "
        "`in-order`: bass's admission (every free slot takes the next waiting prompt); "
        "`group`: the rule before it (a prompt's samples wait for slots for all of them "
        "while any row runs). Medians of the rounds, each round's in brackets.",
        "",
        "| set | n | rule | new tokens | wall s | tokens/s | vs group | steps | main passes | "
        "rows per step | admissions | mean accepted |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def each(row, key, fmt):
        return " / ".join(format(x[key], fmt) for x in row["rounds"])

    for row in data["table"]:
        ratio = row["vs_group_rounds"]
        vs = (
            "1.00x"
            if ratio is None
            else (f"{row['vs_group']:.2f}x ({' / '.join(f'{x:.2f}x' for x in ratio)})")
        )
        lines.append(
            f"| {row['set']} | {row['n']} | {row['rule']} | {row['tokens']:.0f} | "
            f"{row['wall_s']:.2f} | "
            f"{row['tokens_per_s']:.1f} ({each(row, 'tokens_per_s', '.1f')}) | {vs} | "
            f"{row['steps']:.0f} | {row['main_passes']:.0f} | {row['rows_per_step']:.2f} | "
            f"{row['admissions']:.0f} | "
            f"{row['mean_accepted']:.3f} |"
        )
    lines += ["", "## Are the rows equal?", ""]
    for n, bad in data["mismatches"].items():
        lines.append(
            f"- {n}: " + ("every row equal under both rules (token for token)." if not bad
                            else f"**MISMATCH**: rows {sorted(set(bad))} differ.")
        )  # fmt: skip
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
