"""Ragged attention implementations side by side, on verify-step shapes.

Every implementation of ``torch.ops.bass.ragged_attention`` available on the device is
timed against two baselines doing the same job with stock PyTorch, in one run:

* ``sdpa-padded-mask``: ``F.scaled_dot_product_attention`` over the whole padded cache
  with a boolean mask (built outside the timed region) and ``enable_gqa``;
* ``sdpa-per-row``: a Python loop calling SDPA on each row's own slice.

Shapes (the issue's verify grid on GPU): batch B, query length T (= draft length + 1),
context lengths around ``ctx`` with a spread (``uniform``: every row at ctx; ``bimodal``:
half the rows at ctx/8; ``longtail``: lengths from a log-normal capped at ctx), 32 query
and 8 KV heads, head dim 128. Reported: median µs, bytes the op must move (the live K/V
of every row plus q and out), FLOPs of the live causal work, achieved GB/s, and the
ratio to the best baseline.

``python bench/bench_kernels.py [--gpu|--cpu|--smoke]`` writes
``bench/results/<tag>_kernels.{md,json}``; ``--plot`` adds the PAD/SPLIT crossover chart
when both exist (time against length spread).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils import benchmark as tb

import bass  # noqa: F401  (registers the ops)
from bass import ops

RESULTS = Path(__file__).parent / "results"
HQ, HKV, D = 32, 8, 128


def kv_lengths(B: int, ctx: int, spread: str, gen: torch.Generator) -> list[int]:
    if spread == "uniform":
        return [ctx] * B
    if spread == "bimodal":
        return [ctx if b % 2 else max(1, ctx // 8) for b in range(B)]
    if spread == "longtail":  # log-normal around ctx/4, capped at ctx
        x = torch.empty(B).log_normal_(math.log(ctx / 4), 0.8, generator=gen)
        return [int(min(ctx, max(1, v))) for v in x.tolist()]
    raise ValueError(spread)


def make_inputs(B, T, ctx, spread, dtype, device, seed=0, hq=HQ, hkv=HKV, d=D):
    g = torch.Generator().manual_seed(seed)
    kv = kv_lengths(B, ctx, spread, g)
    S = -(-max(kv) // 64) * 64
    q_lens = [min(T, k) for k in kv]
    mk = lambda *s: torch.randn(*s, generator=g).to(device=device, dtype=dtype)  # noqa: E731
    q, k, v = mk(B, hq, T, d), mk(B, hkv, S, d), mk(B, hkv, S, d)
    i32 = lambda x: torch.tensor(x, dtype=torch.int32, device=device)  # noqa: E731
    return q, k, v, i32(q_lens), i32(kv), q_lens, kv


def padded_mask(q_lens, kv_lens, T, S, device):
    t = torch.arange(T, device=device)
    s = torch.arange(S, device=device)
    ql = torch.tensor(q_lens, device=device)[:, None]
    pos = torch.tensor(kv_lens, device=device)[:, None] - ql + t  # [B, T]
    m = (s[None, None] <= pos[:, :, None]) & (t[None, :, None] < ql[:, :, None])
    m |= ~m.any(-1, keepdim=True)  # fully padded query rows: any key (output ignored)
    return m[:, None]  # [B, 1, T, S]


def per_row(q, k, v, q_lens, kv_lens, scale):
    out = torch.zeros_like(q)
    for b, (ql, kl) in enumerate(zip(q_lens, kv_lens)):
        if ql == 0:
            continue
        qb, kb, vb = q[b : b + 1, :, :ql], k[b : b + 1, :, :kl], v[b : b + 1, :, :kl]
        t = torch.arange(ql, device=q.device)[:, None] + (kl - ql)
        mask = torch.arange(kl, device=q.device)[None] <= t
        out[b : b + 1, :, :ql] = F.scaled_dot_product_attention(
            qb, kb, vb, attn_mask=mask, scale=scale, enable_gqa=True
        )
    return out


def cost(q_lens, kv_lens, dtype, hq=HQ, hkv=HKV, d=D):
    el = torch.finfo(dtype).bits // 8
    kv_bytes = sum(kv_lens) * hkv * d * 2 * el
    qo_bytes = sum(q_lens) * hq * d * 2 * el
    flops = sum(
        4 * hq * d * sum(kl - ql + i + 1 for i in range(ql)) for ql, kl in zip(q_lens, kv_lens)
    )
    return kv_bytes + qo_bytes, flops


def time_us(fn, min_run_time: float) -> float:
    return (
        tb.Timer(stmt="fn()", globals={"fn": fn})
        .blocked_autorange(min_run_time=min_run_time)
        .median
        * 1e6
    )


def run_case(B, T, ctx, spread, dtype, device, min_run_time):
    q, k, v, ql_t, kv_t, q_lens, kv_lens = make_inputs(B, T, ctx, spread, dtype, device)
    scale = D**-0.5
    mask = padded_mask(q_lens, kv_lens, T, k.shape[2], device)
    calls = {
        "sdpa-padded-mask": lambda: F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, scale=scale, enable_gqa=True
        ),
        "sdpa-per-row": lambda: per_row(q, k, v, q_lens, kv_lens, scale),
    }
    with ops.length_checks(False), torch.inference_mode():
        for name in ops.available_implementations(device):
            calls[name] = lambda n=name: torch.ops.bass.ragged_attention(
                q, k, v, ql_t, kv_t, scale, n
            )
        times = {name: time_us(fn, min_run_time) for name, fn in calls.items()}
    nbytes, flops = cost(q_lens, kv_lens, dtype)
    best_base = min(times["sdpa-padded-mask"], times["sdpa-per-row"])
    return [
        {
            "B": B,
            "T": T,
            "ctx": ctx,
            "spread": spread,
            "dtype": str(dtype).split(".")[-1],
            "method": name,
            "us": us,
            "bytes": nbytes,
            "flops": flops,
            "gbs": nbytes / (us * 1e-6) / 1e9,
            "tflops": flops / (us * 1e-6) / 1e12,
            "vs_best_baseline": best_base / us,
        }
        for name, us in times.items()
    ]


GRIDS = {
    "gpu": dict(
        B=(1, 4, 8, 16, 32),
        T=(1, 5, 9, 17, 33),
        ctx=(512, 2048, 8192),
        spread=("uniform", "bimodal", "longtail"),
        dtype=(torch.bfloat16,),
        t=0.05,
    ),
    "cpu": dict(
        B=(1, 4, 8),
        T=(1, 5),
        ctx=(512, 1024),
        spread=("uniform", "bimodal"),
        dtype=(torch.float32,),
        t=0.2,
    ),
    "smoke": dict(
        B=(2,), T=(3,), ctx=(64,), spread=("uniform", "longtail"), dtype=(torch.float32,), t=0.01
    ),
}


def to_markdown(rows, meta) -> str:
    out = [
        f"# Ragged attention kernels ({meta['mode']})",
        "",
        f"Command: `{meta['command']}`  ",
        f"Date: {meta['date']}  ",
        f"Device: {meta['device']}  ",
        f"Software: {meta['software']}  ",
        "",
        f"Hq={HQ}, Hkv={HKV}, D={D}. GB/s counts the live K/V of every row plus q and out; "
        "`vs best baseline` = best of the two SDPA baselines / this (higher is better).",
        "",
        "| B | T | ctx | spread | dtype | method | µs | GB/s | TFLOP/s | vs best baseline |",
        "|---:|---:|---:|---|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        out.append(
            f"| {r['B']} | {r['T']} | {r['ctx']} | {r['spread']} | {r['dtype']} | "
            f"{r['method']} | {r['us']:.1f} | {r['gbs']:.1f} | {r['tflops']:.3f} | "
            f"{r['vs_best_baseline']:.2f}x |"
        )
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=GRIDS, default=None)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    mode = args.mode or ("gpu" if torch.cuda.is_available() else "cpu")
    grid = GRIDS[mode]
    device = torch.device("cuda" if mode == "gpu" else "cpu")
    if mode != "gpu":
        torch.set_num_threads(min(2, torch.get_num_threads()))
    rows = []
    for dtype in grid["dtype"]:
        for B in grid["B"]:
            for T in grid["T"]:
                for ctx in grid["ctx"]:
                    for spread in grid["spread"]:
                        rows += run_case(B, T, ctx, spread, dtype, device, grid["t"])
    meta = {
        "mode": mode,
        "command": "python bench/bench_kernels.py "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name()
        if mode == "gpu"
        else platform.processor() or platform.machine(),
        "software": f"torch {torch.__version__}",
    }
    args.out.mkdir(parents=True, exist_ok=True)
    text = to_markdown(rows, meta)
    (args.out / f"{mode}_kernels.md").write_text(text)
    (args.out / f"{mode}_kernels.json").write_text(
        json.dumps({"meta": meta, "rows": rows}, indent=1)
    )
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
