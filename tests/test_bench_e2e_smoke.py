"""Smoke run of bench/bench_e2e.py (tiny random models) so the suite cannot rot."""

import importlib.util
from pathlib import Path

BENCH = Path(__file__).parents[1] / "bench" / "bench_e2e.py"


def test_e2e_bench_smoke(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_e2e", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--smoke", "--out", str(tmp_path)]) == 0
    table = (tmp_path / "smoke_e2e.md").read_text()
    methods = ["hf-generate", "bass-regular", "hf-assisted (1 at a time)"]
    methods += [f"bass[{p}]" for p in mod.CPU_POLICIES]
    for batch in (1, 2):
        for m in methods:
            assert f"| {batch} | {m} |" in table
    assert (tmp_path / "smoke_e2e_latency.png").stat().st_size > 1000
    assert (tmp_path / "smoke_e2e_draft_length.png").stat().st_size > 1000
