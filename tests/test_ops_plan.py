"""Planned packed passes (bass.ops.plan): the attention of a pass planned once from host
lengths and run by every layer, against the float64 loop oracle; the packed forms of
padded implementations (BASS-PAD / BASS-SPLIT's glue); device neutrality; and the engine
planning each eager pass exactly once, never reading lengths back per layer."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from models import perturbed, tiny_lm
from test_ops_packed import EDGE, PackedCase, check_against_naive, packed_cases, with_edge_cases

import bass
from bass.ops import packed, plan, reference, sdpa
from bass.ops.packed import padded_as_packed
from bass.ops.plan import plan_packed
from bass.ops.sdpa import SdpaPlan
from bass.testing import naive_kv_append_packed


def planned(case: PackedCase, args, impl: str, cache_lens=None):
    _, _, _, cu, kv, _ = args
    q_lens = list(case.q_lens)
    lens = cache_lens if cache_lens is not None else [a - n for a, n in zip(case.kv_lens, q_lens)]
    lens_t = torch.tensor(lens, dtype=torch.int32)
    return plan_packed(impl, q_lens, lens, case.N, cu, lens_t, kv)


@pytest.mark.parametrize("impl", ["auto", "sdpa", "reference"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
@settings(max_examples=100)
@with_edge_cases()
@given(case=packed_cases())
def test_planned_attention_matches_naive_loop(case, dtype, impl):
    args = case.tensors(dtype)
    q, k, v, _, _, scale = args
    p = planned(case, args, impl)
    assert p.impl.name == ("sdpa" if impl == "auto" else impl)
    check_against_naive(p.attend(q, k, v, scale), case, args, dtype)


@pytest.mark.parametrize(
    "inner", [reference.ragged_attention, sdpa.ragged_attention_padded], ids=["ref", "sdpa"]
)
@pytest.mark.parametrize("width", ["shapes", "planned"])
@settings(max_examples=100)
@with_edge_cases()
@given(case=packed_cases())
def test_padded_implementations_in_packed_form(case, inner, width):
    """The glue that gives BASS-PAD and BASS-SPLIT (padded CUTLASS kernels) their packed
    form, checked here around CPU padded implementations: gather each row's queries into
    [B, Hq, T, D], run the padded op, scatter back token-major."""
    args = case.tensors(torch.float64)
    T = None if width == "shapes" else max(case.q_lens, default=0)
    out = padded_as_packed(inner, T)(*args)
    check_against_naive(out, case, args, torch.float64)


def test_pad_and_split_have_packed_forms_named_explicitly_only():
    """Registered for CUDA (when the CUTLASS library is built), never in auto before they
    pass on a GPU; on this machine they are reported unavailable, not silently run."""
    for name in ("pad", "split"):
        impl = packed._PACKED[name]
        assert impl.devices == ("cuda",) and not impl.in_auto and impl.plan is not None
    assert packed.resolve_packed_implementation("auto", torch.device("cpu")).name == "sdpa"
    assert packed.resolve_packed_implementation("auto", torch.device("cuda")).name == "reference"
    planned_cuda = packed.resolve_packed_implementation("auto", torch.device("cuda"), True)
    assert planned_cuda.name == "sdpa"  # host lengths: the per-row SDPA serves CUDA too


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
    p = plan_packed("auto", list(case.q_lens), cache_lens, case.N, cu, lens_t, lens_t + cu.diff())
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
def test_plans_build_everything_on_the_pass_device(q_lens, lens):
    """Every tensor a plan builds lives on the pass's device: run on the meta device, any
    index or mask left on the CPU would fail. (This is how the GPU path of the planned
    per-row SDPA is checked without a GPU; it has not yet run on one.)"""
    meta = torch.device("meta")
    cu = [0]
    for n in q_lens:
        cu.append(cu[-1] + n)
    N = cu[-1] + 1
    kv = [a + b for a, b in zip(q_lens, lens)]
    q, k = torch.empty(1, 4, N, 8, device=meta), torch.empty(3, 2, 10, 8, device=meta)
    p = SdpaPlan(cu, kv, N, meta, check_finite=False)
    assert p.run(q, k, k, 0.3).device == meta
    cut, kvt = (torch.tensor(x, dtype=torch.int32, device=meta) for x in (cu, kv))
    out = padded_as_packed(reference.ragged_attention, max(q_lens))(q, k, k, cut, kvt, 0.3)
    assert out.device == meta


@pytest.mark.parametrize("draft", ["ngram", "model"])
def test_the_engine_plans_each_eager_pass_once_and_never_reads_lengths_per_layer(
    monkeypatch, draft
):
    calls = {"plans": 0, "op": 0}
    real_plan = plan.PackedPlan.__init__

    def counting_plan(self, *a, **kw):
        calls["plans"] += 1
        real_plan(self, *a, **kw)

    def no_op(*a, **kw):  # the op's per-call host read of the lengths
        calls["op"] += 1
        raise AssertionError("an eager engine pass called the op instead of its plan")

    monkeypatch.setattr(plan.PackedPlan, "__init__", counting_plan)
    monkeypatch.setattr(packed, "sdpa_attention_packed", no_op)
    main = tiny_lm(seed=3, layers=3)
    d = perturbed(main) if draft == "model" else "ngram"
    gen = bass.Generator(main, d, policy="constant", policy_options={"k": 3})
    res = gen.generate([[1, 2, 3, 1, 2], [4, 5], [6]], max_new_tokens=8)
    assert calls["op"] == 0
    assert calls["plans"] == res.stats.main_passes + res.stats.draft_passes


def test_worked_example_of_the_plan_docstring():
    case = EDGE["worked_example"]
    args = case.tensors(torch.float64)
    p = planned(case, args, "auto", cache_lens=[4, 4, 0])
    assert p.kv_lens == [7, 4, 2] and p.slots.tolist() == [4, 5, 6, 0, 1]
