"""Smoke run of bench/bench_kernels.py: the timing harness, and its baselines agreeing
with the reference (so the suite compares like with like)."""

import importlib.util
from pathlib import Path

import torch

import bass.ops.reference as ref

BENCH = Path(__file__).parents[1] / "bench" / "bench_kernels.py"


def load():
    spec = importlib.util.spec_from_file_location("bench_kernels", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_baselines_compute_the_same_attention():
    mod = load()
    for spread in ("uniform", "bimodal", "longtail"):
        q, k, v, ql, kl, q_lens, kv_lens = mod.make_inputs(
            3, 4, 40, spread, torch.float64, "cpu", hq=4, hkv=2, d=8
        )
        expect = ref.ragged_attention(q, k, v, ql, kl, 0.3)
        got = mod.per_row(q, k, v, q_lens, kv_lens, 0.3)
        torch.testing.assert_close(got, expect)
        mask = mod.padded_mask(q_lens, kv_lens, 4, k.shape[2], "cpu")
        padded = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, scale=0.3, enable_gqa=True
        )
        live = (torch.arange(4)[None] < ql[:, None])[:, None, :, None]
        torch.testing.assert_close(padded * live, expect)


def test_kernel_bench_smoke(tmp_path):
    mod = load()
    assert mod.main(["--mode", "smoke", "--out", str(tmp_path)]) == 0
    table = (tmp_path / "smoke_kernels.md").read_text()
    for method in ("sdpa-padded-mask", "sdpa-per-row", "reference"):
        assert f"| {method} |" in table
