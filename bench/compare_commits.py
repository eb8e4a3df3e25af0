"""Two commits of bass side by side on this machine: the end-to-end benchmark run in a
checkout of each, alternating (before, after, before, after, ...), then one table.

    python bench/compare_commits.py BEFORE AFTER [--runs 2] [--name NAME] -- BENCH_E2E_ARGS

Each run is ``python bench/bench_e2e.py BENCH_E2E_ARGS --no-plots --out <tmp>`` inside a
``git worktree`` of its commit (its own ``src`` first on ``PYTHONPATH``), so both commits
run their own engine and their own benchmark script. Alternating runs and quoting each
run's paired ratio to transformers' ``generate`` (measured in the same run) keep the
machine's drift between minutes from passing for a difference between the commits. Each
commit's runs share an Inductor cache of their own (``TORCHINDUCTOR_CACHE_DIR``): one cache
for both could hand one commit's compiled code to the other (custom ops of the same name
that differ). Writes ``bench/results/cpu_<NAME>.md`` and ``cpu_<NAME>_runs.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import _machine

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).parent / "results"
ORDER = (
    "hf-generate",
    "bass-regular",
    "bass-regular compiled",
    "bass-regular F.linear",
    "bass[adaptive]",
    "bass[bass]",
    "bass[constant]",
    "bass[hf-heuristic]",
    "bass[goodput]",
)


def run_once(commit: str, tree: Path, bench_args: list[str], out: Path) -> dict:
    cache = str(tree.parent / f"inductor_{tree.name}")
    env = {**os.environ, "PYTHONPATH": str(tree / "src"), "TORCHINDUCTOR_CACHE_DIR": cache}
    cmd = [sys.executable, "bench/bench_e2e.py", *bench_args, "--no-plots", "--out", str(out)]
    subprocess.run(cmd, cwd=tree, env=env, check=True)
    return json.loads(next(out.glob("*_e2e.json")).read_text())


def table(runs: list[dict]) -> list[str]:
    """Markdown rows: tokens/s per run, and each side's paired ratios to ``generate``."""
    labels = [f"{r['label']}, run {i + 1}" for i, r in enumerate(runs)]
    lines = [
        "| batch | method | "
        + " | ".join(labels)
        + " | vs generate, before | vs generate, after |",
        "|---:|---|" + "---:|" * (len(runs) + 2),
    ]
    batches = sorted({row["batch"] for row in runs[0]["rows"]})
    # ORDER's methods first, then any other (a policy under forced acceptance: "... p=0.7")
    seen = [row["method"].split(" (")[0] for row in runs[0]["rows"]]
    methods = [m for m in ORDER if m in seen] + [m for m in dict.fromkeys(seen) if m not in ORDER]
    for b in batches:
        for m in methods:
            found = [
                next(
                    (x for x in r["rows"] if x["batch"] == b and x["method"].split(" (")[0] == m),
                    None,
                )
                for r in runs
            ]
            if any(f is None for f in found):
                continue
            speeds = [f"{f['tokens_per_s']:.1f}" for f in found]
            ratio = {"before": [], "after": []}
            for r, f in zip(runs, found, strict=True):
                ratio[r["label"]].append(f"{f['speedup']:.2f}x")
            lines.append(
                f"| {b} | {m} | " + " | ".join(speeds)
                + f" | {', '.join(ratio['before'])} | {', '.join(ratio['after'])} |"
            )  # fmt: skip
    return lines


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The options, and bench_e2e.py's arguments: everything after the first ``--``."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--runs", type=int, default=2, help="pairs of runs (default 2)")
    ap.add_argument("--name", default="commits", help="result name: cpu_<NAME>.md")
    ap.add_argument("bench_args", nargs="*", help="after --: bench_e2e.py's")
    # everything after the first "--" is bench_e2e.py's (argparse's REMAINDER also took
    # --runs and --name when they followed the commits, as the usage line writes them)
    cut = argv.index("--") if "--" in argv else len(argv)
    args = ap.parse_args(argv[:cut])
    return args, args.bench_args + argv[cut + 1 :]


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args, bench_args = parse(argv)
    meta = _machine.run_meta("compare_commits.py", argv, before=args.before, after=args.after)
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        trees = {}
        for label, commit in (("before", args.before), ("after", args.after)):
            trees[label] = Path(tmp) / label
            subprocess.run(
                ["git", "worktree", "add", "--detach", str(trees[label]), commit],
                cwd=ROOT,
                check=True,
            )
        try:
            for i in range(args.runs):
                for label in ("before", "after"):
                    out = Path(tmp) / f"run{i}_{label}"
                    commit = getattr(args, label)
                    data = run_once(commit, trees[label], bench_args, out)
                    runs.append({"label": label, "commit": commit, **data})
        finally:
            for tree in trees.values():
                subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT)
    lines = [
        *_machine.header(f"bass {args.before} against {args.after}, side by side", meta),
        "",
        "tokens/s of each run (the median of its rounds), runs alternating; `vs generate`: "
        "each run's paired ratio to transformers' `generate` at the same batch size.",
        "",
        *table(runs),
        "",
    ]
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"cpu_{args.name}.md").write_text("\n".join(lines))
    payload = {"meta": meta, "runs": runs}
    (RESULTS / f"cpu_{args.name}_runs.json").write_text(json.dumps(payload, indent=1))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
