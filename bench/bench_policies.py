"""The draft-length policies side by side, and n-gram sibling lookup, in one run.

``python bench/bench_policies.py`` (``nox -s bench`` runs it): the embedded default model
(SmolLM2-135M-Instruct) with n-gram drafting, greedy, on two prompt sets (HumanEval code
completions and chat prompts) at batch 1, 4, 8 and 16. Every cell (prompt set, batch)
times transformers ``generate``, bass with drafting off, and bass with each built-in
policy, round-robin within each of ``--repeats`` rounds (the order rotating, so the
machine's slow spells spread over all methods), and keeps each method's median wall time
and, against drafting off, ``generate`` and the best policy, the median of the per-round
wall-time ratios. Every row generates
exactly ``--max-new`` tokens (eos ignored), so all methods do equal work.

Per cell it reports tokens/s, the speed against drafting off and against ``generate``,
and each policy's *regret*: ``1 - rate / best rate`` among the built-in policies in that
cell. The summary checks the default policy's targets: never more than 5% below drafting
off, and within 10% of the best built-in policy, in every cell.

``--siblings``: sibling lookup (the n-gram drafter also searching the other samples of
the same prompt) on and off, with ``n`` samples per HumanEval prompt, greedy and sampled
(temperature 0.8): the lookup's drafted and accepted tokens per step per row with
``constant`` k=4 (the drafter's own quality, whatever the policy) and tokens/s with it and
with the default policy; ``--siblings-only`` measures just that table
(``bench/results/cpu_siblings.{md,json}``).

``--control`` adds an A/A pair (drafting off timed twice per round): the cell's noise
floor, beside the policies' ratios. ``--sets`` picks prompt sets, ``--tag`` the output
file stem.

``--setup tiny`` runs the same tables on tiny random models in seconds (the smoke test).
Writes ``bench/results/<setup>_policies.{md,json}``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
import _machine
from _prompts import CHAT, edit_prompts, humaneval_prompts, tiny_llama

from bass import Generator
from bass.drafters import NGramDrafter
from bass.models import encode_prompt

RESULTS = Path(__file__).parent / "results"
DEFAULT = "adaptive"
POLICIES = {
    "adaptive": {},
    "bass": {},
    "constant": {"k": 4},
    "hf-heuristic": {},
    "goodput": {},
}
BASELINES = ("hf-generate", "drafting off")


# ----------------------------------------------------------------------------- setups


def smollm_setup():
    from bass import load_default_pair

    main, tok = load_default_pair()
    sets = {
        "humaneval": humaneval_prompts(tok, 16),
        "chat": [encode_prompt(tok, t, chat=True) for t in CHAT],
        "edit": edit_prompts(tok),  # code edits: the answer copies most of the prompt
    }
    return main, tok, sets, "SmolLM2-135M-Instruct (embedded), n-gram drafting"


def tiny_setup():
    main = tiny_llama(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    with torch.no_grad():
        main.lm_head.weight.mul_(25.0)  # decisive, repetitive greedy text: n-grams match
    g = torch.Generator().manual_seed(0)
    sets = {
        name: [torch.randint(0, 128, (int(n),), generator=g).tolist() for n in lens]
        for name, lens in (("ragged", (5, 17, 9, 30)), ("even", (12, 12, 12, 12)))
    }
    return main, None, sets, "tiny random Llama, n-gram drafting (smoke)"


# ----------------------------------------------------------------------------- methods


def hf_generate(main, prompts, max_new) -> float:
    width = max(map(len, prompts))
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, p in enumerate(prompts):
        ids[b, width - len(p) :] = torch.tensor(p)
        mask[b, width - len(p) :] = 1
    t0 = time.perf_counter()
    with torch.inference_mode():
        main.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=max_new,
            min_new_tokens=max_new,
            do_sample=False,
            pad_token_id=0,
        )
    return time.perf_counter() - t0


def bass_run(main, prompts, max_new, policy, options, draft="ngram", **kw) -> dict:
    gen = Generator(main, draft, policy=policy, policy_options=options)
    t0 = time.perf_counter()
    res = gen.generate(prompts, max_new_tokens=max_new, **kw)
    wall = time.perf_counter() - t0
    st = res.stats
    return {
        "wall_s": wall,
        "mean_accepted": st.mean_accepted,
        "verify_tokens": st.verify_tokens,
        "steps": len(st.steps),
        "host_share": st.host_share,
        "drafted": sum(sum(x.drafted) for x in st.steps),
        "accepted": sum(sum(x.accepted) for x in st.steps),
    }


CONTROL = "drafting off, again"


def methods(main, max_new, control=False):
    out = {
        "hf-generate": lambda ps: {"wall_s": hf_generate(main, ps, max_new)},
        "drafting off": lambda ps: bass_run(main, ps, max_new, "constant", {"k": 0}, draft=None),
    }
    if control:  # an A/A pair: its ratio to drafting off is the cell's noise, nothing else
        out[CONTROL] = out["drafting off"]
    for name, opts in POLICIES.items():
        out[name] = lambda ps, n=name, o=opts: bass_run(main, ps, max_new, n, o)
    return out


def paired(walls_a: list[float], walls_b: list[float]) -> float:
    """Speed of b against a: the median over rounds of a's wall over b's in the same round
    (a round's methods run back to back, so the machine's slow spells, which last tens of
    seconds here, hit both alike)."""
    return statistics.median(a / b for a, b in zip(walls_a, walls_b, strict=True))


def run_cell(main, prompts, max_new, repeats, control=False) -> dict:
    ms = methods(main, max_new, control)
    names = list(ms)
    runs: dict[str, list[dict]] = {m: [] for m in ms}
    for i in range(repeats):
        # round-robin, starting one method later each round: no method always runs first
        for m in names[i % len(names) :] + names[: i % len(names)]:
            runs[m].append(ms[m](prompts))
    tokens = len(prompts) * max_new
    cell = {}
    for m, rs in runs.items():
        wall = statistics.median(r["wall_s"] for r in rs)
        rec = {k: statistics.median(r[k] for r in rs) for k in rs[0] if k != "wall_s"}
        cell[m] = {
            "wall_s": wall,
            "tokens_per_s": tokens / wall,
            "walls": [r["wall_s"] for r in rs],
        }
        cell[m].update(rec)
    best = max(POLICIES, key=lambda p: cell[p]["tokens_per_s"])
    for m, r in cell.items():
        r["vs_off"] = paired(cell["drafting off"]["walls"], r["walls"])
        r["vs_hf"] = paired(cell["hf-generate"]["walls"], r["walls"])
        if m in POLICIES:
            r["regret"] = max(0.0, 1 - paired(cell[best]["walls"], r["walls"]))
    return cell


def siblings(main, tok, sets, max_new, repeats, n_values=(4, 8), prompts_per_n=2):
    """Sibling lookup on and off: ``n`` samples of each of ``prompts_per_n`` HumanEval
    prompts in one batch, greedy and sampled. The drafter's own quality is measured with
    ``constant`` k=4 (every row drafts what the lookup finds, up to 4, whatever it
    costs: accepted tokens per step and per drafted token), the speed a user gets with
    the default policy."""
    rows = []
    base = sets["humaneval"][:prompts_per_n]
    for n in n_values:
        batch = [p for p in base for _ in range(n)]
        for mode, kw in (("greedy", {}), ("t=0.8", {"do_sample": True, "temperature": 0.8})):
            for on in (False, True):
                fixed, default = [], []
                plan = (("constant", {"k": 4}, fixed), (DEFAULT, {}, default))
                for rep in range(repeats):
                    for policy, opts, out in plan:
                        drafter = NGramDrafter(siblings=on)
                        out.append(
                            bass_run(main, batch, max_new, policy, opts, drafter, seed=rep, **kw)
                        )
                rows.append(
                    {
                        "n": n,
                        "batch": len(batch),
                        "mode": mode,
                        "siblings": on,
                        "mean_accepted": statistics.mean(r["mean_accepted"] for r in fixed),
                        "acceptance": sum(r["accepted"] for r in fixed)
                        / max(1, sum(r["drafted"] for r in fixed)),
                        "drafted_per_step": statistics.mean(
                            r["drafted"] / max(1, r["steps"]) / len(batch) for r in fixed
                        ),
                        "tokens_per_s": statistics.median(
                            len(batch) * max_new / r["wall_s"] for r in default
                        ),
                        "tokens_per_s_constant": statistics.median(
                            len(batch) * max_new / r["wall_s"] for r in fixed
                        ),
                    }
                )
                print(rows[-1], flush=True)
    return rows


def siblings_markdown(rows, meta) -> list[str]:
    out = [
        "## Sibling lookup (n samples per HumanEval prompt, 2 prompts per batch)",
        "",
        f"Median of {meta['repeats']} runs (seeds 0..{meta['repeats'] - 1}). The lookup's "
        "quality with `constant` k=4 (every row drafts what the lookup finds, up to 4): "
        "drafted and accepted tokens per step per row, and the share of drafted tokens "
        "accepted; the speed with `constant` k=4 and with the default policy.",
        "",
        "| n | batch | decoding | sibling lookup | drafted / step / row | accepted / step / row "
        "| accepted / drafted | tokens/s (k=4) | tokens/s (default) |",
        "|---:|---:|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        out.append(
            f"| {r['n']} | {r['batch']} | {r['mode']} | {'on' if r['siblings'] else 'off'} "
            f"| {r['drafted_per_step']:.2f} | {r['mean_accepted']:.2f} | {r['acceptance']:.0%} "
            f"| {r['tokens_per_s_constant']:.1f} | {r['tokens_per_s']:.1f} |"
        )
    return out


# ----------------------------------------------------------------------------- report


def to_markdown(result: dict) -> str:
    meta = result["meta"]
    out = [
        *_machine.header(f"Draft-length policies: {meta['setup']}", meta),
        f"Workload: {meta['max_new']} new tokens per row, greedy, eos ignored; "
        f"{meta['repeats']} rounds, each running every method once, back to back (the "
        "order rotating from round to round). tokens/s: from the median wall time; "
        "`vs drafting off` and `vs hf-generate`: the median over rounds of the two "
        "methods' wall-time ratio in the same round (paired: the machine's slow spells "
        "hit both).",
        "",
        "Regret: `1 - speed / the best built-in policy's speed` (paired as above; the best: "
        "highest median tokens/s in the cell).",
        "",
    ]
    checks = []
    for name, cells in result["cells"].items():
        out += [
            f"## {name} prompts",
            "",
            "| batch | method | tokens/s | vs drafting off | vs hf-generate | regret "
            "| mean accepted / step / row | verify tokens | host share |",
            "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for batch, cell in cells.items():
            for m, r in cell.items():
                regret = f"{r['regret']:.1%}" if "regret" in r else ""
                acc = f"{r['mean_accepted']:.2f}" if "mean_accepted" in r else ""
                vt = str(int(r["verify_tokens"])) if "verify_tokens" in r else ""
                host = f"{r['host_share']:.1%}" if "host_share" in r else ""
                label = f"**{m}** (default)" if m == DEFAULT else m
                out.append(
                    f"| {batch} | {label} | {r['tokens_per_s']:.1f} | {r['vs_off']:.2f}x | "
                    f"{r['vs_hf']:.2f}x | {regret} | {acc} | {vt} | {host} |"
                )
            d = cell[DEFAULT]
            checks.append((name, batch, d["vs_off"], d["regret"]))
        out.append("")
    worst_off = min(c[2] for c in checks)
    worst_regret = max(c[3] for c in checks)
    ok_off = all(c[2] >= 0.95 for c in checks)
    ok_regret = all(c[3] <= 0.10 for c in checks)
    out += [
        "## Targets (default policy, every cell)",
        "",
        f"- never more than 5% below drafting off: **{'met' if ok_off else 'MISSED'}** "
        f"(worst cell {worst_off:.2f}x drafting off)",
        f"- within 10% of the best built-in policy: **{'met' if ok_regret else 'MISSED'}** "
        f"(worst regret {worst_regret:.1%})",
    ]
    missed = [c for c in checks if c[2] < 0.95 or c[3] > 0.10]
    out += [f"  - missed at {n} batch {b}: {o:.2f}x off, regret {r:.1%}" for n, b, o, r in missed]
    floors = [
        (name, batch, cell[CONTROL])
        for name, cells in result["cells"].items()
        for batch, cell in cells.items()
        if CONTROL in cell
    ]
    if floors:
        out += [
            "",
            f"Noise floor (`{CONTROL}`: drafting off timed twice per round, an A/A pair; its "
            "paired ratio to drafting off would be 1.00x on a quiet machine):",
            "",
        ]
        for name, batch, r in floors:
            off = result["cells"][name][batch]["drafting off"]["walls"]
            ratios = sorted(a / b for a, b in zip(off, r["walls"], strict=True))
            out.append(
                f"- {name} batch {batch}: {r['vs_off']:.2f}x (rounds {ratios[0]:.2f}-"
                f"{ratios[-1]:.2f})"
            )
    if result.get("siblings"):
        out += ["", *siblings_markdown(result["siblings"], meta)]
    return "\n".join(out) + "\n"


def run_meta(label: str, argv, max_new: int, repeats: int) -> dict:
    """What a result file says about its run: setup, command, date, machine, software."""
    return _machine.run_meta(
        "bench_policies.py", argv, setup=label, max_new=max_new, repeats=repeats
    )


def run(setup: str, batches, max_new, repeats, with_siblings, argv, control=False, only=None):
    main, tok, sets, label = (smollm_setup if setup == "smollm" else tiny_setup)()
    if only:
        sets = {k: v for k, v in sets.items() if k in only}
    # warm-up, discarded: first-use costs would land on whichever method runs first
    first = next(iter(sets.values()))[:1]
    hf_generate(main, first, 2)
    bass_run(main, first, 2, DEFAULT, {})
    cells = {}
    for name, prompts in sets.items():
        cells[name] = {}
        for B in batches:
            batch = (prompts * B)[:B]
            cells[name][B] = run_cell(main, batch, max_new, repeats, control)
            print(f"{name} batch {B}: " + ", ".join(
                f"{m} {r['tokens_per_s']:.1f}" for m, r in cells[name][B].items()
            ), flush=True)  # fmt: skip
    result = {
        "meta": run_meta(label, argv, max_new, repeats),
        "cells": cells,
    }
    if with_siblings and tok is not None:
        result["siblings"] = siblings(main, tok, sets, max_new, repeats)
    return result


@pytest.mark.parametrize("policy", list(POLICIES))
def test_policy_generation(benchmark, policy):
    main, _, sets, _ = tiny_setup()
    prompts = sets["ragged"]
    out = benchmark.pedantic(bass_run, args=(main, prompts, 24, policy, POLICIES[policy]), rounds=1)
    benchmark.extra_info.update(out)


def workload_args(ap: argparse.ArgumentParser) -> None:
    """The arguments the policy benchmarks share: setup, batch sizes, new tokens, rounds."""
    ap.add_argument("--setup", choices=("smollm", "tiny"), default="smollm")
    ap.add_argument("--batches", default="1,4,8,16")
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    workload_args(ap)
    ap.add_argument("--siblings", action="store_true", help="also measure sibling lookup")
    ap.add_argument(
        "--siblings-only",
        action="store_true",
        help="only the sibling-lookup table (writes <setup>_siblings.{md,json})",
    )
    ap.add_argument(
        "--control",
        action="store_true",
        help=f"also time drafting off twice per round ({CONTROL!r}): the cell's noise floor",
    )
    ap.add_argument("--sets", default=None, help="comma-separated prompt sets (default: all)")
    ap.add_argument("--tag", default=None, help="output file stem (default <setup>_policies)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    if args.siblings_only:
        return siblings_main(args, argv)
    batches = [int(b) for b in args.batches.split(",")]
    only = args.sets.split(",") if args.sets else None
    result = run(
        args.setup, batches, args.max_new, args.repeats, args.siblings, argv, args.control, only
    )
    stem = args.tag or ("cpu" if args.setup == "smollm" else "tiny") + "_policies"
    args.out.mkdir(parents=True, exist_ok=True)
    text = to_markdown(result)
    (args.out / f"{stem}.md").write_text(text)
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=1))
    print(text)
    return 0


def siblings_main(args, argv) -> int:
    main_model, tok, sets, label = smollm_setup()
    repeats = min(args.repeats, 3)
    meta = run_meta(label, argv, args.max_new, repeats)
    bass_run(main_model, sets["humaneval"][:1], 2, DEFAULT, {})  # warm-up, discarded
    rows = siblings(main_model, tok, sets, args.max_new, repeats)
    text = "\n".join(
        [
            *_machine.header(f"Sibling lookup: {label}", meta),
            f"Workload: {meta['max_new']} new tokens per row, eos ignored.",
            "",
            *siblings_markdown(rows, meta),
        ]
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "cpu_siblings.md").write_text(text + "\n")
    (args.out / "cpu_siblings.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
