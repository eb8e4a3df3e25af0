"""Smoke run of bench/pass_cost.py so the benchmark cannot rot (tiny model)."""

import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.bench  # nox -s bench_smoke (CI runs it), not the default suite

BENCH = Path(__file__).parents[2] / "bench" / "pass_cost.py"


def test_pass_cost_bench_smoke(tmp_path):
    spec = importlib.util.spec_from_file_location("pass_cost", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--tiny", "--batches", "1,3", "--repeats", "1", "--out", str(tmp_path)]) == 0
    table = (tmp_path / "tiny_pass_cost.md").read_text()
    rows = table.splitlines()
    for batch, tokens in ((1, 1), (1, 9), (3, 3), (3, 27)):
        assert any(r.startswith(f"| {batch} |") and f"| {tokens} |" in r for r in rows)
