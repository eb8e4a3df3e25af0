"""Keyed sampling (bass.sampling.position_keys, sample_keyed; drafts kept while they
equal the keyed draws): the draws of
every sampled token (plain decoding, n-gram and coupled draft-model verification), keyed by
(seed, row, position); sample_keyed against a plain-Python reference of its block race."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from bass import sampling
from bass.sampling import (
    greedy_accept_ids,
    position_keys,
    sample_keyed,
)

pytest.importorskip("scipy.stats")  # test_sampling's chi-square helper needs it
from test_sampling import HYP, N, assert_fits, gen, greedy_cases, output_tokens


def keys_for(rows, width: int = 1, seed: int = 0, start: int = 0) -> torch.Tensor:
    rows = list(rows)
    return torch.tensor(position_keys(seed, rows, [start] * len(rows), width)).view(-1, width)


def test_position_keys_are_53_bit_deterministic_and_distinct():
    a = position_keys(3, [0, 1, 2], [0, 5, 9], 4)
    assert a == position_keys(3, [0, 1, 2], [0, 5, 9], 4) and len(a) == 12
    assert all(isinstance(x, int) and 0 <= x < 2**53 for x in a)
    # row-major: row 1's positions 5..8 are the same keys whoever else is in the batch
    assert a[4:8] == position_keys(3, [1], [5], 4) == position_keys(3, [7, 1], [0, 5], 4)[4:]
    grid = position_keys(0, range(64), [0] * 64, 64) + position_keys(1, range(64), [0] * 64, 64)
    assert len(set(grid)) == len(grid)  # seeds, rows and positions all matter
    assert position_keys(2**64 + 5, [0], [0], 3) == position_keys(5, [0], [0], 3)
    assert position_keys(0, [], [], 4) == []


def test_sample_keyed_distribution_and_shape():
    p = torch.tensor([0.1, 0.0, 0.25, 0.15, 0.5])
    tok = sample_keyed(p.expand(N, 5), keys_for(range(N)).view(N))
    assert tok.dtype == torch.int64 and tok.shape == (N,)
    assert_fits(torch.bincount(tok, minlength=5).numpy(), p.double().numpy())
    # unnormalised weights and a leading batch dimension
    w = torch.tensor([[[2.0, 0.0, 6.0]]]).expand(2, N // 2, 3)
    tok = sample_keyed(w, keys_for(range(N), seed=1).view(2, N // 2))
    assert tok.shape == (2, N // 2)
    assert_fits(torch.bincount(tok.view(-1), minlength=3).numpy(), np.array([0.25, 0.0, 0.75]))
    with pytest.raises(ValueError, match="keys must be"):
        sample_keyed(p.expand(3, 5), keys_for(range(2)).view(2))


@HYP
@given(
    hnp.arrays(
        np.float32, st.integers(1, 40), elements=st.sampled_from([0.0, 1e-30, 1e-7, 0.3, 1.0])
    ),
    st.lists(
        st.sampled_from([0, 1, 2**52, 2**53 - 2, 2**53 - 1]) | st.integers(0, 2**53 - 1),
        min_size=1,
        max_size=8,
    ),
    st.sampled_from([torch.float32, torch.float64]),
)
def test_sample_keyed_never_picks_a_zero_weight(weights, keys, dtype):
    weights[np.argmax(weights)] += 1e-3  # at least one positive weight
    probs = torch.from_numpy(weights).to(dtype).expand(len(keys), -1)
    tok = sample_keyed(probs, torch.tensor(keys))
    assert ((tok >= 0) & (tok < len(weights))).all()
    assert (probs.gather(1, tok[:, None]) > 0).all()
    assert tok.tolist() == [_reference_draw(probs[0].double().numpy(), k) for k in keys]


def _splitmix(key: int, count: int) -> list[int]:
    """Outputs 1..count of splitmix64 seeded with ``key`` (Python ints, mod 2**64)."""
    out, m = [], 2**64 - 1
    for i in range(1, count + 1):
        z = (key + i * 0x9E3779B97F4A7C15) & m
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
        out.append(z ^ (z >> 31))
    return out


def _reference_draw(weights: np.ndarray, key: int) -> int:
    """sample_keyed's contract, one row, in plain Python: the block race (one exponential
    per block of BLOCK tokens from the key's stream), then inverse CDF in the winner."""
    B = sampling.BLOCK
    C = -(-len(weights) // B)
    w = np.zeros(C * B)
    w[: len(weights)] = weights
    mass = w.reshape(C, B).sum(axis=1)
    u = [(z >> 12) * 2.0**-52 + 2.0**-53 for z in _splitmix(key, C + 1)]
    c = int(np.argmax(mass / -np.log(u[:C])))
    cdf = np.cumsum(w[c * B : (c + 1) * B])
    x = min(u[C] * cdf[-1], np.nextafter(cdf[-1], 0))
    return c * B + int(np.searchsorted(cdf, x, side="right"))


@HYP
@given(
    hnp.arrays(
        np.float64,
        st.integers(1, 300),
        elements=st.floats(0, 1) | st.just(0.0),
    ),
    st.lists(st.integers(0, 2**53 - 1), min_size=1, max_size=6),
)
def test_sample_keyed_is_its_contract_over_many_blocks(weights, keys):
    """Vocabularies of 1-300 tokens (several blocks, the last one partial) with zeros:
    every draw is the plain-Python reference's."""
    weights[np.argmax(weights)] += 1e-3
    probs = torch.from_numpy(weights).expand(len(keys), -1)
    got = sample_keyed(probs, torch.tensor(keys)).tolist()
    assert got == [_reference_draw(weights, k) for k in keys]


def test_sample_keyed_fits_a_distribution_over_many_blocks():
    V = 3 * sampling.BLOCK + 5
    p = torch.rand(V, generator=torch.Generator().manual_seed(0)) ** 4
    p[::7] = 0.0
    p = p / p.sum()
    tok = sample_keyed(p.expand(N, V), keys_for(range(N), seed=3).view(N))
    assert_fits(torch.bincount(tok, minlength=V).numpy(), p.double().numpy())


def keyed_accept(drafts, p, lens, keys):
    """Keyed verification as the engine composes it (bass.verify): drafts kept while they
    equal the main model's keyed draws."""
    return greedy_accept_ids(drafts, sample_keyed(p, keys), lens)


@HYP
@given(greedy_cases(), st.integers(0, 2**31))
def test_keyed_verification_commits_the_keyed_draws(case, seed):
    drafts, logits, lens = case
    p = torch.softmax(logits.double(), dim=-1)
    b, k1 = p.shape[:2]
    keys = keys_for(range(b), k1, seed=seed)
    acc = keyed_accept(drafts, p, lens, keys)
    # the committed tokens are the keyed draws, whatever was drafted: no drafts, same draws
    none = keyed_accept(drafts, p, torch.zeros_like(lens), keys)
    assert torch.equal(none.next_tokens, sample_keyed(p[:, 0], keys[:, 0]))
    for r, seq in enumerate(output_tokens(drafts, acc)):
        assert seq == sample_keyed(p[r, : len(seq)], keys[r, : len(seq)]).tolist()


def test_keyed_verification_distribution_with_one_hot_drafts():
    """Deterministic drafts d_1, d_2, d_3: the accepted count follows P(acc = j) =
    p_0(d_1)..p_{j-1}(d_j) (1 - p_j(d_{j+1})), and the emitted token after j accepted
    drafts is p_j given it is not d_{j+1} (p_j itself at the bonus position)."""
    g = gen(5)
    v, k = 6, 3
    p = torch.softmax(torch.randn(k + 1, v, generator=g, dtype=torch.float64) * 1.5, dim=-1)
    d = torch.tensor([int(p[i].argmax()) if i != 1 else int(p[i].argmin()) for i in range(k)])
    acc = keyed_accept(
        d.expand(N, k),
        p.expand(N, k + 1, v),
        torch.full((N,), k),
        keys_for(range(N), k + 1, seed=9),
    )
    pd = p[torch.arange(k), d].numpy()
    expect = [np.prod(pd[:j]) * (1 - pd[j]) for j in range(k)] + [np.prod(pd)]
    assert_fits(torch.bincount(acc.accepted, minlength=k + 1).numpy(), np.array(expect))
    for j in range(k + 1):
        got = torch.bincount(acc.next_tokens[acc.accepted == j], minlength=v).numpy()
        want = p[j].numpy().copy()
        if j < k:
            want[d[j]] = 0.0
        assert_fits(got, want)
