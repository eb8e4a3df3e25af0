"""Ragged attention implementations side by side, on verify-step shapes.

Every implementation of ``torch.ops.bass.ragged_attention`` available on the device is
timed against two baselines doing the same job with stock PyTorch, in one run:

* ``sdpa-padded-mask``: ``F.scaled_dot_product_attention`` over the whole padded cache
  with a boolean mask (built outside the timed region) and ``enable_gqa``;
* ``sdpa-per-row``: a Python loop calling SDPA on each row's own slice.

Shapes (the issue's verify grid on GPU): batch B, query length T (= draft length + 1),
context lengths around ``ctx`` with a spread (``uniform``: every row at ctx; ``mild``: rows
between 0.6 and 1 of ctx; ``bimodal``:
half the rows at ctx/8; ``longtail``: lengths from a log-normal capped at ctx), 32 query
and 8 KV heads, head dim 128. Reported: µs (the best median of a few round-robin rounds),
bytes the op must move (the live K/V
of every row plus q and out), FLOPs of the live causal work, achieved GB/s, and the
ratio to the best baseline.

``impl="auto"`` is timed too, as a method of its own, with the length hint the engine
gives it; the summary says how far it is from the best fixed implementation at every
measured point (``auto`` is calibrated from an earlier run of this suite by
``bench/calibrate_auto.py``; the issue's bar is within 10% everywhere). The device's
memory bandwidth is measured in the same run (a large device-to-device copy) and the
summary gives each implementation's achieved fraction of it on the KV-bound cases.

``python bench/bench_kernels.py [--mode gpu|cpu|smoke] [--plot]`` writes
``bench/results/<mode>_kernels.{md,json}``; ``--plot`` adds
``<mode>_kernels_crossover.png``: where the padded implementation (``pad``; on CPU its
analogue ``sdpa_padded``) and the per-row one (``split``; on CPU ``sdpa``) cross, against
batch size, for each length spread (the paper's open question 2).
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

sys.path.insert(0, str(Path(__file__).parent))
from _machine import copy_bandwidth_gbs, git_commit, header

import bass  # noqa: F401  (registers the ops)
from bass import ops
from bass.ops import auto

RESULTS = Path(__file__).parent / "results"
HQ, HKV, D = 32, 8, 128
BASELINES = ("sdpa-padded-mask", "sdpa-per-row")
# Crossover pairs (padded, per row): the paper's kernels, else their CPU analogues.
CROSSOVER_PAIRS = (("pad", "split"), ("sdpa_padded", "sdpa"))


def kv_lengths(B: int, ctx: int, spread: str, gen: torch.Generator) -> list[int]:
    if spread == "uniform":
        return [ctx] * B
    if spread == "mild":  # every row between 0.6 and 1 of ctx (fill around 0.8)
        x = torch.empty(B).uniform_(0.6, 1.0, generator=gen)
        return [max(1, round(ctx * float(v))) for v in x] if B > 1 else [ctx]
    if spread == "bimodal":
        return [ctx if b % 2 else max(1, ctx // 8) for b in range(B)]
    if spread == "longtail":  # log-normal around ctx/4, capped at ctx
        x = torch.empty(B).log_normal_(math.log(ctx / 4), 0.8, generator=gen)
        return [int(min(ctx, max(1, v))) for v in x.tolist()]
    raise ValueError(spread)


def make_inputs(B, T, ctx, spread, dtype, device, seed=0, hq=HQ, hkv=HKV, d=D):
    kv = kv_lengths(B, ctx, spread, torch.Generator().manual_seed(seed))
    S = -(-max(kv) // 64) * 64
    q_lens = [min(T, k) for k in kv]
    g = torch.Generator(device=device).manual_seed(seed)  # random data made on the device
    mk = lambda *s: torch.randn(*s, generator=g, device=device).to(dtype)  # noqa: E731
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


def run_case(
    B, T, ctx, spread, dtype, device, min_run_time, impls, rounds=1, baselines=True, heads=None
):
    hq, hkv, d = heads or (HQ, HKV, D)
    q, k, v, ql_t, kv_t, q_lens, kv_lens = make_inputs(
        B, T, ctx, spread, dtype, device, hq=hq, hkv=hkv, d=d
    )
    scale = d**-0.5
    calls = {}
    if baselines:
        mask = padded_mask(q_lens, kv_lens, T, k.shape[2], device)
        calls["sdpa-padded-mask"] = lambda: F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, scale=scale, enable_gqa=True
        )
        calls["sdpa-per-row"] = lambda: per_row(q, k, v, q_lens, kv_lens, scale)

    def bass_call(name):
        return lambda: torch.ops.bass.ragged_attention(q, k, v, ql_t, kv_t, scale, name)

    # auto gets the host-side length hint the engine gives it on every pass
    features = auto.Features(B, T, *auto._stats(kv_lens), (hq, hkv, d))
    picked = ops.resolve_implementation("auto", device, features).name
    with ops.length_checks(False), torch.inference_mode(), ops.length_hint(kv_lens):
        for name in impls:
            calls[name] = bass_call(name)
        calls["auto"] = bass_call("auto")
        # round-robin rounds, best median per method: a noise spike during one method's
        # turn (a shared machine) does not decide a comparison
        times = {name: math.inf for name in calls}
        for _ in range(rounds):
            for name, fn in calls.items():
                times[name] = min(times[name], time_us(fn, min_run_time))
    nbytes, flops = cost(q_lens, kv_lens, dtype, hq, hkv, d)
    best_base = min((times[b] for b in BASELINES if b in times), default=math.nan)
    return [
        {
            "B": B,
            "T": T,
            "ctx": ctx,
            "spread": spread,
            "heads": [hq, hkv, d],
            "max_kv": features.max_kv,
            "fill": round(features.fill, 4),
            "dtype": str(dtype).split(".")[-1],
            "method": name,
            "picked": picked if name == "auto" else name,
            "us": us,
            "bytes": nbytes,
            "flops": flops,
            "gbs": nbytes / (us * 1e-6) / 1e9,
            "tflops": flops / (us * 1e-6) / 1e12,
            "vs_best_baseline": best_base / us,
        }
        for name, us in times.items()
    ]


def case_key(r) -> tuple:
    return (r["B"], r["T"], r["ctx"], r["spread"], r["dtype"], tuple(r["heads"]))


def summarize(rows, impls, bandwidth_gbs):
    """The issue's checks, computed from the rows: auto against the best fixed
    implementation at every point; achieved bandwidth on the KV-bound cases."""
    cases: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        cases.setdefault(case_key(r), {})[r["method"]] = r
    auto_ratios, wins = [], {}
    for methods in cases.values():
        fixed = {n: methods[n]["us"] for n in impls if n in methods}
        if not fixed:
            continue
        best = min(fixed, key=fixed.get)
        wins[best] = wins.get(best, 0) + 1
        if "auto" in methods:
            picked = methods["auto"]["picked"]
            # the rule's regret (the picked implementation's own time) and auto's measured
            # time (the same plus its selection overhead per call, and noise)
            regret = fixed[picked] / fixed[best] if picked in fixed else math.inf
            auto_ratios.append((methods["auto"]["us"] / fixed[best], picked, best, regret))
    # KV-bound: few FLOPs per byte (a verify step, not a prefill) and a transfer large
    # enough that launch overhead does not dominate.
    kv_bound = [r for r in rows if r["flops"] / r["bytes"] <= 64 and r["bytes"] >= 32 * 2**20]
    fraction = {}
    for name in impls:
        got = sorted(r["gbs"] / bandwidth_gbs for r in kv_bound if r["method"] == name)
        if got:
            fraction[name] = {"min": got[0], "median": got[len(got) // 2], "max": got[-1]}
    return {
        "cases": len(cases),
        "best_fixed_wins": wins,
        "auto_worst_ratio": max((a[0] for a in auto_ratios), default=None),
        "auto_worst_pick_regret": max((a[3] for a in auto_ratios), default=None),
        "auto_pick_over_10pct": sum(a[3] > 1.10 for a in auto_ratios),
        "auto_over_10pct": sum(a[0] > 1.10 for a in auto_ratios),
        "auto_picked_best": sum(a[1] == a[2] for a in auto_ratios),
        "kv_bound_cases": len({case_key(r) for r in kv_bound}),
        "bandwidth_fraction": fraction,
    }


def summary_markdown(summary, meta) -> list[str]:
    out = [
        "## Summary",
        "",
        f"Memory bandwidth measured in this run (device-to-device copy): "
        f"{meta['bandwidth_gbs']:.0f} GB/s.",
        "",
        f"- Fastest fixed implementation per case ({summary['cases']} cases): "
        + ", ".join(f"`{n}` {c}" for n, c in sorted(summary["best_fixed_wins"].items())),
    ]
    if summary["auto_worst_ratio"] is not None:
        out.append(
            f"- `auto` (rule: {meta['auto_rule']}) picked the fastest fixed implementation in "
            f"{summary['auto_picked_best']} of {summary['cases']} cases. Its picks' own times: "
            f"worst {summary['auto_worst_pick_regret']:.2f}x the fastest's, "
            f"{summary['auto_pick_over_10pct']} cases over 1.10x. Timed through `auto` (its "
            f"choice per call included, and this machine's noise): worst "
            f"{summary['auto_worst_ratio']:.2f}x, {summary['auto_over_10pct']} cases over 1.10x."
        )
    if summary["bandwidth_fraction"]:
        out.append(
            f"- Achieved fraction of the measured bandwidth on the {summary['kv_bound_cases']} "
            "KV-bound cases (<= 64 FLOP/byte, >= 32 MiB moved): "
            + "; ".join(
                f"`{n}` median {f['median']:.0%} (min {f['min']:.0%}, max {f['max']:.0%})"
                for n, f in summary["bandwidth_fraction"].items()
            )
        )
    else:
        out.append("- No KV-bound case (>= 32 MiB moved) in this grid: no bandwidth fraction.")
    return [*out, ""]


def crossover_plot(rows, path: Path, title: str) -> Path | None:
    """Time(padded) / time(per row) against batch size, one panel per length spread and
    one line per context length (geometric mean over T). ``None`` when no pair ran."""
    methods = {r["method"] for r in rows}
    pair = next((p for p in CROSSOVER_PAIRS if set(p) <= methods), None)
    if pair is None:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import ScalarFormatter

    heads = rows[0]["heads"]  # the grid's first head geometry
    rows = [r for r in rows if r["heads"] == heads]
    title += f", heads {heads[0]}/{heads[1]}/{heads[2]} (Hq/Hkv/D)"
    times = {(case_key(r), r["method"]): r["us"] for r in rows}
    spreads = sorted(
        {r["spread"] for r in rows}, key=["uniform", "mild", "bimodal", "longtail"].index
    )
    fig, axes = plt.subplots(1, len(spreads), figsize=(4.2 * len(spreads), 3.6), sharey=True)
    axes = [axes] if len(spreads) == 1 else list(axes)
    for ax, spread in zip(axes, spreads):
        for ctx in sorted({r["ctx"] for r in rows}):
            xs, ys = [], []
            for B in sorted({r["B"] for r in rows}):
                logs = [
                    math.log(times[(key, pair[0])] / times[(key, pair[1])])
                    for key in {case_key(r) for r in rows}
                    if key[0] == B
                    and key[2] == ctx
                    and key[3] == spread
                    and (key, pair[0]) in times
                    and (key, pair[1]) in times
                ]
                if logs:
                    xs.append(B)
                    ys.append(math.exp(sum(logs) / len(logs)))
            ax.plot(xs, ys, marker="o", label=f"ctx {ctx}")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_formatter(ScalarFormatter())
        ax.set_title(f"{spread} lengths")
        ax.set_xlabel("batch size")
    axes[0].set_ylabel(f"time {pair[0]} / time {pair[1]}\n(< 1: {pair[0]} faster)")
    axes[-1].legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


GRIDS = {
    "gpu": dict(
        heads=((32, 8, 128),),  # the 7B Llama shape of bench_e2e --gpu
        B=(1, 4, 8, 16, 32),
        T=(1, 5, 17, 33),
        ctx=(512, 2048, 8192),
        spread=("uniform", "bimodal", "longtail"),
        dtype=(torch.bfloat16,),
        t=0.03,
        rounds=1,
        copy_bytes=2**30,
    ),
    "cpu": dict(
        heads=((32, 8, 128), (9, 3, 64)),  # 7B Llama; the embedded SmolLM2-135M
        B=(1, 2, 4, 8, 16),
        T=(1, 5),
        ctx=(256, 1024),
        spread=("uniform", "mild", "bimodal", "longtail"),
        dtype=(torch.float32,),
        t=0.05,
        rounds=3,
        copy_bytes=2**28,
    ),
    "smoke": dict(
        heads=((32, 8, 128),),
        B=(1, 2),
        T=(3,),
        ctx=(64,),
        spread=("uniform", "longtail"),
        dtype=(torch.float32,),
        t=0.01,
        rounds=1,
        copy_bytes=2**22,
    ),
}


def to_markdown(rows, meta) -> str:
    out = [
        *header(f"Ragged attention kernels ({meta['mode']})", meta, "Device"),
        "",
        "heads = Hq/Hkv/D. GB/s counts the live K/V of every row plus q and out; "
        "`vs best baseline` = best of the two SDPA baselines / this (higher is better).",
        "",
        "`auto` rows name the implementation it picked.",
        "",
        *summary_markdown(meta["summary"], meta),
        "## All cases",
        "",
        "| heads | B | T | ctx | spread | fill | dtype | method | µs | GB/s | TFLOP/s "
        "| vs best baseline |",
        "|---|---:|---:|---:|---|---:|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        method = f"auto ({r['picked']})" if r["method"] == "auto" else r["method"]
        vs = "-" if math.isnan(r["vs_best_baseline"]) else f"{r['vs_best_baseline']:.2f}x"
        out.append(
            f"| {'/'.join(map(str, r['heads']))} | "
            f"{r['B']} | {r['T']} | {r['ctx']} | {r['spread']} | {r['fill']:.2f} | "
            f"{r['dtype']} | {method} | {r['us']:.1f} | {r['gbs']:.1f} | {r['tflops']:.3f} | "
            f"{vs} |"
        )
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=GRIDS, default=None)
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--plot", action="store_true", help="also draw the crossover chart")
    ap.add_argument("--name", default=None, help="output file stem (default: <mode>_kernels)")
    ap.add_argument(
        "--no-baselines",
        action="store_true",
        help="time only bass's implementations and auto (a verification run)",
    )
    ap.add_argument(
        "--impls",
        default=None,
        help="comma-separated implementations to time (default: all available here)",
    )
    args = ap.parse_args(argv)
    mode = args.mode or ("gpu" if torch.cuda.is_available() else "cpu")
    grid = GRIDS[mode]
    device = torch.device("cuda" if mode == "gpu" else "cpu")
    if mode != "gpu":
        torch.set_num_threads(min(2, torch.get_num_threads()))
    available = ops.available_implementations(device)
    impls = available if args.impls is None else args.impls.split(",")
    missing = [n for n in impls if n not in available]
    if missing:
        ap.error(f"not available on {device.type}: {missing}; available: {available}")
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.name or f"{mode}_kernels"
    partial = args.out / f"{stem}.partial.json"  # rows so far, should a run be cut short
    rows = []
    cases = [
        (heads, dtype, B, T, ctx, spread)
        for heads in grid["heads"]
        for dtype in grid["dtype"]
        for B in grid["B"]
        for T in grid["T"]
        for ctx in grid["ctx"]
        for spread in grid["spread"]
    ]
    for heads, dtype, B, T, ctx, spread in cases:
        rows += run_case(
            B, T, ctx, spread, dtype, device, grid["t"], impls,
            grid["rounds"], not args.no_baselines, heads,
        )  # fmt: skip
        partial.write_text(json.dumps({"rows": rows}))
    rule = auto.load_rule(auto.device_key(device))
    meta = {
        "mode": mode,
        "command": "python bench/bench_kernels.py "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "commit": git_commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name()
        if mode == "gpu"
        else platform.processor() or platform.machine(),
        "device_key": auto.device_key(device),
        "software": software(),
        "implementations": impls,
        "bandwidth_gbs": copy_bandwidth_gbs(device, grid["copy_bytes"]),
        "auto_rule": f"auto_rules/{rule.device_key}.json from {rule.source or '?'}"
        if rule is not None
        else "none for this device: static priority order",
    }
    meta["summary"] = summarize(rows, impls, meta["bandwidth_gbs"])
    text = to_markdown(rows, meta)
    (args.out / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    partial.unlink(missing_ok=True)
    if args.plot:  # after the results are safe: a missing matplotlib loses only the chart
        try:
            png = crossover_plot(
                rows,
                args.out / f"{stem}_crossover.png",
                f"{meta['device']}, {meta['software']}",
            )
            text += f"\nCrossover chart: `{png.name}`\n" if png else "\nNo crossover pair ran.\n"
        except ImportError as e:
            text += f"\nNo crossover chart: {e}\n"
    (args.out / f"{stem}.md").write_text(text)
    print(text)
    return 0


def software() -> str:
    parts = [f"torch {torch.__version__}"]
    try:
        import triton

        parts.append(f"triton {triton.__version__}")
    except ImportError:
        pass
    if torch.version.cuda:
        parts.append(f"CUDA {torch.version.cuda}")
    return ", ".join(parts)


if __name__ == "__main__":
    raise SystemExit(main())
