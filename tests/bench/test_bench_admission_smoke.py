"""Smoke run of bench/admission.py (a tiny random model, a few prompts with several samples
each): both admission rules run and give the same sampled rows (which is faster is the
benchmark's to measure, on the real model)."""

import importlib.util
import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.bench  # nox -s bench_smoke (CI runs it), not the default suite

BENCH = Path(__file__).parents[2] / "bench" / "admission.py"


def test_admission_bench_smoke(tmp_path):
    spec = importlib.util.spec_from_file_location("admission", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--smoke", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "smoke_admission.json").read_text())
    assert data["meta"]["command"] == f"python bench/admission.py --smoke --out {tmp_path}"
    rows = {(r["n"], r["rule"]): r for r in data["table"] if r["set"] == "smoke"}
    assert len(data["table"]) == len(rows) == 4
    assert set(rows) == {(n, rule) for n in (2, 3) for rule in mod.RULES}
    assert all(bad == [] for bad in data["mismatches"].values())
    for n in (2, 3):
        in_order, group = rows[(n, "in-order")], rows[(n, "group")]
        assert in_order["tokens"] == group["tokens"] > 0
        for r in (in_order, group):
            assert 0 < r["steps"] < r["main_passes"] and 0 < r["rows_per_step"] <= 3
    text = (tmp_path / "smoke_admission.md").read_text()
    assert "| smoke | 3 | in-order |" in text and "every row equal" in text
