"""What a verify pass costs as a function of the tokens it computes.

``python bench/pass_cost.py``: the embedded default model (SmolLM2-135M-Instruct, CPU),
batches of 1 and 8 HumanEval prompts prefilled, then packed passes in which every row
brings one token (plain decoding) or some rows bring more (verifying drafts), timed
round-robin (median of ``--repeats`` rounds; logits at every position, as a verify pass
needs). Writes ``bench/results/cpu_pass_cost.{md,json}``. It shows the cost model a
draft-length policy must live with on this machine, side by side for the ways bass can
run the linear layers on a CPU: torch's ``F.linear`` (``cpu_linear="torch"``), the
copy-free layouts calibrated per row count (``"unpacked"``) and all three, the packed
copies included (``"auto"``, the default; see :mod:`bass.cpu_linear`), each pass timed
with every one in the same round; and the calibration's own measurements (bytes of
weights per second, per layout, per row count).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _machine import header, run_meta
from _prompts import humaneval_prompts, tiny_llama

RESULTS = Path(__file__).parent / "results"

# name -> tokens each row brings, for a batch of B rows
SHAPES = {
    "plain": lambda B: [1] * B,
    "one row +1": lambda B: [2] + [1] * (B - 1),
    "one row +2": lambda B: [3] + [1] * (B - 1),
    "one row +4": lambda B: [5] + [1] * (B - 1),
    "every row +1": lambda B: [2] * B,
    "every row +4": lambda B: [5] * B,
    "every row +8": lambda B: [9] * B,
}


LAYOUTS = ("torch", "unpacked", "auto")  # cpu_linear modes, timed side by side
TABLE_ROWS = (1, 2, 3, 4, 6, 8, 12, 16, 32, 128)  # calibrated row counts shown


def measure(main, prompts, repeats: int, plan) -> dict[str, dict]:
    from bass import cpu_linear, hf, passes
    from bass.backends import CPUBackend
    from bass.cache import RaggedKVCache
    from bass.packing import pack

    backend = CPUBackend(mode="auto")
    backend.chosen = "auto"  # frame every pass as the engine's CPU backend does
    passes = passes.Passes(forward=backend.wrap(passes.forward_packed))

    B = len(prompts)
    max_len = max(map(len, prompts)) + 16
    hf.prepare(main, max_len)
    cache = RaggedKVCache(B, max_len, main.config.num_hidden_layers, torch.device("cpu"))
    times = {(name, lay): [] for name in SHAPES for lay in LAYOUTS}
    unpacked = plan.without_packed()
    with torch.inference_mode():
        passes.prefill(main, cache, prompts)
        lens = [len(p) for p in prompts]
        for _ in range(repeats):
            for name, shape in SHAPES.items():
                q = shape(B)
                n = sum(q)
                for lay in LAYOUTS:  # as the engine runs each: the logits rows padded or not
                    if lay == "torch":
                        cpu_linear.uninstall(main)
                    else:
                        cpu_linear.install(main, plan if lay == "auto" else unpacked)
                    batch = pack(
                        q,
                        lens,
                        torch.device("cpu"),
                        ids=[5] * n,
                        logits_at=list(range(n)),
                        logits_multiple=4 if lay == "torch" else 1,  # as CPUBackend's
                    )
                    t0 = time.perf_counter()
                    passes.run(main, cache, batch)
                    times[(name, lay)].append(time.perf_counter() - t0)
    cpu_linear.uninstall(main)
    med = {k: statistics.median(t) for k, t in times.items()}
    return {
        name: {
            "tokens": sum(SHAPES[name](B)),
            **{f"ms_{lay}": 1000 * med[(name, lay)] for lay in LAYOUTS},
            **{f"vs_plain_{lay}": med[(name, lay)] / med[("plain", lay)] for lay in LAYOUTS},
            "auto_vs_torch": med[(name, "auto")] / med[(name, "torch")],
            "auto_vs_unpacked": med[(name, "auto")] / med[(name, "unpacked")],
        }
        for name in SHAPES
    }


def _gbs(plan) -> dict:
    """What the calibration measured, as GB/s of weights read: ``{shape: {M: {layout: GB/s}}}``."""
    return {
        shape: {
            m: {k: plan.swept[shape] / s / 1e9 for k, s in t.items()} for m, t in timings.items()
        }
        for shape, timings in plan.timings.items()
    }


def _calibration_rows(plan, gbs) -> list[str]:
    out = []
    for shape in sorted(gbs, key=lambda s: s[:2]):
        cells = []
        for m in TABLE_ROWS:
            by = gbs[shape].get(m, {})
            chosen = plan.layout(shape, m)
            cells.append(
                " / ".join(f"**{v:.1f}**" if k == chosen else f"{v:.1f}" for k, v in by.items())
            )
        out.append(f"| {shape[0]}x{shape[1]} | " + " | ".join(cells) + " |")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,4,8")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--tiny", action="store_true", help="a tiny random Llama (smoke test)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    if args.tiny:
        model = tiny_llama(
            vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2
        )
        prompts = [list(range(1, 10 + b)) for b in range(16)]
    else:
        from bass import load_default_pair

        model, tok = load_default_pair()
        prompts = humaneval_prompts(tok, 16)
    name = "tiny random Llama" if args.tiny else "SmolLM2-135M-Instruct (embedded)"
    from bass import cpu_linear

    t0 = time.perf_counter()
    plan = cpu_linear.calibrate(model)
    calibration_s = time.perf_counter() - t0
    gbs = _gbs(plan)
    result = {
        "meta": run_meta(
            "pass_cost.py",
            argv or sys.argv[1:],
            repeats=args.repeats,
            calibration_s=calibration_s,
            plan=plan.describe().splitlines(),
        ),
        "calibration": {str(shape[:2]): by for shape, by in gbs.items()},
        "batches": {},
    }
    lines = [
        *header(f"What a verify pass costs: {name}, CPU", result["meta"]),
        f"Median of {args.repeats} round-robin rounds per shape; logits at every position. "
        'Each pass timed with torch\'s `F.linear` (`cpu_linear="torch"`: logits rows padded '
        'to a multiple of 4), with the copy-free calibrated layouts (`"unpacked"`) and with '
        'all three (`"auto"`, the default) in the same round.',
        "",
        f"Calibration ({calibration_s:.1f} s), the layout each weight shape takes by row count:",
        "",
        *[f"- {line}" for line in plan.describe().splitlines()],
        "",
        "What the calibration measured: GB/s of weights read (best of its sweeps, each over "
        "at least 48 MiB of one shape's weights); torch / transposed / packed, the chosen "
        "layout in bold.",
        "",
        "| weight | " + " | ".join(f"{m} rows" for m in TABLE_ROWS) + " |",
        "|---|" + "---:|" * len(TABLE_ROWS),
        *_calibration_rows(plan, gbs),
        "",
        "| batch | pass | tokens | torch ms | unpacked ms | auto ms | auto/torch "
        "| auto/unpacked | vs plain (torch) | vs plain (auto) |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for B in (int(b) for b in args.batches.split(",")):
        rows = measure(model, prompts[:B], args.repeats, plan)
        result["batches"][B] = rows
        for name, r in rows.items():
            lines.append(
                f"| {B} | {name} | {r['tokens']} | {r['ms_torch']:.1f} | {r['ms_unpacked']:.1f} "
                f"| {r['ms_auto']:.1f} | {r['auto_vs_torch']:.2f}x | {r['auto_vs_unpacked']:.2f}x "
                f"| {r['vs_plain_torch']:.2f}x "
                f"| {r['vs_plain_auto']:.2f}x |"
            )
    args.out.mkdir(parents=True, exist_ok=True)
    tag = "tiny" if args.tiny else "cpu"
    (args.out / f"{tag}_pass_cost.md").write_text("\n".join(lines) + "\n")
    (args.out / f"{tag}_pass_cost.json").write_text(json.dumps(result, indent=1))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
