"""Ragged attention implementations side by side on packed pass shapes, and flex's block
mask built from the lengths against one evaluated over the grid.

    python bench/bench_kernels.py [--mode cpu|gpu|smoke] [--impls a,b] [--out DIR]

For every case (a packed pass: decode, verify passes of equal and of spread draft lengths,
a prefill chunk beside verify rows) and every implementation that runs on the device,
called by name as an eager pass calls it: the pass is planned once (:class:`bass.ops.Plan`,
its cost timed as ``plan µs``) and one layer's ``attend`` is timed (``layer µs``, the
median of ``torch.utils.benchmark`` blocks), with the bandwidth it achieved (the bytes it
must move: each row's ``kv_len`` keys and values, the queries and the output) as a share
of the device's measured copy bandwidth. The block-mask section times what ``flex``'s
plan does for a pass (the block mask built directly from the lengths, with its row gather)
against ``create_block_mask`` evaluating the same ``mask_mod`` over the ``T x S`` grid.

Writes ``<mode>_kernels.md`` and ``.json`` into ``--out`` (default ``bench/results``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from torch.utils import benchmark as tb

sys.path.insert(0, str(Path(__file__).parent))
from _machine import copy_bandwidth_gbs, header, run_meta

import bass
from bass.ops import flex, plan

RESULTS = Path(__file__).parent / "results"
# (Hq, Hkv, D, cache size S, dtype) per mode: the embedded SmolLM2-135M on the CPU, a
# 7B Llama on a GPU, a toy for the smoke run
GEOMETRY = {
    "cpu": (9, 3, 64, 2048, torch.float32),
    "gpu": (32, 8, 128, 4096, torch.bfloat16),
    "smoke": (4, 2, 32, 64, torch.float32),
}


def cases(mode: str) -> dict[str, tuple[list[int], list[int]]]:
    """name -> (q_lens, cache_lens) of a packed pass."""
    if mode == "smoke":
        return {"verify-spread": ([1, 5, 3], [20, 40, 9]), "mixed": ([30, 2], [10, 30])}
    B = 8 if mode == "cpu" else 32
    ctx = [300 + 97 * b % 700 for b in range(B)]
    return {
        "decode": ([1] * B, ctx),
        "verify-8": ([8] * B, ctx),
        "verify-spread": ([1 + 5 * b % 33 for b in range(B)], ctx),
        "prefill+verify": ([256, *[1 + 7 * b % 33 for b in range(B - 1)]], [0, *ctx[1:]]),
    }


def inputs(q_lens, cache_lens, geometry, device):
    Hq, Hkv, D, S, dtype = geometry
    g = torch.Generator().manual_seed(0)
    N, B = sum(q_lens), len(q_lens)
    q = torch.randn(1, N, Hq, D, generator=g).to(device, dtype).transpose(1, 2)
    k, v = (torch.randn(B, Hkv, S, D, generator=g).to(device, dtype) for _ in range(2))
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    lens = torch.tensor(cache_lens, dtype=torch.int32)
    return q, k, v, cu.to(device), lens.to(device), (lens + cu.diff()).to(device), D**-0.5


def median_us(fn, min_run_time: float) -> float:
    fn()  # warm-up (flex compiles here)
    return (
        tb.Timer("fn()", globals={"fn": fn}).blocked_autorange(min_run_time=min_run_time).median
        * 1e6
    )


def write(out: Path, mode, meta, geometry, impls, rows, masks, cases_planned) -> list[str]:
    """The markdown and JSON of the cases measured so far; returns the markdown's lines."""
    copy = meta["copy_gbs"]
    Hq, Hkv, D, S, dtype = geometry
    lines = header(f"Ragged attention implementations, {mode}", meta)
    if len(rows) < cases_planned:
        lines += ["", f"**Cut off: {len(rows)} of {cases_planned} cases measured.**"]
    lines += [
        "",
        f"Heads {Hq}/{Hkv}, head dim {D}, cache size {S}, {str(dtype)[6:]}; packed passes as "
        "an eager engine pass runs them: `layer µs`, one layer's attention (and the share of "
        f"the measured copy bandwidth, {copy:.0f} GB/s, it achieved); `plan µs`, the pass's "
        "plan (once for every layer).",
        "",
        "| case | B | N | longest q | "
        + " | ".join(f"{i} layer µs (% copy bw) | {i} plan µs" for i in impls)
        + " |",
        "|---|---:|---:|---:|" + "---:|---:|" * len(impls),
    ]
    for r in rows:
        cells = " | ".join(
            f"{r[i]['layer_us']:.0f} ({100 * r[i]['gbs'] / copy:.0f}%) | {r[i]['plan_us']:.0f}"
            for i in impls
        )
        lines.append(f"| {r['case']} | {r['B']} | {r['N']} | {r['max_q']} | {cells} |")
    lines += [
        "",
        "## flex's block mask: built from the lengths vs evaluated over the grid",
        "",
        "`direct`: `bass.ops.flex.prepare` (block mask and row gather, per pass); `grid`: "
        "`create_block_mask` evaluating the same `mask_mod` over every (row, query, key).",
        "",
        "| case | direct µs | grid µs |",
        "|---|---:|---:|",
        *(f"| {m['case']} | {m['direct_us']:.0f} | {m['grid_us']:.0f} |" for m in masks),
    ]
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{mode}_kernels.md").write_text("\n".join(lines) + "\n")
    data = {"meta": meta, "rows": rows, "block_mask": masks, "cases_planned": cases_planned}
    (out / f"{mode}_kernels.json").write_text(json.dumps(data, indent=1))
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=sorted(GEOMETRY), default="cpu")
    ap.add_argument("--impls", default=None, help="comma-separated (default: all that run here)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--min-run-time", type=float, default=None, help="seconds per timing")
    args = ap.parse_args(argv)
    mode, geometry = args.mode, GEOMETRY[args.mode]
    device = torch.device("cuda" if mode == "gpu" else "cpu")
    impls = args.impls.split(",") if args.impls else plan.implementations(device)
    min_run = args.min_run_time or (0.05 if mode == "smoke" else 0.5)
    meta = run_meta(
        "bench_kernels.py", argv if argv is not None else sys.argv[1:], cuda=mode == "gpu"
    )
    meta["copy_gbs"] = copy_bandwidth_gbs(device, 1 << (28 if mode == "gpu" else 26))
    todo = cases(mode)
    rows, masks = [], []
    with torch.inference_mode(), bass.ops.length_checks(False):
        for name, (q_lens, cache_lens) in todo.items():
            row, mask = time_case(name, q_lens, cache_lens, geometry, device, impls, min_run)
            for i in impls:
                row[i]["gbs"] = row["bytes"] / row[i]["layer_us"] / 1e3
            rows.append(row)
            masks.append(mask)
            print(name, {i: round(row[i]["layer_us"], 1) for i in impls}, flush=True)
            # written after every case: a run cut off by a time limit keeps what it measured
            lines = write(args.out, mode, meta, geometry, impls, rows, masks, len(todo))
    print("\n".join(lines))
    return 0


def time_case(name, q_lens, cache_lens, geometry, device, impls, min_run):
    """One case: every implementation's layer and plan time, and the block-mask builds."""
    q, k, v, cu, lens, kv, scale = inputs(q_lens, cache_lens, geometry, device)

    def make(impl: str) -> plan.Plan:
        return plan.Plan.for_pass(impl, q_lens, cache_lens, q.shape[2], cu, lens, kv, k.shape[2])

    row = {"case": name, "B": len(q_lens), "N": q.shape[2], "max_q": max(q_lens)}
    # what attention must move: each row's live keys and values, the queries, the output
    row["bytes"] = (2 * k.shape[1] * sum(kv.tolist()) + 2 * q.shape[1] * q.shape[2]) * (
        q.shape[3] * q.element_size()
    )
    for impl in impls:
        try:  # one implementation failing (a compile error on a new device) costs only its cell
            p = make(impl)
            row[impl] = {
                "layer_us": median_us(lambda p=p: p.attend(q, k, v, scale), min_run),
                "plan_us": median_us(lambda impl=impl: make(impl), min_run),
            }
        except Exception as e:
            nan = float("nan")
            error = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
            row[impl] = {"layer_us": nan, "plan_us": nan, "error": error}
            print(f"{name} {impl}: FAILED {error}", file=sys.stderr, flush=True)
    p = make("flex" if "flex" in impls else "reference")
    mask = {
        "case": name,
        "direct_us": median_us(lambda: flex.prepare(p), min_run),
        "grid_us": median_us(lambda: grid_block_mask(p), min_run),
    }
    return row, mask


def grid_block_mask(p: plan.Plan):
    """The same block mask as flex's plan, by evaluating its mask function everywhere."""
    from torch.nn.attention.flex_attention import create_block_mask

    q_lens, offsets = p.q_lens, p.kv_lens - p.q_lens

    def mask_mod(b, h, q_idx, kv_idx):
        return (q_idx < q_lens[b]) & (kv_idx <= offsets[b] + q_idx)

    B = q_lens.shape[0]
    return create_block_mask(
        mask_mod, B, 1, p.width, p.cache_size, device=p.device, BLOCK_SIZE=flex.BLOCK
    )


if __name__ == "__main__":
    sys.exit(main())
