"""Smoke run of bench/bench_policies.py so the benchmark cannot rot (tiny sizes)."""

import importlib.util
from pathlib import Path

import pytest

BENCH = Path(__file__).parents[1] / "bench" / "bench_policies.py"


def test_policies_bench_smoke(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_policies", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--batch", "2", "--max-new", "6", "--out", str(tmp_path)]) == 0
    table = (tmp_path / "cpu_policies_tiny.md").read_text()
    for label in mod.POLICIES:
        assert f"| {label} |" in table
    regular = mod.run_policy(*mod.tiny_pair(), "constant", {"k": 0}, 2, 6)
    assert regular["main_passes_per_token"] == pytest.approx(1.0, abs=0.2)
