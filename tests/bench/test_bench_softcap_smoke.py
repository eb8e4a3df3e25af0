"""Smoke run of bench/softcap.py so the benchmark cannot rot (toy shapes)."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.bench  # nox -s bench_smoke (CI runs it), not the default suite

BENCH = Path(__file__).parents[2] / "bench" / "softcap.py"


def test_softcap_bench_smoke(tmp_path):
    sys.path.insert(0, str(BENCH.parent))  # its siblings, as when run as a script
    spec = importlib.util.spec_from_file_location("softcap", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--mode", "smoke", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "smoke_softcap.json").read_text())["rows"]
    assert rows and all(r["flex_us"] > 0 and r["reference_us"] > 0 for r in rows)
    assert all(r["max_diff"] < 1e-4 for r in rows)  # the two computed the same attention
    assert "| verify | 3 | 9 |" in (tmp_path / "smoke_softcap.md").read_text()
