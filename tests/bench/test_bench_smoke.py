"""Run bench/bench_op_overhead.py's measurement once on the tiny shape, so it cannot rot."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.bench  # nox -s bench_smoke (CI runs it), not the default suite

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_op_overhead.py"


@pytest.fixture(scope="module")
def bench_module():
    name = "bench_op_overhead"
    if str(BENCH.parent) not in sys.path:  # its sibling _machine, as when run as a script
        sys.path.insert(0, str(BENCH.parent))
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, BENCH)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up while it executes
        spec.loader.exec_module(module)
    return module


def test_bench_op_overhead_smoke(bench_module, tmp_path):
    rows, md, js = bench_module.run(
        ["tiny"], repetitions=1, out_dir=tmp_path, command="pytest smoke"
    )
    assert (md, js) == (tmp_path / "cpu_op_overhead.md", tmp_path / "cpu_op_overhead.json")
    labels = bench_module.CALL_LABELS
    assert [r["call"] for r in rows] == labels
    assert all(r["shape"] == "tiny" and r["runs"] == 1 and r["median_us"] > 0 for r in rows)
    for row in rows:  # each baseline is measured, and is its own unit
        assert row["baseline"] in labels
        if row["call"] == row["baseline"]:
            assert row["ratio_vs_baseline"] == 1.0

    payload = json.loads(js.read_text(encoding="utf-8"))
    assert payload["command"] == "pytest smoke"
    assert {"torch", "cpu_count", "processor", "date"} <= set(payload["machine"])
    assert payload["results"] == rows

    text = md.read_text(encoding="utf-8")
    assert "| call | median µs | ratio vs plain-python reference |" in text
    assert all(f"`{label}`" in text for label in labels)
