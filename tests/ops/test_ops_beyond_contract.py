"""Logit soft-capping (Gemma 2), attention sinks (gpt-oss) and sliding windows: not in the
ops' contract, computed by :func:`bass.ops.reference.attention` (all three) and
:func:`bass.ops.flex.run` (the cap and the window, as a ``score_mod``) when bass's attention
function gets them (tests/engine/test_families.py and test_sliding_window.py run the
models). Checked here against a naive float64 loop over rows, heads and queries written for
this file."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from profiles import examples
from test_ops_flex import EDGES, FlexCase, flex_cases
from test_ops_reference import KERNEL_TOLERANCES

from bass.ops import flex, plan, reference
from bass.testing import strategies


def naive(q, k, v, cu, kv_lens, scale, softcap, sinks, window=None):
    q, k, v = (t.double() for t in (q, k, v))
    _, Hq, N, D = q.shape
    G = Hq // k.shape[1]
    out = torch.zeros(1, Hq, N, D, dtype=torch.float64)
    cu, kv_lens = cu.tolist(), kv_lens.tolist()
    for b in range(len(kv_lens)):
        q_len = cu[b + 1] - cu[b]
        for i in range(q_len):
            pos = kv_lens[b] - q_len + i  # sees keys 0..pos (the window's last ones)
            lo = 0 if window is None else max(0, pos - window + 1)
            for h in range(Hq):
                s = k[b, h // G, lo : pos + 1] @ q[0, h, cu[b] + i] * scale
                if softcap is not None:
                    s = softcap * torch.tanh(s / softcap)
                if sinks is not None:
                    s = torch.cat([s, sinks[h : h + 1].double()])
                w = torch.softmax(s, dim=0)[: pos + 1 - lo]
                out[0, h, cu[b] + i] = w @ v[b, h // G, lo : pos + 1]
    return out


@settings(max_examples=examples(60), deadline=None)
@given(
    case=strategies.packed_attention_inputs(),
    softcap=st.none() | st.floats(0.05, 50.0),
    sink_scale=st.none() | st.floats(0.0, 8.0),
    window=st.none() | st.integers(1, 40),
    seed=st.integers(0, 2**16),
)
def test_soft_capping_sinks_and_windows_match_a_naive_loop(case, softcap, sink_scale, window, seed):
    q, k, v, cu, kv_lens, scale = case
    q = q * 6.0  # scores large enough for a cap to bend them
    Hq = q.shape[1]
    g = torch.Generator().manual_seed(seed)
    sinks = None if sink_scale is None else torch.randn(Hq, generator=g) * sink_scale
    got = reference.attention(q, k, v, cu[:-1], cu.diff(), kv_lens, scale, softcap, sinks, window)
    want = naive(q, k, v, cu, kv_lens, scale, softcap, sinks, window)
    torch.testing.assert_close(got.double(), want, rtol=1e-10, atol=1e-12)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
@pytest.mark.parametrize("kind", ["eager", "compiled"])
@pytest.mark.parametrize("geometry", [(4, 2, 256), (8, 2, 128)], ids=["gemma2-2b", "gemma2-27b"])
def test_flex_soft_capping_at_gemma2_head_dims_on_cuda(geometry, kind):
    """Gemma 2's head dims (256; 128 for 27B), bfloat16, which `auto` would run on CUDA
    once this passes there (bass.hf.pass_impl keeps CUDA on the reference until then)."""
    case = FlexCase(geometry, S=300, q_lens=(5, 1, 8, 0), kv_lens=(300, 40, 129, 3), pad=2)
    test_flex_soft_capping_matches_a_naive_loop.hypothesis.inner_test(
        case, kind, torch.bfloat16, "cuda"
    )


def test_a_cap_and_sinks_change_the_output():
    """The properties above would hold for an implementation that ignored both only if
    they changed nothing: they do."""
    q, k, v = (
        torch.randn(*s, dtype=torch.float64) * 3 for s in [(1, 4, 5, 8), (2, 2, 6, 8), (2, 2, 6, 8)]
    )
    cu, kv = torch.tensor([0, 2, 5], dtype=torch.int32), torch.tensor([4, 6], dtype=torch.int32)
    plain = reference.attention(q, k, v, cu[:-1], cu.diff(), kv, 0.35)
    capped = reference.attention(q, k, v, cu[:-1], cu.diff(), kv, 0.35, softcap=1.0)
    sunk = reference.attention(q, k, v, cu[:-1], cu.diff(), kv, 0.35, sinks=torch.ones(4))
    slid = reference.attention(q, k, v, cu[:-1], cu.diff(), kv, 0.35, window=2)
    assert (plain - capped).abs().max() > 1e-2
    assert (plain - sunk).abs().max() > 1e-2
    assert (plain - slid).abs().max() > 1e-2


@torch.compile(fullgraph=True, dynamic=True)
def compiled_flex(p, q, k, v, scale: float):
    return flex.run(p.state, q, k, v, scale, 2.5)  # the cap a constant, as a model's config


CUDA = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")]


@pytest.mark.parametrize(
    ("kind", "dtype", "device"),
    [
        ("eager", torch.float32, "cpu"),
        ("compiled", torch.bfloat16, "cpu"),
        *(pytest.param(kind, torch.bfloat16, "cuda", marks=CUDA) for kind in ("eager", "compiled")),
    ],
    ids=str,
)
@settings(max_examples=examples(3), deadline=None)
@given(case=st.sampled_from(EDGES) | flex_cases())
def test_flex_soft_capping_matches_a_naive_loop(case, kind, dtype, device):
    """flex with the cap as a score_mod (what Gemma 2's passes run where ``attention`` is
    ``auto`` or ``flex``), eager and traced into a compiled graph (the cap the plan's
    tensor there), float32 and bfloat16; never the reference."""
    flex_against_naive(case, kind, dtype, device, 2.5, None, compiled_flex)


def flex_against_naive(case, kind, dtype, device, cap, window, compiled):
    """flex alone (eager, or ``compiled``) with ``cap`` and ``window`` against the naive
    loop; where they show in the naive output, flex's differs from it without them."""
    args = case.tensors(dtype)
    q, k, v, cu, kv, scale = (a.to(device) if isinstance(a, torch.Tensor) else a for a in args)
    q = q * 6.0 if cap else q  # scores large enough for a cap to bend them
    lens = kv - cu.diff()
    p = plan.Plan.for_pass("flex", list(case.q_lens), lens.tolist(), case.N, cu, lens, kv,
                           case.S, kind, softcap=cap, window=window)  # fmt: skip
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(reference, "attention", None)  # flex alone
        if kind == "eager":
            got = flex.run(p.state, q, k, v, scale, cap, window)
        else:
            with torch._dynamo.config.patch(recompile_limit=64):
                got = compiled(p, q, k, v, scale)
    assert got.shape == q.shape and got.dtype == dtype
    q, k, v, cu, kv, got = (t.cpu() for t in (q, k, v, cu, kv, got))
    want = naive(q, k, v, cu, kv, scale, cap, None, window)
    rtol, atol = KERNEL_TOLERANCES[dtype]
    torch.testing.assert_close(got.double(), want, rtol=rtol, atol=atol * 3)
    # without what is checked (the window where one is, else the cap): not ignored
    without = naive(q, k, v, cu, kv, scale, None if window is None else cap, None)
    if sum(case.q_lens) and (want - without).abs().max() > 0.1:
        assert (got.double() - without).abs().max() > 0.05


@torch.compile(fullgraph=True, dynamic=True)
def compiled_flex_window(p, q, k, v, scale: float):
    return flex.run(p.state, q, k, v, scale, None, 3)  # the window a constant, as a layer's


@pytest.mark.parametrize(
    ("kind", "dtype", "device"),
    [
        ("eager", torch.float32, "cpu"),
        ("compiled", torch.float32, "cpu"),
        *(pytest.param(kind, torch.bfloat16, "cuda", marks=CUDA) for kind in ("eager", "compiled")),
    ],
    ids=str,
)
@settings(max_examples=examples(3), deadline=None)
@given(case=st.sampled_from(EDGES) | flex_cases())
def test_flex_windows_match_a_naive_loop(case, kind, dtype, device):
    """flex with a sliding window of 3 as a score_mod (what Mistral's and Gemma 3's passes
    run past their window where ``attention`` is ``auto`` on a CPU, or ``flex``), eager with
    a soft-cap too (Gemma 2's), and traced into a compiled graph (the window the plan's
    tensor there); never the reference."""
    cap = 3.0 if kind == "eager" else None  # a cap of 3.0 beside a window of 3 (flex._scalar)
    flex_against_naive(case, kind, dtype, device, cap, 3, compiled_flex_window)


def test_a_cap_and_a_window_of_equal_value_stay_apart():
    """flex's kernel inputs: the cap float32, the window int32, even where they are equal."""
    dev = torch.device("cpu")
    assert flex._scalar(4.0, dev).dtype == torch.float32
    assert flex._scalar(4, dev).dtype == torch.int32
