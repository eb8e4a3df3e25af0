"""Attention implementations side by side in the engine itself, per pass kind, on CPU.

    python bench/attention_passes.py [--batches 4,8] [--max-new 48] [--rounds 3]
        [--kinds eager,compiled] [--impls sdpa,flex] [--compiled-impls reference,sdpa,flex]

The embedded SmolLM2-135M with the n-gram drafter on HumanEval prompts (bench_e2e.py's
CPU workload): for every (pass kind, batch), one Generator per implementation, built and
warmed up once (compiled passes compile there), then timed in alternating rounds so the
machine's drift falls on every implementation alike; the median tokens/s of each. This
is the measurement behind ``auto``'s CPU rows (:data:`bass.ops.plan.AUTO`). Prints a
table and writes ``bench/results/cpu_attention_passes.{md,json}``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _machine import header, run_meta
from bench_e2e import cpu_setup

RESULTS = Path(__file__).parent / "results"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="4,8")
    ap.add_argument("--max-new", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--kinds", default="eager,compiled")
    ap.add_argument("--impls", default="sdpa,flex")
    ap.add_argument("--compiled-impls", default=None, help="compiled passes' (default: --impls)")
    ap.add_argument("--name", default="cpu_attention_passes")
    ap.add_argument("--resume", action="store_true", help="keep the rows already written")
    args = ap.parse_args(argv)
    from bass import Generator

    batches = [int(b) for b in args.batches.split(",")]
    kinds = args.kinds.split(",")
    per_kind = {k: args.impls.split(",") for k in kinds}
    if args.compiled_impls and "compiled" in per_kind:
        per_kind["compiled"] = args.compiled_impls.split(",")
    main_model, draft, prompts, label = cpu_setup(max(batches))
    meta = run_meta("attention_passes.py", argv if argv is not None else sys.argv[1:])
    rows, path = [], RESULTS / f"{args.name}.json"
    if args.resume and path.is_file():  # a run cut short: its rows stand, the rest run
        rows = json.loads(path.read_text())["rows"]
        meta["command"] = meta["command"].replace(" --resume", "")  # the run's own command
        meta["resumed"] = f"rows written before {meta['date']} come from an earlier start"
    for kind in kinds:
        impls = per_kind[kind]
        for B in batches:
            if any(r["kind"] == kind and r["batch"] == B for r in rows):
                continue
            gens = {}
            for impl in impls:
                gen = Generator(main_model, draft, attention=impl, compile=kind == "compiled")
                t0 = time.perf_counter()
                gen.generate(prompts[:B], max_new_tokens=args.max_new)  # warm-up
                gens[impl] = (gen, time.perf_counter() - t0)
            rates = {impl: [] for impl in impls}
            for _ in range(args.rounds):
                for impl in impls:
                    res = gens[impl][0].generate(prompts[:B], max_new_tokens=args.max_new)
                    rates[impl].append(res.stats.tokens_generated / res.stats.wall_seconds)
            row = {"kind": kind, "batch": B, "impls": impls, "rates": rates}
            for impl in impls:
                row[impl] = statistics.median(rates[impl])
                row[f"{impl}_warmup_s"] = gens[impl][1]
            rows.append(row)
            print(kind, B, {i: f"{row[i]:.1f} tok/s" for i in impls}, flush=True)
            write(args, meta, label, rows)  # after every row: a run cut short keeps its rows
    print((RESULTS / f"{args.name}.md").read_text())
    return 0


def write(args, meta, label, rows) -> None:
    lines = [
        *header(f"Attention implementations in the engine, per pass kind ({label})", meta),
        "",
        f"Median tokens/s of {args.rounds} alternating rounds after a warm-up generation "
        f"(compiled passes compile there; its seconds in brackets), {args.max_new} new tokens "
        "per row." + (f" Resumed: {meta['resumed']}." if meta.get("resumed") else ""),
        "",
        "| pass kind | batch | implementation | tok/s | warm-up s | vs the kind's fastest |",
        "|---|---:|---|---:|---:|---:|",
    ]
    for r in rows:
        best = max(r[i] for i in r["impls"])
        for i in r["impls"]:
            lines.append(
                f"| {r['kind']} | {r['batch']} | {i} | {r[i]:.1f} | {r[f'{i}_warmup_s']:.0f} "
                f"| {r[i] / best:.2f}x |"
            )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    (RESULTS / f"{args.name}.json").write_text(json.dumps({**meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
