"""Smoke run of bench/bench_policies.py so the benchmark cannot rot (tiny sizes)."""

import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.bench  # nox -s bench_smoke (CI runs it), not the default suite

BENCH = Path(__file__).parents[2] / "bench" / "bench_policies.py"


def test_policies_bench_smoke(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_policies", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    argv = ["--setup", "tiny", "--batches", "1,4", "--max-new", "8", "--repeats", "1"]
    assert mod.main([*argv, "--out", str(tmp_path)]) == 0
    table = (tmp_path / "tiny_policies.md").read_text()
    for batch in (1, 4):
        for m in [*mod.BASELINES, *mod.POLICIES]:
            label = f"**{m}** (default)" if m == mod.DEFAULT else m
            assert f"| {batch} | {label} |" in table
    assert "never more than 5% below drafting off" in table
    assert "within 10% of the best built-in policy" in table


def test_control_pair_sets_and_tag(tmp_path):
    """``--control`` times drafting off twice per round (the noise floor); ``--sets`` and
    ``--tag`` pick the prompt sets and the output file."""
    spec = importlib.util.spec_from_file_location("bench_policies", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    argv = ["--setup", "tiny", "--batches", "2", "--max-new", "4", "--repeats", "2"]
    argv += ["--control", "--sets", "even", "--tag", "aa", "--out", str(tmp_path)]
    assert mod.main(argv) == 0
    table = (tmp_path / "aa.md").read_text()
    assert f"| 2 | {mod.CONTROL} |" in table and "## ragged prompts" not in table
    assert "Noise floor" in table and "- even batch 2: " in table
