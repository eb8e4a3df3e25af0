"""Calibrate ``impl="auto"`` from a kernel benchmark run.

``python bench/calibrate_auto.py bench/results/<mode>_kernels.json [--impls a,b,...]``

Reads the rows of ``bench/bench_kernels.py``, keeps the bass implementations (not the
SDPA baselines, not ``auto`` itself), and writes the rule file
``src/bass/ops/auto_rules/<device key>.json``: every measured point (B, T, longest
kv_len, fill) with each implementation's median time. ``auto`` then runs the fastest
available implementation at the point nearest a call (see ``bass.ops.auto``).

Only name implementations that passed their tests on this device (``--impls``): being in
the rule file is what puts an implementation into ``auto`` there.

It also writes ``<mode>_auto_rule.md`` beside the input: which implementation wins where,
and a leave-one-out check (the rule rebuilt without each point, asked about that point):
how much slower than the best its pick would have been. After committing a rule, run the
kernel suite again: its summary measures ``auto`` against the best fixed choice.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _machine import header, run_meta

from bass.ops import auto

BASELINES = ("sdpa-padded-mask", "sdpa-per-row")


def points_from(rows, impls):
    cases: dict[tuple, dict] = {}
    for r in rows:
        if r["method"] not in impls:
            continue
        heads = r.get("heads", [32, 8, 128])
        key = (r["B"], r["T"], r["ctx"], r["spread"], tuple(heads))
        p = cases.setdefault(
            key,
            {
                "B": r["B"],
                "T": r["T"],
                "max_kv": r["max_kv"],
                "fill": r["fill"],
                "heads": heads,
                "us": {},
            },
        )
        p["us"][r["method"]] = round(r["us"], 2)
    return [p for p in cases.values() if set(p["us"]) == set(impls)]


def leave_one_out(points, impls):
    """For each point: the rule built from the others, asked about it; its pick's time
    over the best time there."""
    out = []
    for i, p in enumerate(points):
        others = points[:i] + points[i + 1 :]
        if not others:
            break
        rule = auto.Rule.from_dict({"device_key": "-", "implementations": impls, "points": others})
        f = auto.Features(p["B"], p["T"], p["max_kv"], p["fill"], tuple(p["heads"]))
        pick = rule.choose(f, impls)
        out.append((p, pick, p["us"][pick] / min(p["us"].values())))
    return out


def report(points, impls, loo, meta, source, run) -> str:
    wins: dict[str, int] = {}
    for p in points:
        best = min(p["us"], key=p["us"].get)
        wins[best] = wins.get(best, 0) + 1
    fixed_worst = {n: max(p["us"][n] / min(p["us"].values()) for p in points) for n in impls}
    lines = [
        *header(f"auto rule for `{meta['device_key']}`", run),
        "",
        f"From `{source}` ({meta['device']}, {meta['software']}, {meta['date']}); "
        f"implementations: {', '.join(f'`{n}`' for n in impls)}; {len(points)} points.",
        "",
        "Fastest at each point: " + ", ".join(f"`{n}` {c}" for n, c in sorted(wins.items())),
        "",
        "Any single fixed choice, worst case over the grid (time / best time): "
        + ", ".join(f"`{n}` {r:.2f}x" for n, r in fixed_worst.items()),
        "",
    ]
    if loo:
        ratios = sorted(r for _, _, r in loo)
        lines += [
            "Leave-one-out (rule without the point, asked about it): picked the fastest at "
            f"{sum(r == 1.0 for r in ratios)} of {len(ratios)} points; median "
            f"{ratios[len(ratios) // 2]:.2f}x, worst {ratios[-1]:.2f}x the best time; "
            f"{sum(r > 1.10 for r in ratios)} points more than 10% slower.",
            "",
            "| heads | B | T | max kv | fill | times (µs) | leave-one-out pick | slower by |",
            "|---|---:|---:|---:|---:|---|---|---:|",
        ]
        for p, pick, r in loo:
            times = ", ".join(f"{n} {us:.0f}" for n, us in sorted(p["us"].items()))
            lines.append(
                f"| {'/'.join(map(str, p['heads']))} | "
                f"{p['B']} | {p['T']} | {p['max_kv']} | {p['fill']:.2f} | {times} | "
                f"{pick} | {r:.2f}x |"
            )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", type=Path, help="a <mode>_kernels.json of bench_kernels.py")
    ap.add_argument("--impls", default=None, help="comma-separated (default: all measured)")
    ap.add_argument(
        "--skip-unmeasured",
        action="store_true",
        help="drop --impls names this run did not time (e.g. a kernel that failed to build) "
        "instead of refusing",
    )
    ap.add_argument("--out", type=Path, default=auto.RULES_DIR)
    args = ap.parse_args(argv)
    data = json.loads(args.results.read_text())
    meta, rows = data["meta"], data["rows"]
    dtypes = sorted({r["dtype"] for r in rows})
    if len(dtypes) != 1:
        ap.error(f"{args.results} mixes dtypes {dtypes}; a rule is calibrated on one")
    measured = sorted({r["method"] for r in rows} - set(BASELINES) - {"auto"})
    impls = measured if args.impls is None else args.impls.split(",")
    unknown = [n for n in impls if n not in measured]
    if unknown and args.skip_unmeasured:
        print(f"not measured, left out: {unknown}", file=sys.stderr)
        impls, unknown = [n for n in impls if n in measured], []
    if unknown or len(impls) < 1:
        ap.error(f"{unknown or impls} not measured in {args.results}; measured: {measured}")
    points = points_from(rows, impls)
    if not points:
        ap.error("no case timed every one of the implementations")
    source = args.results.as_posix()
    with contextlib.suppress(ValueError):  # a path outside the checkout stays as given
        source = args.results.resolve().relative_to(Path.cwd()).as_posix()
    rule = {
        "device_key": meta["device_key"],
        "device": meta["device"],
        "software": meta["software"],
        "dtype": dtypes[0],
        "source": source,
        "calibrated": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "implementations": impls,
        "points": points,
    }
    auto.Rule.from_dict(rule)  # what bass will load must load
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{meta['device_key']}.json"
    path.write_text(json.dumps(rule, indent=1) + "\n")
    run = run_meta("calibrate_auto.py", sys.argv[1:] if argv is None else argv)
    text = report(points, impls, leave_one_out(points, impls), meta, source, run)
    md = args.results.with_name(f"{meta['mode']}_auto_rule.md")
    md.write_text(text)
    print(text)
    print(f"wrote {path} and {md}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
