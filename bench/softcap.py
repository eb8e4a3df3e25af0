"""Logit soft-capping (Gemma 2): one layer's attention as bass runs it, flex with the cap
as a ``score_mod`` against the reference, on Gemma-2-shaped packed passes.

    python bench/softcap.py [--mode cpu|gpu|smoke] [--out DIR]

bass's attention function computes a soft-capping model's attention with ``flex`` where
``attention`` is ``flex``, or ``auto`` on a CPU, and with the ``reference`` otherwise (and
did with the reference for every pass before). For every case (decode and verify passes
of 16 rows, a prefill chunk beside verify rows: bench_kernels.py's cases), one eager layer
of each is timed (the median of ``torch.utils.benchmark`` blocks, flex compiled first) and its
output compared with the other's. Writes ``<mode>_softcap.md`` and ``.json`` into ``--out``
(default ``bench/results``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _machine import header, run_meta
from bench_kernels import inputs, median_us

import bass
from bass.ops import flex, plan, reference

RESULTS = Path(__file__).parent / "results"
CAP = 50.0  # Gemma 2's attn_logit_softcapping
# (Hq, Hkv, D, cache size S, dtype): Gemma 2 2B's attention (8 query heads, 4 KV heads,
# head dim 256) on a CPU (float32) and a GPU (bfloat16); a toy for the smoke run
GEOMETRY = {
    "cpu": (8, 4, 256, 2048, torch.float32),
    "gpu": (8, 4, 256, 4096, torch.bfloat16),
    "smoke": (4, 2, 32, 64, torch.float32),
}


def cases(mode: str) -> dict[str, tuple[list[int], list[int]]]:
    """name -> (q_lens, cache_lens) of a packed pass."""
    if mode == "smoke":
        return {"verify": ([1, 5, 3], [20, 40, 9])}
    B = 16
    ctx = [300 + 97 * b % 900 for b in range(B)]
    return {
        "decode": ([1] * B, ctx),
        "verify-4": ([4] * B, ctx),
        "verify-spread": ([1 + 5 * b % 9 for b in range(B)], ctx),
        "prefill+verify": ([256, *[1 + 7 * b % 9 for b in range(B - 1)]], [0, *ctx[1:]]),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=sorted(GEOMETRY), default="cpu")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--min-run-time", type=float, default=None, help="seconds per timing")
    args = ap.parse_args(argv)
    geometry = GEOMETRY[args.mode]
    device = torch.device("cuda" if args.mode == "gpu" else "cpu")
    min_run = args.min_run_time or (0.05 if args.mode == "smoke" else 1.0)
    argv = argv if argv is not None else sys.argv[1:]
    meta = run_meta("softcap.py", argv, cuda=device.type == "cuda")
    rows = []
    with torch.inference_mode(), bass.ops.length_checks(False):
        for name, (q_lens, cache_lens) in cases(args.mode).items():
            q, k, v, cu, lens, kv, scale = inputs(q_lens, cache_lens, geometry, device)
            p = plan.Plan.for_pass("flex", q_lens, cache_lens, q.shape[2], cu, lens, kv,
                                   k.shape[2], softcap=CAP)  # fmt: skip

            def by_flex(p=p, q=q, k=k, v=v, scale=scale):
                return flex.run(p.state, q, k, v, scale, CAP)

            def by_reference(cu=cu, q=q, k=k, v=v, kv=kv, scale=scale):
                return reference.attention(q, k, v, cu[:-1], cu.diff(), kv, scale, CAP)

            diff = (by_flex().float() - by_reference().float()).abs().max().item()
            row = {"case": name, "B": len(q_lens), "N": q.shape[2], "max_diff": diff}
            row["reference_us"] = median_us(by_reference, min_run)
            row["flex_us"] = median_us(by_flex, min_run)
            rows.append(row)
            print(name, round(row["reference_us"]), round(row["flex_us"]), flush=True)
    Hq, Hkv, D, S, dtype = geometry
    lines = header(f"Logit soft-capping: flex against the reference, {args.mode}", meta)
    lines += [
        "",
        f"Heads {Hq}/{Hkv}, head dim {D}, cache size {S}, {str(dtype)[6:]}, cap {CAP:g}; one "
        "eager layer's attention, as bass's attention function runs it for a soft-capping "
        "model (flex: the cap as a score_mod, compiled before timing); `max abs diff`: the "
        "largest difference between the two outputs.",
        "",
        "| case | B | N | reference µs | flex µs | reference / flex | max abs diff |",
        "|---|---:|---:|---:|---:|---:|---:|",
        *(
            f"| {r['case']} | {r['B']} | {r['N']} | {r['reference_us']:.0f} | "
            f"{r['flex_us']:.0f} | {r['reference_us'] / r['flex_us']:.1f}x | {r['max_diff']:.1e} |"
            for r in rows
        ),
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.mode}_softcap.md").write_text("\n".join(lines) + "\n")
    data = {"meta": meta, "rows": rows}
    (args.out / f"{args.mode}_softcap.json").write_text(json.dumps(data, indent=1))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
