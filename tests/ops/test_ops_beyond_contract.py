"""Logit soft-capping (Gemma 2) and attention sinks (gpt-oss): not in the ops' contract,
computed by :func:`bass.ops.reference.attention` when bass's attention function gets them
(tests/engine/test_families.py runs the models). Checked here against a naive float64
loop over rows, heads and queries written for this file."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from profiles import examples

from bass.ops import reference
from bass.testing import strategies


def naive(q, k, v, cu, kv_lens, scale, softcap, sinks):
    q, k, v = (t.double() for t in (q, k, v))
    _, Hq, N, D = q.shape
    G = Hq // k.shape[1]
    out = torch.zeros(1, Hq, N, D, dtype=torch.float64)
    cu, kv_lens = cu.tolist(), kv_lens.tolist()
    for b in range(len(kv_lens)):
        q_len = cu[b + 1] - cu[b]
        for i in range(q_len):
            pos = kv_lens[b] - q_len + i  # sees keys 0..pos
            for h in range(Hq):
                s = k[b, h // G, : pos + 1] @ q[0, h, cu[b] + i] * scale
                if softcap is not None:
                    s = softcap * torch.tanh(s / softcap)
                if sinks is not None:
                    s = torch.cat([s, sinks[h : h + 1].double()])
                w = torch.softmax(s, dim=0)[: pos + 1]
                out[0, h, cu[b] + i] = w @ v[b, h // G, : pos + 1]
    return out


@settings(max_examples=examples(60), deadline=None)
@given(
    case=strategies.packed_attention_inputs(),
    softcap=st.none() | st.floats(0.05, 50.0),
    sink_scale=st.none() | st.floats(0.0, 8.0),
    seed=st.integers(0, 2**16),
)
def test_soft_capping_and_sinks_match_a_naive_loop(case, softcap, sink_scale, seed):
    q, k, v, cu, kv_lens, scale = case
    q = q * 6.0  # scores large enough for a cap to bend them
    Hq = q.shape[1]
    g = torch.Generator().manual_seed(seed)
    sinks = None if sink_scale is None else torch.randn(Hq, generator=g) * sink_scale
    got = reference.attention(q, k, v, cu[:-1], cu.diff(), kv_lens, scale, softcap, sinks)
    want = naive(q, k, v, cu, kv_lens, scale, softcap, sinks)
    torch.testing.assert_close(got.double(), want, rtol=1e-10, atol=1e-12)


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
    assert (plain - capped).abs().max() > 1e-2
    assert (plain - sunk).abs().max() > 1e-2
