"""bench/compare_commits.py's command line: the options may come before or after the two
commits, and everything after ``--`` is bench_e2e.py's (the usage line's order once
handed ``--runs`` and ``--name`` to bench_e2e.py, which refused them)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

BENCH = Path(__file__).parents[2] / "bench"


def _module():
    sys.path.insert(0, str(BENCH))  # its `import _machine`
    try:
        spec = importlib.util.spec_from_file_location(
            "compare_commits", BENCH / "compare_commits.py"
        )
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(BENCH))
    return mod


def test_options_before_or_after_the_commits():
    parse = _module().parse
    tail = ["--", "--smoke", "--batches", "8", "--graph-batches", ""]
    for argv in (
        ["abc123", "def456", "--runs", "3", "--name", "x", *tail],
        ["--runs", "3", "--name", "x", "abc123", "def456", *tail],
    ):
        args, bench = parse(argv)
        assert (args.before, args.after, args.runs, args.name) == ("abc123", "def456", 3, "x")
        assert bench == ["--smoke", "--batches", "8", "--graph-batches", ""]
