"""The implementation registry: what "auto" may pick, and what only a name selects."""

import json

import pytest
import torch

from bass import ops
from bass.ops import auto


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


# --------------------------------------------------------------------------- calibrated rule


@pytest.fixture
def rules(tmp_path, monkeypatch):
    """Write a rule file for the CPU into a temporary RULES_DIR."""
    monkeypatch.setattr(auto, "RULES_DIR", tmp_path)
    auto.clear_caches()

    def write(points, implementations=("padded", "per_row")):
        data = {"device_key": "cpu", "implementations": list(implementations), "points": points}
        (tmp_path / "cpu.json").write_text(json.dumps(data))
        auto.clear_caches()

    yield write
    auto.clear_caches()


def point(B, max_kv, fill, **us):
    return {"B": B, "T": 4, "max_kv": max_kv, "fill": fill, "us": us}


CPU = torch.device("cpu")


def test_rule_picks_the_fastest_at_the_nearest_measured_point(fake_impl, rules):
    fake_impl(name="padded")
    fake_impl(name="per_row")
    rules([point(8, 1024, 1.0, padded=1.0, per_row=2.0), point(8, 1024, 0.3, padded=3, per_row=1)])

    def pick(B, kv, fill):
        return ops.resolve_implementation("auto", CPU, auto.Features(B, 4, kv, fill)).name

    assert pick(8, 1024, 1.0) == "padded"
    assert pick(6, 900, 0.9) == "padded"
    assert pick(8, 1024, 0.35) == "per_row"
    # no features (a caller that gives none): the static priority order
    assert ops.resolve_implementation("auto", CPU).name == "sdpa"


def test_rule_only_offers_what_runs_here(fake_impl, rules):
    fake_impl(name="padded", available=lambda: False)
    fake_impl(name="per_row")
    rules([point(8, 1024, 1.0, padded=1.0, per_row=2.0)])
    f = auto.Features(8, 4, 1024, 1.0)
    assert ops.resolve_implementation("auto", CPU, f).name == "per_row"
    # a rule that timed nothing available here falls back to the static order
    rules([point(8, 1024, 1.0, elsewhere=1.0)], implementations=("elsewhere",))
    assert ops.resolve_implementation("auto", CPU, f).name == "sdpa"


def test_auto_calls_the_rules_pick_with_lengths_read_or_hinted(fake_impl, rules, monkeypatch):
    calls = []
    for name in ("padded", "per_row"):
        ref = ops._IMPLEMENTATIONS["reference"].op
        fake_impl(name=name)
        impl = ops._IMPLEMENTATIONS[name]
        ops._IMPLEMENTATIONS[name] = ops.Implementation(
            name=name,
            op=lambda *a, n=name, ref=ref: calls.append(n) or ref(*a),
            devices=impl.devices,
        )
    rules([point(2, 16, 1.0, padded=1, per_row=2), point(2, 16, 0.5, padded=2, per_row=1)])
    q, k, v = torch.randn(2, 2, 4, 8), torch.randn(2, 1, 64, 8), torch.randn(2, 1, 64, 8)
    q_lens = torch.tensor([4, 4], dtype=torch.int32)
    even, spread = (torch.tensor(x, dtype=torch.int32) for x in ([16, 16], [16, 4]))
    torch.ops.bass.ragged_attention(q, k, v, q_lens, even, 0.3)
    torch.ops.bass.ragged_attention(q, k, v, q_lens, spread, 0.3)
    with ops.length_hint([16, 16]):  # a hint wins over the tensor
        torch.ops.bass.ragged_attention(q, k, v, q_lens, spread, 0.3)
    assert calls == ["padded", "per_row", "padded"]


def test_features_fall_back_to_shapes_for_fake_tensors():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q, k = torch.empty(3, 4, 2, 8), torch.empty(3, 2, 128, 8)
        f = auto.features(q, k, torch.empty(3, dtype=torch.int32))
    assert f == auto.Features(3, 2, 128, 1.0, (4, 2, 8))
    f = auto.features(q, k, torch.tensor([100, 50, 0], dtype=torch.int32))
    assert (f.max_kv, f.fill) == (100, 0.5)


def test_unreadable_rule_says_how_to_fix_it(rules, tmp_path):
    (tmp_path / "cpu.json").write_text("{not json")
    auto.clear_caches()
    with pytest.raises(RuntimeError, match=r"calibrate_auto\.py"):
        auto.load_rule("cpu")


def test_own_rules_directory_is_searched_first(rules, tmp_path, monkeypatch):
    rules([point(8, 1024, 1.0, padded=1.0, per_row=2.0)])  # the "packaged" rule
    own = tmp_path / "own"
    own.mkdir()
    data = {"device_key": "cpu", "implementations": ["sdpa"], "points": [point(1, 8, 1.0, sdpa=1)]}
    (own / "cpu.json").write_text(json.dumps(data))
    monkeypatch.setenv("BASS_AUTO_RULES", str(own))
    auto.clear_caches()
    assert auto.load_rule("cpu").implementations == ("sdpa",)
    assert auto.rules_dirs()[0] == own
    monkeypatch.delenv("BASS_AUTO_RULES")
    auto.clear_caches()
    assert auto.load_rule("cpu").implementations == ("padded", "per_row")


def test_rule_prefers_points_of_the_same_head_geometry(fake_impl, rules):
    """A small model's heads and a 7B model's heads cross over differently: a call takes
    its decision from points measured with heads like its own."""
    fake_impl(name="padded")
    fake_impl(name="per_row")
    big = point(4, 512, 0.8, padded=1.0, per_row=2.0)
    small = {**point(4, 512, 0.8, padded=2.0, per_row=1.0), "heads": [9, 3, 64]}
    rules([big, small])

    def pick(heads):
        f = auto.Features(4, 4, 512, 0.8, heads)
        return ops.resolve_implementation("auto", CPU, f).name

    assert pick((32, 8, 128)) == "padded"
    assert pick((9, 3, 64)) == "per_row"
    assert pick((12, 4, 64)) == "per_row"  # nearest geometry
