"""The one dispatch (bass.ops.plan): ``auto``'s pick per device and pass kind, and why;
passes planned once from host lengths and run by every layer, against the float64 loop
oracle; the row gather that serves the padded-row kernels (flex, BASS-PAD, BASS-SPLIT);
device neutrality; the engine planning each pass exactly once, never reading lengths back
per layer; and ``bass ops`` saying all of it."""

from __future__ import annotations

import dataclasses
import types

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from models import perturbed, tiny_lm
from test_ops_packed import EDGE, PackedCase, check_against_naive, packed_cases, with_edge_cases

import bass
from bass.ops import plan, reference, sdpa
from bass.testing import naive_kv_append_packed

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def planned(case: PackedCase, args, impl: str, cache_lens=None, kind="eager") -> plan.Plan:
    _, _, _, cu, kv, _ = args
    q_lens = list(case.q_lens)
    lens = cache_lens if cache_lens is not None else [a - n for a, n in zip(case.kv_lens, q_lens)]
    lens_t = torch.tensor(lens, dtype=torch.int32)
    return plan.Plan.for_pass(impl, q_lens, lens, case.N, cu, lens_t, kv, case.S, kind)


@pytest.fixture
def fused_runs(monkeypatch):
    """fused as on a machine with a GPU (here it has no CUDA device to run on)."""
    import dataclasses

    impls = dict(plan.IMPLEMENTATIONS)
    impls["fused"] = dataclasses.replace(impls["fused"], unavailable=lambda: None)
    monkeypatch.setattr(plan, "IMPLEMENTATIONS", impls)


def test_resolve_takes_a_device_name_and_refuses_an_unknown_pass_kind():
    assert plan.resolve("auto", "cpu") == plan.resolve("auto", CPU)
    assert plan.resolve("reference", "cpu", "compiled")[0].name == "reference"
    for impl in ("auto", "reference"):  # a typo was auto's fallback, or ignored by a name
        with pytest.raises(ValueError, match=r"unknown pass kind 'compild'; one of eager, "):
            plan.resolve(impl, CPU, "compild")


def test_auto_per_device_and_pass_kind_with_reasons(fused_runs):
    """The CUDA default is one launch per layer in every pass kind, each what passed on a
    GPU (fused in eager passes, flex traced into graphs); the CPU keeps what measured
    fastest there. Each pick says why."""
    for kind in plan.PASS_KINDS:
        impl, why = plan.resolve("auto", CUDA, kind)
        assert impl.name == ("fused" if kind == "eager" else "flex") and impl.single_launch
        assert impl.traceable and "on an H100" in why
    assert plan.resolve("auto", CPU, "eager")[0].name == "sdpa"
    for kind in ("compiled", "graphs"):
        assert plan.resolve("auto", CPU, kind)[0].name == plan.AUTO["cpu"][kind][0]
    assert plan.resolve("sdpa", CPU, "compiled") == (
        plan.IMPLEMENTATIONS["sdpa"],
        "named explicitly",
    )


@pytest.mark.parametrize("impl", ["auto", "sdpa", "reference", "flex"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
@settings(max_examples=60)
@with_edge_cases()
@given(case=packed_cases())
def test_planned_attention_matches_naive_loop(case, dtype, impl):
    args = case.tensors(dtype)
    q, k, v, _, _, scale = args
    p = planned(case, args, impl)
    assert p.impl.name == ("sdpa" if impl == "auto" else impl)
    check_against_naive(p.attend(q, k, v, scale), case, args, dtype)


@settings(max_examples=100)
@with_edge_cases()
@given(case=packed_cases())
def test_the_row_gather_round_trips(case):
    """The padded-row implementations' glue: each row's tokens gathered into ``[B, Hq, T,
    D]`` and scattered back token-major give the tokens back, padding tokens as 0."""
    q, *_ = case.tensors(torch.float64)
    cu = torch.tensor([0, *torch.tensor(case.q_lens).cumsum(0).tolist()], dtype=torch.int32)
    T = max((1, *case.q_lens))
    src, back = reference.row_slots(cu[:-1], cu.diff(), T, case.N)
    rows = reference.to_rows(q, src)
    assert rows.shape == (case.B, case.Hq, T, case.D)
    out = reference.from_rows(rows, back)
    real = sum(case.q_lens)
    assert torch.equal(out[:, :, :real], q[:, :, :real]) and (out[:, :, real:] == 0).all()
    assert out.transpose(1, 2).is_contiguous()


@settings(max_examples=100)
@given(case=packed_cases(), data=st.data())
def test_planned_append_matches_naive(case, data):
    _, k, v, cu, _, _ = case.tensors(torch.float32)
    cache_lens = [data.draw(st.integers(0, case.S - n)) if n <= case.S else 0 for n in case.q_lens]
    if any(c + n > case.S for c, n in zip(cache_lens, case.q_lens)):
        return
    new_k = torch.randn(1, case.Hkv, case.N, case.D)
    new_v = torch.randn(1, case.Hkv, case.N, case.D)
    lens_t = torch.tensor(cache_lens, dtype=torch.int32)
    p = plan.Plan.for_pass("auto", list(case.q_lens), cache_lens, case.N, cu, lens_t,
                           lens_t + cu.diff(), case.S)  # fmt: skip
    k1, v1 = k.clone(), v.clone()
    p.append(k1, v1, new_k, new_v)
    k2, v2 = naive_kv_append_packed(k, v, new_k, new_v, cu, lens_t)
    assert torch.equal(k1, k2) and torch.equal(v1, v2)


@pytest.mark.parametrize(
    "q_lens, lens",
    [
        ([3, 1, 2], [4, 5, 0]),
        ([1, 1, 1], [8, 7, 8]),
        ([2, 2, 2], [7, 8, 8]),
        ([1, 3, 1], [5, 6, 8]),
    ],
    ids=["mixed", "decode", "uniform", "decode-batch"],
)
@pytest.mark.parametrize("impl", ["sdpa", "reference", "flex-metadata"])
def test_plans_build_everything_on_the_pass_device(q_lens, lens, impl):
    """Every tensor a plan builds lives on the pass's device: on the meta device, any
    index or mask left on the CPU would fail. (How the GPU paths of the planned per-row
    SDPA, the reference and flex's block mask and row gather are checked without a GPU;
    none has run on one yet.)"""
    meta = torch.device("meta")
    cu = [0]
    for n in q_lens:
        cu.append(cu[-1] + n)
    N, B = cu[-1] + 1, len(q_lens)
    kv = [a + b for a, b in zip(q_lens, lens)]
    q, k = torch.empty(1, 4, N, 8, device=meta), torch.empty(B, 2, 10, 8, device=meta)
    cut, kvt = (torch.tensor(x, dtype=torch.int32, device=meta) for x in (cu, kv))
    if impl == "sdpa":  # a scale <= 0 too: a causal row's mask is built then
        sdpa_plan = sdpa.SdpaPlan(cu[:-1], q_lens, kv, N, meta, check_finite=False)
        assert sdpa_plan.run(q, k, k, -0.3).device == meta
        out = sdpa_plan.run(q, k, k, 0.3)
    elif impl == "reference":
        out = reference.attention(q, k, k, cut[:-1], cut.diff(), kvt, 0.3)
    else:  # the tensor work of flex's prepare, and its gather and scatter
        p = types.SimpleNamespace(starts=cut[:-1], q_lens=cut.diff(), kv_lens=kvt, width=4,
                                  cache_size=10, num_tokens=N, kind="compiled",
                                  softcap=None, window=None)  # fmt: skip
        state = plan.flex.prepare(p)
        assert {t.device for t in (state.src, state.back, *state.blocks)} == {meta}
        out = reference.from_rows(reference.to_rows(q, state.src), state.back)
    assert out.device == meta


def test_the_op_plans_from_its_tensors_without_a_host_read_off_the_cpu(monkeypatch):
    """Called directly on a GPU with checks off, the op plans from the tensors alone (the
    rows' width is the pass's N): checked here by making every host read fail."""
    case = EDGE["worked_example"]
    q, k, v, cu, kv, scale = case.tensors(torch.float32)
    p = plan._plan_call("ragged_attention_packed", "reference", cu, kv, case.N, case.S, True)
    assert p.host is not None  # on a CPU the read is free: the plan has host lengths

    def no_read(*a):
        raise AssertionError("host read")

    ref = plan.IMPLEMENTATIONS["reference"]  # "meta" stands for a GPU here
    monkeypatch.setitem(
        plan.IMPLEMENTATIONS, "reference", dataclasses.replace(ref, devices=("meta",))
    )
    with bass.ops.length_checks(False), monkeypatch.context() as m:
        m.setattr(torch.Tensor, "tolist", no_read)
        cu_m, kv_m = cu.to("meta"), kv.to("meta")
        p = plan._plan_call(
            "ragged_attention_packed", "reference", cu_m, kv_m, case.N, case.S, True
        )
        assert p.attend(*(t.to("meta") for t in (q, k, v)), scale).device.type == "meta"
    assert p.host is None and p.width == case.N


@pytest.mark.parametrize("draft", ["ngram", "model"])
def test_the_engine_plans_each_pass_once_and_never_reads_lengths_per_layer(monkeypatch, draft):
    calls = {"plans": 0}
    real_init = plan.Plan.__init__

    def counting(self, *a, **kw):
        calls["plans"] += 1
        real_init(self, *a, **kw)

    def no_op(*a, **kw):  # the op's per-call planning (its host read of the lengths)
        raise AssertionError("an eager engine pass called the op instead of its plan")

    monkeypatch.setattr(plan.Plan, "__init__", counting)
    monkeypatch.setattr(plan, "_plan_call", no_op)
    main = tiny_lm(seed=3, layers=3)
    d = perturbed(main) if draft == "model" else "ngram"
    gen = bass.Generator(main, d, policy="constant", policy_options={"k": 3})
    res = gen.generate([[1, 2, 3, 1, 2], [4, 5], [6]], max_new_tokens=8)
    assert calls["plans"] == res.stats.main_passes + res.stats.draft_passes
    picks = gen.passes.attention(torch.device("cpu"))
    assert list(picks) == ["eager"] and picks["eager"].startswith("sdpa: measured fastest")
    assert res.stats.attention == picks  # res.stats says what auto picked and why


def test_worked_example_of_the_plan_docstring():
    case = EDGE["worked_example"]
    args = case.tensors(torch.float64)
    p = planned(case, args, "auto", cache_lens=[4, 4, 0])
    assert p.host.kv_lens == [7, 4, 2] and p._index[1].tolist() == [4, 5, 6, 0, 1]
    assert p.width == 4  # the longest row's 3 tokens, bucketed


def test_bass_ops_names_the_single_launch_default_on_cuda_without_a_gpu(capsys):
    """Without a GPU (fused cannot run in this process) the CUDA picks are still what a
    machine with one runs."""
    from bass.cli import main

    assert main(["ops", "--device", "cuda"]) == 0
    out = capsys.readouterr().out
    if not torch.cuda.is_available():
        assert "auto on cuda (none here: what a machine with one picks)" in out
    assert "  eager     fused (one launch per layer): bass's Triton flash kernel" in out
    for kind in ("compiled", "graphs"):
        assert f"  {kind:<9} flex (one launch per layer): one FlexAttention launch" in out
    assert "on an H100" in out
    for name in plan.IMPLEMENTATIONS:
        assert f"  {name} " in out
    assert main(["ops"]) == 0
    out = capsys.readouterr().out
    assert "auto on cpu" in out and "  eager     sdpa (not one launch per layer)" in out
