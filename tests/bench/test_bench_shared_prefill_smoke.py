"""Smoke run of bench/shared_prefill.py (a tiny random model, three prompts with three
samples each): both ways run and give the same sampled rows, and the shared way computes
fewer prompt tokens (which is faster is the benchmark's to measure, on the real model)."""

import importlib.util
import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.bench  # nox -s bench_smoke (CI runs it), not the default suite

BENCH = Path(__file__).parents[2] / "bench" / "shared_prefill.py"


def test_shared_prefill_bench_smoke(tmp_path):
    spec = importlib.util.spec_from_file_location("shared_prefill", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--smoke", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "smoke_shared_prefill.json").read_text())
    assert data["meta"]["command"] == f"python bench/shared_prefill.py --smoke --out {tmp_path}"
    assert data["mismatches"] == []
    rows = {r["way"]: r for r in data["table"]}
    assert set(rows) == set(mod.WAYS)
    shared, each = rows["shared"], rows["each"]
    total = 3 * sum(data["meta"]["prompt_tokens"])  # every row's prompt
    assert each["prefill_tokens"] == total and each["shared_prompt_tokens"] == 0
    assert shared["prefill_tokens"] + shared["shared_prompt_tokens"] == total
    assert shared["prefill_tokens"] < each["prefill_tokens"]
    assert shared["tokens"] == each["tokens"] > 0
    text = (tmp_path / "smoke_shared_prefill.md").read_text()
    assert "| shared |" in text and "every row equal" in text
