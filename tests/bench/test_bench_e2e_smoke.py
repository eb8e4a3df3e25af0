"""Smoke run of bench/bench_e2e.py (tiny random models) so the suite cannot rot."""

import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.bench  # nox -s bench_smoke (CI runs it), not the default suite

BENCH = Path(__file__).parents[2] / "bench" / "bench_e2e.py"


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


def test_gpu_mode_reporting_runs_on_cpu(tmp_path):
    """The GPU run's extra reporting (forced-acceptance sweep, bandwidth floor, utilisation,
    the paper's batch-8 comparison) exercised on CPU with tiny models, so its first GPU
    run is not its first run."""
    spec = importlib.util.spec_from_file_location("bench_e2e", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    main, draft, prompts, _ = mod.smoke_setup(8)
    calls, hf_generate = [], mod.hf_generate
    mod.hf_generate = lambda *a, **k: calls.append(len(a[1])) or hf_generate(*a, **k)
    rows = mod.run_grid(
        main, draft, prompts, [8], 3, mod.GPU_POLICIES, forced=(0.5, 0.9), assisted_upto=1,
        warm_round=True,
    )  # fmt: skip
    assert {r["method"] for r in rows} >= {"bass[bass] p=0.5", "bass[constant] p=0.9"}
    # the process's warm-up at batch 1, then batch 8's untimed round and its timed one
    assert calls == [1, 8, 8] and all(len(r["walls"]) == 1 for r in rows)
    # a machine name with a known peak, to reach the utilisation estimate
    meta = mod.device_meta(rows, main, draft, "pretend H100 (CPU test)", "cpu", 1 << 20)
    assert meta["bandwidth_gbs"] > 0 and meta["weight_gb"] > 0
    assert set(meta["utilisation"]) == {f"{r['method']} @ batch 8" for r in rows}
    meta.update(
        setup="tiny", mode="gpu", max_new=3, forced_acceptance=[0.5, 0.9], command="-",
        date="-", machine="-", software="-",
    )  # fmt: skip
    text = mod.to_markdown(rows, meta)
    assert "Beside the paper's headline" in text and "| bass[bass] p=0.9 |" in text
    assert "Bandwidth floor per main pass" in text


def test_rounds_are_paired_and_cpu_targets_reported():
    """Several rounds: each method's wall is the median of its rounds, its speedup the
    median of per-round ratios against hf-generate; the CPU table ends with the targets."""
    spec = importlib.util.spec_from_file_location("bench_e2e", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    main, draft, prompts, _ = mod.smoke_setup(2)
    policies = {"adaptive": {}}
    rows = mod.run_grid(main, draft, prompts, [2], 3, policies, assisted_upto=0, repeats=3)
    by = {r["method"]: r for r in rows}
    assert set(by) == {"hf-generate", "bass-regular", "bass[adaptive]"}
    base = by["hf-generate"]["walls"]
    for r in rows:
        assert len(r["walls"]) == 3
        assert r["wall_s"] == sorted(r["walls"])[1]
        ratios = sorted(b / w for b, w in zip(base, r["walls"]))
        assert r["speedup"] == ratios[1]
    assert mod.paired([2.0, 4.0], [1.0]) == 3.0  # timed once: against the median
    meta = dict(
        setup="tiny", mode="cpu", max_new=3, repeats=3, command="-", date="-", machine="-",
        software="-",
    )  # fmt: skip
    text = mod.to_markdown(rows, meta)
    assert "3 rounds" in text and "## Targets (CPU" in text
    assert f"| 2 | {by['bass-regular']['speedup']:.2f}x |" in text
