"""Smoke run of bench/bench_kernels.py: the timing harness, and its baselines agreeing
with the reference (so the suite compares like with like)."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch

import bass.ops.reference as ref
from bass import ops
from bass.ops import auto

BENCH = Path(__file__).parents[1] / "bench"


def load(name="bench_kernels"):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
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


def test_kernel_bench_smoke_then_calibrate(tmp_path, monkeypatch):
    """The whole loop on CPU: time, chart, calibrate a rule, and auto following it."""
    mod = load()
    assert mod.main(["--mode", "smoke", "--out", str(tmp_path), "--plot"]) == 0
    table = (tmp_path / "smoke_kernels.md").read_text()
    for method in ("sdpa-padded-mask", "sdpa-per-row", "reference", "sdpa", "sdpa_padded"):
        assert f"| {method} |" in table
    assert "| auto (" in table and "## Summary" in table
    assert (tmp_path / "smoke_kernels_crossover.png").stat().st_size > 0

    cal = load("calibrate_auto")
    rules = tmp_path / "rules"
    results = tmp_path / "smoke_kernels.json"
    assert cal.main([str(results), "--impls", "reference,sdpa_padded", "--out", str(rules)]) == 0
    rule = json.loads((rules / "cpu.json").read_text())
    assert rule["implementations"] == ["reference", "sdpa_padded"]
    assert "Leave-one-out" in (tmp_path / "smoke_auto_rule.md").read_text()
    # auto now follows the rule: its pick at a measured point is that point's fastest
    monkeypatch.setattr(auto, "RULES_DIR", rules)
    auto.clear_caches()
    try:
        p = rule["points"][0]
        fastest = min(p["us"], key=p["us"].get)
        f = auto.Features(p["B"], p["T"], p["max_kv"], p["fill"])
        assert ops.resolve_implementation("auto", torch.device("cpu"), f).name == fastest
    finally:
        auto.clear_caches()


def test_calibrate_refuses_what_was_not_measured(tmp_path):
    mod = load()
    assert mod.main(["--mode", "smoke", "--out", str(tmp_path), "--impls", "reference"]) == 0
    cal = load("calibrate_auto")
    with pytest.raises(SystemExit):
        cal.main([str(tmp_path / "smoke_kernels.json"), "--impls", "fused"])


def test_gpu_passed_only_trusts_implementations_whose_tests_all_passed(tmp_path):
    xml = tmp_path / "gpu_tests.xml"
    xml.write_text(
        """<testsuites><testsuite>
        <testcase classname="tests.test_triton_fused" name="test_gpu_fused_matches_reference"/>
        <testcase classname="tests.test_cutlass" name="test_gpu_matches_reference[pad-bf16-a]"/>
        <testcase classname="tests.test_cutlass" name="test_gpu_matches_reference[split-bf16-a]">
          <failure message="mismatch"/></testcase>
        <testcase classname="tests.test_ops_reference" name="test_x[cuda-reference]">
          <skipped message="no"/></testcase>
        <testcase classname="tests.test_ops_compile" name="test_gpu_llama_step[fused]">
          <failure message="graph break"/></testcase>
        <testcase classname="tests.test_ops_compile" name="test_gpu_llama_step[pad]"/>
        </testsuite></testsuites>"""
    )
    mod = load("gpu_passed")
    assert mod.passed(xml) == ["pad"]
    assert mod.main([str(tmp_path / "missing.xml")]) == 1
