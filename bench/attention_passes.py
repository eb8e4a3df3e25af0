"""Attention implementations side by side in the engine itself, per pass kind, on CPU.

    python bench/attention_passes.py [--batches 4,8] [--max-new 48] [--rounds 3]
        [--kinds eager,compiled] [--impls sdpa,flex]

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
    ap.add_argument("--name", default="cpu_attention_passes")
    args = ap.parse_args(argv)
    from bass import Generator

    batches = [int(b) for b in args.batches.split(",")]
    impls, kinds = args.impls.split(","), args.kinds.split(",")
    main_model, draft, prompts, label = cpu_setup(max(batches))
    rows = []
    for kind in kinds:
        for B in batches:
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
            row = {"kind": kind, "batch": B}
            for impl in impls:
                row[impl] = statistics.median(rates[impl])
                row[f"{impl}_warmup_s"] = gens[impl][1]
            rows.append(row)
            print(kind, B, {i: f"{row[i]:.1f} tok/s" for i in impls}, flush=True)
    meta = run_meta("attention_passes.py", argv if argv is not None else sys.argv[1:])
    lines = [
        *header(f"Attention implementations in the engine, per pass kind ({label})", meta),
        "",
        f"Median tokens/s of {args.rounds} alternating rounds after a warm-up (compiled "
        f"passes compile there), {args.max_new} new tokens per row.",
        "",
        "| pass kind | batch | " + " | ".join(f"{i} tok/s" for i in impls) + " | fastest |",
        "|---|---:|" + "---:|" * len(impls) + "---|",
    ]
    for r in rows:
        best = max(impls, key=lambda i: r[i])
        cells = " | ".join(f"{r[i]:.1f}" for i in impls)
        lines.append(f"| {r['kind']} | {r['batch']} | {cells} | {best} |")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    (RESULTS / f"{args.name}.json").write_text(json.dumps({**meta, "rows": rows}, indent=1))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
