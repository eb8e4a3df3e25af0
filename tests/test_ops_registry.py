"""The implementation registry: what "auto" may pick, and what only a name selects."""

import pytest
import torch

from bass import ops


@pytest.fixture
def fake_impl(monkeypatch):
    registry = dict(ops._IMPLEMENTATIONS)
    monkeypatch.setattr(ops, "_IMPLEMENTATIONS", registry)
    ref = registry["reference"].op
    return lambda **kw: ops.register_implementation(
        ops.Implementation(op=ref, devices=("cpu",), **kw)
    )


def test_auto_skips_implementations_not_cleared_for_auto(fake_impl):
    fake_impl(name="unproven", priority=99, in_auto=False)
    assert ops.resolve_implementation("auto", torch.device("cpu")).name == "sdpa"
    assert ops.resolve_implementation("unproven", torch.device("cpu")).name == "unproven"


def test_auto_prefers_the_highest_priority_available(fake_impl):
    fake_impl(name="fast", priority=5)
    fake_impl(name="faster-but-missing", priority=9, available=lambda: False)
    assert ops.resolve_implementation("auto", torch.device("cpu")).name == "fast"
    with pytest.raises(RuntimeError, match="not available"):
        ops.resolve_implementation("faster-but-missing", torch.device("cpu"))


def test_gpu_kernels_are_registered_but_not_auto_until_validated():
    for name in ("fused", "pad", "split"):
        impl = ops._IMPLEMENTATIONS[name]
        assert impl.devices == ("cuda",) and not impl.in_auto
    with pytest.raises(ValueError, match="runs on cuda, not cpu"):
        ops.resolve_implementation("fused", torch.device("cpu"))
