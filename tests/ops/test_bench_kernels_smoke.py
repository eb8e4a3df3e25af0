"""Smoke run of bench/bench_kernels.py: the timing harness over every implementation that
runs here, and the block-mask comparison (both builds agreeing, so it compares like with
like)."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from bass.ops import plan

pytestmark = pytest.mark.bench  # nox -s bench_smoke (CI runs it), not the default suite

BENCH = Path(__file__).parents[2] / "bench"


def load(name="bench_kernels"):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_kernel_bench_smoke(tmp_path):
    mod = load()
    assert mod.main(["--mode", "smoke", "--out", str(tmp_path)]) == 0
    table = (tmp_path / "smoke_kernels.md").read_text()
    for impl in plan.implementations("cpu"):
        assert f"{impl} layer µs" in table
    data = json.loads((tmp_path / "smoke_kernels.json").read_text())
    assert [r["case"] for r in data["rows"]] == ["verify-spread", "mixed"]
    assert all(m["direct_us"] > 0 and m["grid_us"] > 0 for m in data["block_mask"])
    assert data["meta"]["command"].startswith("python bench/bench_kernels.py --mode smoke")


def test_the_grid_evaluated_block_mask_is_the_one_flex_builds():
    mod = load()
    q_lens, cache_lens = [30, 2, 0], [10, 30, 4]
    q, k, _, cu, lens, kv, _ = mod.inputs(q_lens, cache_lens, mod.GEOMETRY["smoke"], "cpu")
    p = plan.Plan.for_pass("flex", q_lens, cache_lens, q.shape[2], cu, lens, kv, k.shape[2])
    grid = mod.grid_block_mask(p).to_dense()
    direct = p.state.block_mask.to_dense()
    assert torch.equal(grid, direct)
