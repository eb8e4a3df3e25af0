"""Tests for bass.sampling: warping, sampling, greedy and lossless speculative acceptance.

Statistical design. Losslessness is established twice:

* exactly, by enumerating every draft sequence and acceptance event of the rejection
  procedure over a tiny vocabulary in float64 (no randomness, no tolerance beyond
  rounding) -- this proves the *procedure* lossless on a context-free toy model (p_i and
  q_i do not depend on the prefix, so emitted tokens must be independent with position i
  following p_i);
* empirically, by running the *implementation* on N = 200,000 rows and comparing counts
  with chi-square goodness-of-fit tests at ALPHA = 1e-4 each. Seeds are fixed, so every
  run draws the same numbers and the tests are deterministic: a correct implementation
  would fail one such test for only 1 in 10,000 seeds. The same tests are shown to have
  power: emulated broken samplers (always accept; correction drawn from p instead of the
  residual; bonus drawn from the wrong position) are rejected at the same ALPHA.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from bass.sampling import (
    Acceptance,
    SamplingParams,
    greedy_accept_ids,
    sample,
    speculative_accept,
    warp_probs,
)

# scipy is in the test dependency group; a machine without it (the GPU machine) skips this
# module instead of failing the collection of every test, `pytest -m gpu` included
stats = pytest.importorskip("scipy.stats")

ALPHA = 1e-4  # false-alarm rate of each chi-square test (for a random seed)
N = 200_000  # rows per empirical test
HYP = settings(max_examples=60, deadline=None)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# --------------------------------------------------------------------------- SamplingParams


@pytest.mark.parametrize(
    ("kwargs", "option"),
    [
        ({"temperature": 0.0}, "temperature"),
        ({"temperature": -1.0}, "temperature"),
        ({"temperature": math.nan}, "temperature"),
        ({"temperature": "1"}, "temperature"),
        ({"top_k": 0}, "top_k"),
        ({"top_k": True}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"min_p": -0.1}, "min_p"),
        ({"min_p": 1.5}, "min_p"),
    ],
)
def test_sampling_settings_are_checked_where_a_user_gives_them(kwargs, option):
    """SamplingParams carries checked values; the public edges check them (the same
    declarations as generate()'s: bass.options)."""
    from models import tiny_lm

    from bass.testing import exact_distribution

    with pytest.raises(ValueError, match=rf"exact_distribution\(\): {option}="):
        exact_distribution(tiny_lm(vocab=4), [1], 1, **kwargs)


# --------------------------------------------------------------------------- warp_probs

logit_arrays = st.tuples(st.integers(1, 4), st.integers(1, 12)).flatmap(
    lambda s: hnp.arrays(np.float64, s, elements=st.floats(-10, 10))
)


@HYP
@given(logit_arrays, st.floats(0.05, 5.0))
def test_warp_temperature_is_softmax(logits, t):
    x = torch.from_numpy(logits)
    probs = warp_probs(x.float(), SamplingParams(do_sample=True, temperature=t))
    assert probs.dtype == torch.float32
    torch.testing.assert_close(probs, torch.softmax(x / t, -1).float())
    torch.testing.assert_close(probs.sum(-1), torch.ones(x.shape[0]))


@HYP
@given(logit_arrays, st.integers(1, 15))
def test_warp_top_k(logits, k):
    x = torch.from_numpy(logits)
    probs = warp_probs(x, SamplingParams(do_sample=True, top_k=k))
    kept = probs > 0
    v = x.shape[-1]
    kth = torch.sort(x, -1, descending=True).values[:, min(k, v) - 1 : min(k, v)]
    assert torch.equal(kept, x >= kth)  # exactly k kept, plus any ties with the k-th
    if len(set(logits.ravel().tolist())) == logits.size:
        assert (kept.sum(-1) == min(k, v)).all()
    expected = torch.softmax(x.masked_fill(~kept, -math.inf), -1)
    torch.testing.assert_close(probs, expected)


@HYP
@given(logit_arrays, st.floats(1e-6, 1.0), st.sampled_from([torch.float64, torch.float32]))
def test_warp_top_p_minimal_nucleus(logits, top_p, dtype):
    x = torch.from_numpy(logits)
    probs = warp_probs(x.to(dtype), SamplingParams(do_sample=True, top_p=top_p))
    assert probs.dtype == dtype
    tol = 1e-9 if dtype == torch.float64 else 1e-5
    base = torch.softmax(x, -1)
    for row, out in zip(base, probs, strict=True):
        kept = out > 0
        mass, smallest = row[kept].sum().item(), row[kept].min().item()
        assert smallest >= row[~kept].numpy().max(initial=0.0) - tol  # the most likely
        assert mass >= top_p - tol  # enough mass ...
        assert mass - smallest < top_p + tol  # ... and no token to spare
        torch.testing.assert_close(out, (row * kept / mass).to(dtype))


def test_warp_order_is_temperature_top_k_top_p():
    logits = torch.tensor([0.5, 0.3, 0.2]).log()
    # top_k=2 renormalizes to [0.625, 0.375] before the nucleus: 0.625 >= 0.6 suffices.
    probs = warp_probs(logits, SamplingParams(do_sample=True, top_k=2, top_p=0.6))
    torch.testing.assert_close(probs, torch.tensor([1.0, 0.0, 0.0]))
    # Without top_k, 0.5 < 0.6, so the nucleus needs two tokens.
    probs = warp_probs(logits, SamplingParams(do_sample=True, top_p=0.6))
    torch.testing.assert_close(probs, torch.tensor([0.625, 0.375, 0.0]))
    # Temperature comes first: T=0.5 squares the odds to [25, 9, 4] / 38.
    probs = warp_probs(logits, SamplingParams(do_sample=True, temperature=0.5, top_p=0.6))
    torch.testing.assert_close(probs, torch.tensor([1.0, 0.0, 0.0]))
    # Boundary: mass exactly top_p is enough (these probabilities are exact in binary);
    # of the tied pair, the one transformers' warper keeps (test_warp_matches_transformers)
    logits = torch.tensor([0.5, 0.25, 0.25]).log()
    probs = warp_probs(logits, SamplingParams(do_sample=True, top_p=0.75))
    torch.testing.assert_close(probs, torch.tensor([2 / 3, 0.0, 1 / 3]))


def test_warp_dtypes_shapes_and_noops():
    x = torch.randn(2, 3, 7, generator=gen(0))
    plain = torch.softmax(x, -1)
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        assert warp_probs(x.to(dtype), SamplingParams()).dtype == torch.float32
    assert warp_probs(x.double(), SamplingParams()).dtype == torch.float64
    noop = SamplingParams(do_sample=True, top_k=7, top_p=1.0)
    torch.testing.assert_close(warp_probs(x, noop), plain)
    with pytest.raises(TypeError, match="floating"):
        warp_probs(torch.ones(3, dtype=torch.int64), SamplingParams())
    with pytest.raises(ValueError, match="temperature > 0"):
        warp_probs(x, SamplingParams(temperature=0.0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize(
    ("temperature", "top_p"), [(1e-300, None), (5e-324, None), (1e-46, None), (1.0, 1e-46)]
)
def test_warp_values_that_round_to_zero_give_the_one_hot_limit(dtype, temperature, top_p):
    """A temperature or top_p > 0 that rounds to 0 in the logits' dtype is the limit of
    the warping (the argmax, one-hot), not 0 / 0 (NaN) nor every token dropped."""
    x = torch.randn(4, 11, generator=gen(1)).to(dtype)
    probs = warp_probs(x, SamplingParams(do_sample=True, temperature=temperature, top_p=top_p))
    one_hot = torch.nn.functional.one_hot(x.float().argmax(-1), 11).to(probs.dtype)
    torch.testing.assert_close(probs, one_hot)


# --------------------------------------------------------------------------- sample


def test_sample_shape_determinism_and_distribution():
    probs = torch.tensor([[0.2, 0.0, 0.8], [0.0, 1.0, 0.0]])
    tok = sample(probs, gen(1))
    assert tok.dtype == torch.int64 and tok.shape == (2,) and tok[1] == 1
    assert torch.equal(tok, sample(probs, gen(1)))
    p = torch.tensor([0.1, 0.0, 0.25, 0.15, 0.5])
    counts = torch.bincount(sample(p.expand(N, 5), gen(2)), minlength=5)
    assert_fits(counts.numpy(), p.double().numpy())


# --------------------------------------------------------------------------- greedy


def greedy_accept(drafts, logits, lens):
    """Greedy verification as the engine composes it: drafts against the argmax."""
    return greedy_accept_ids(drafts, logits.argmax(dim=-1), lens)


def output_tokens(drafts, acc):
    """Each row's committed tokens: its accepted drafts, then the next token."""
    return [[*d[:n], t] for d, n, t in zip(drafts.tolist(), acc.accepted.tolist(),
                                           acc.next_tokens.tolist(), strict=True)]  # fmt: skip


@st.composite
def greedy_cases(draw):
    b, k, v = draw(st.integers(1, 5)), draw(st.integers(0, 5)), draw(st.integers(2, 7))
    seed = draw(st.integers(0, 2**31))
    logits = torch.randn(b, k + 1, v, generator=gen(seed))
    best = logits.argmax(-1)
    lens = torch.tensor(draw(st.lists(st.integers(0, k), min_size=b, max_size=b)))
    drafts = torch.randint(-3, v + 3, (b, k), generator=gen(seed + 1))  # garbage padding
    for r in range(b):
        m = draw(st.integers(0, int(lens[r])))  # matching prefix, then a random token
        drafts[r, :m] = best[r, :m]
        drafts[r, m : int(lens[r])] = torch.randint(0, v, (int(lens[r]) - m,))
    return drafts, logits, lens.to(draw(st.sampled_from([torch.int32, torch.int64])))


@HYP
@given(greedy_cases())
def test_greedy_accept_matches_naive_loop(case):
    drafts, logits, lens = case
    acc = greedy_accept(drafts, logits, lens)
    assert acc.accepted.dtype == acc.next_tokens.dtype == torch.int64
    for r in range(drafts.shape[0]):
        n = 0
        while n < lens[r] and drafts[r, n] == logits[r, n].argmax():
            n += 1
        assert acc.accepted[r] == n
        assert acc.next_tokens[r] == logits[r, n].argmax()
        expected = [*drafts[r, :n].tolist(), int(logits[r, n].argmax())]
        assert output_tokens(drafts, acc)[r] == expected


@HYP
@given(greedy_cases(), st.integers(0, 2**31))
def test_speculative_with_one_hot_distributions_is_greedy(case, seed):
    drafts, logits, lens = case
    b, k = drafts.shape
    v = logits.shape[-1]
    p = torch.nn.functional.one_hot(logits.argmax(-1), v).float()
    q = torch.nn.functional.one_hot(drafts.clamp(0, v - 1), v).float().reshape(b, k, v)
    got, want = (
        speculative_accept(drafts, q, p, lens, gen(seed)),
        greedy_accept(drafts, logits, lens),
    )
    assert torch.equal(got.accepted, want.accepted)
    assert torch.equal(got.next_tokens, want.next_tokens)


def test_draft_lens_zero_is_plain_decoding():
    logits = torch.randn(N, 4, 5, generator=gen(3))
    lens = torch.zeros(N, dtype=torch.int32)
    drafts = torch.full((N, 3), -1)
    acc = greedy_accept(drafts[:64], logits[:64], lens[:64])
    assert (acc.accepted == 0).all() and torch.equal(acc.next_tokens, logits[:64, 0].argmax(-1))
    p0 = torch.tensor([0.3, 0.0, 0.1, 0.4, 0.2])
    p = p0.expand(N, 4, 5)
    acc = speculative_accept(drafts, torch.rand(N, 3, 5, generator=gen(4)), p, lens, gen(5))
    assert (acc.accepted == 0).all()
    assert_fits(torch.bincount(acc.next_tokens, minlength=5).numpy(), p0.double().numpy())


# --------------------------------------------------------------------------- exact losslessness


def exact_output_dist(p: np.ndarray, q: np.ndarray, n: int) -> dict[tuple[int, ...], float]:
    """Distribution of the output tokens of one rejection-sampling step, by enumeration.

    ``p`` [K+1, V], ``q`` [K, V] (float64, context-free), ``n`` drafts. Enumerates every
    draft sequence d (probability prod q_i(d_i)) and every stopping point: drafts before
    i accepted (each with probability min(1, p/q)), d_i rejected, correction from
    normalize(max(0, p_i - q_i)); or all n accepted and the bonus from p_n.
    """
    v = p.shape[1]
    dist: dict[tuple[int, ...], float] = defaultdict(float)
    for d in itertools.product(range(v), repeat=n):
        w = math.prod(q[i, d[i]] for i in range(n))
        if w == 0:
            continue
        for i in range(n):
            accept = min(1.0, p[i, d[i]] / q[i, d[i]])
            if accept < 1:
                residual = np.maximum(p[i] - q[i], 0)
                for t in range(v):
                    dist[(*d[:i], t)] += w * (1 - accept) * residual[t] / residual.sum()
            w *= accept
        for t in range(v):
            dist[(*d, t)] += w * p[n, t]
    return dict(dist)


def completed(dist: dict[tuple[int, ...], float], p: np.ndarray, m: int) -> np.ndarray:
    """Distribution of the first m tokens when a short output is continued by sampling
    from p (plain decoding): a [V]*m array."""
    v = p.shape[1]
    out = np.zeros((v,) * m)
    for seq, w in dist.items():
        head = seq[:m]
        for tail in itertools.product(range(v), repeat=m - len(head)):
            out[head + tail] += w * math.prod(p[len(head) + j, t] for j, t in enumerate(tail))
    return out


def product_of(p: np.ndarray, m: int) -> np.ndarray:
    out = np.ones(())
    for i in range(m):
        out = np.multiply.outer(out, p[i])
    return out


def random_dist(draw, rows: int, v: int) -> np.ndarray:
    w = np.array(
        draw(
            st.lists(
                st.one_of(st.just(0.0), st.floats(1e-3, 1.0)), min_size=rows * v, max_size=rows * v
            )
        )
    ).reshape(rows, v)
    w[w.sum(1) == 0, 0] = 1.0
    return w / w.sum(1, keepdims=True)


@st.composite
def toy_models(draw):
    v, k = draw(st.integers(2, 5)), draw(st.integers(1, 3))
    p, q = random_dist(draw, k + 1, v), random_dist(draw, k, v)
    if draw(st.booleans()):
        q = np.where(draw(st.booleans()), p[:k], q)  # include perfect drafts
    return p, q, draw(st.integers(0, k))


@settings(max_examples=150, deadline=None)
@given(toy_models())
def test_rejection_procedure_is_lossless_exactly(model):
    p, q, n = model
    dist = exact_output_dist(p, q, n)
    assert math.isclose(sum(dist.values()), 1.0, rel_tol=1e-12)
    assert all(1 <= len(s) <= n + 1 for s in dist)
    # The first output token follows p_0 exactly.
    first = np.zeros(p.shape[1])
    for seq, w in dist.items():
        first[seq[0]] += w
    np.testing.assert_allclose(first, p[0], atol=1e-12)
    # Continued by plain decoding, every prefix of the output follows p_0 x .. x p_m.
    for m in range(1, n + 2):
        np.testing.assert_allclose(completed(dist, p, m), product_of(p, m), atol=1e-12)
    # Stronger: given that output position j exists (d_1..d_j accepted) and any prefix,
    # token j follows p_j; emitted tokens are independent across positions.
    for j in range(1, n + 1):
        joint: dict[tuple[int, ...], np.ndarray] = defaultdict(lambda: np.zeros(p.shape[1]))
        for seq, w in dist.items():
            if len(seq) > j:
                joint[seq[:j]][seq[j]] += w
        for row in joint.values():
            np.testing.assert_allclose(row, row.sum() * p[j], atol=1e-12)


# --------------------------------------------------------------------------- empirical losslessness

# A fixed context-free toy model, V = 4, K = 3, chosen so that every branch matters:
# q_0 misses token 3 (only the residual can emit it), p_1 forbids token 1 (always
# rejected), and acceptance rates are 0.7, 0.5 and 0.6.
P = torch.tensor(
    [[0.1, 0.4, 0.3, 0.2], [0.25, 0.0, 0.5, 0.25], [0.3, 0.3, 0.2, 0.2], [0.4, 0.1, 0.1, 0.4]],
    dtype=torch.float64,
)
Q = torch.tensor(
    [[0.4, 0.3, 0.3, 0.0], [0.1, 0.5, 0.2, 0.2], [0.3, 0.1, 0.1, 0.5]], dtype=torch.float64
)


def assert_fits(observed: np.ndarray, expected_probs: np.ndarray, *, fits: bool = True) -> None:
    """Chi-square goodness of fit at ALPHA; cells expecting < 5 counts are pooled.

    A count in a cell of probability 0 is an immediate misfit.
    """
    observed, expected = observed.ravel().astype(np.float64), expected_probs.ravel()
    impossible = observed[expected == 0].sum() > 0
    expected = expected / expected.sum() * observed.sum()
    small = expected < 5
    obs = np.append(observed[~small], observed[small].sum())
    exp = np.append(expected[~small], expected[small].sum())
    keep = exp > 0
    if impossible:
        pvalue = 0.0
    elif keep.sum() > 1:
        pvalue = stats.chisquare(obs[keep], exp[keep]).pvalue
    else:
        pvalue = 1.0
    ok = not impossible and pvalue >= ALPHA
    assert ok == fits, f"p-value {pvalue:.3g}, impossible outcomes: {impossible}"


def run_toy(seed: int, lens: torch.Tensor | None = None):
    """Drafts sampled from Q with `sample`, verified by speculative_accept, N rows."""
    g = gen(seed)
    k, v = Q.shape
    lens = torch.full((N,), k) if lens is None else lens
    drafts = torch.stack([sample(Q[i].expand(N, v), g) for i in range(k)], 1)
    drafts = torch.where(torch.arange(k) < lens[:, None], drafts, -7)
    acc = speculative_accept(drafts, Q.expand(N, k, v), P.expand(N, k + 1, v), lens, g)
    return drafts, acc, lens, g


def output_at(drafts: torch.Tensor, acc: Acceptance, j: int) -> torch.Tensor:
    """Output token j of each row ([N]); -1 where the output is shorter."""
    tok = torch.where(acc.accepted > j, drafts[:, min(j, drafts.shape[1] - 1)], -1)
    return torch.where(acc.accepted == j, acc.next_tokens, tok)


def sequence_counts(drafts: torch.Tensor, acc: Acceptance) -> dict[tuple[int, ...], int]:
    seqs, counts = np.unique(
        torch.stack([output_at(drafts, acc, j) for j in range(drafts.shape[1] + 1)], 1).numpy(),
        axis=0,
        return_counts=True,
    )
    return {tuple(int(t) for t in s if t >= 0): int(c) for s, c in zip(seqs, counts, strict=True)}


def assert_sequences_fit(counts: dict[tuple[int, ...], int], *, fits: bool = True) -> None:
    exact = exact_output_dist(P.numpy(), Q.numpy(), Q.shape[0])
    cells = sorted(set(exact) | set(counts))
    assert_fits(
        np.array([counts.get(c, 0) for c in cells]),
        np.array([exact.get(c, 0.0) for c in cells]),
        fits=fits,
    )


def first_two_completed(drafts, acc, g) -> tuple[torch.Tensor, torch.Tensor]:
    """Output tokens 0 and 1, token 1 drawn from p_1 (plain decoding) where absent."""
    t0, t1 = output_at(drafts, acc, 0), output_at(drafts, acc, 1)
    return t0, torch.where(t1 >= 0, t1, sample(P[1].expand(N, -1), g))


def test_speculative_accept_output_distribution():
    drafts, acc, _, g = run_toy(seed=11)
    v = P.shape[1]
    # Whole output sequences (340 possible) against the exact enumeration.
    assert_sequences_fit(sequence_counts(drafts, acc))
    # First output token against p_0.
    t0, t1 = first_two_completed(drafts, acc, g)
    assert_fits(torch.bincount(t0, minlength=v).numpy(), P[0].numpy())
    # First two tokens (continued by plain decoding) against p_0 x p_1.
    assert_fits(torch.bincount(t0 * v + t1, minlength=v * v).numpy(), product_of(P.numpy(), 2))
    # Given a first token that is an accepted draft, the second follows p_1 independently.
    long = acc.accepted >= 1
    pair = torch.bincount(t0[long] * v + t1[long], minlength=v * v).numpy()
    first_if_accepted = torch.minimum(P[0], Q[0]).numpy()  # P(d_1 = x and accepted)
    assert_fits(pair, np.multiply.outer(first_if_accepted, P[1].numpy()))


def test_speculative_accept_mixed_draft_lens():
    lens = torch.randint(0, 4, (N,), generator=gen(12))
    drafts, acc, lens, _ = run_toy(seed=13, lens=lens)
    assert ((acc.accepted >= 0) & (acc.accepted <= lens)).all()
    t0 = output_at(drafts, acc, 0)
    for n in range(4):
        rows = lens == n
        assert_fits(torch.bincount(t0[rows], minlength=4).numpy(), P[0].numpy())
    zero = lens == 0
    assert (acc.accepted[zero] == 0).all()


@pytest.mark.parametrize("bug", ["always_accept", "correction_from_p", "bonus_wrong_position"])
def test_chi_square_tests_have_power(bug):
    drafts, acc, lens, g = run_toy(seed=11)  # the same draws as the passing test
    k, v = Q.shape
    if bug == "always_accept":
        broken = Acceptance(lens.clone(), sample(P[k].expand(N, v), g))
    elif bug == "correction_from_p":
        from_p = sample(P.expand(N, k + 1, v)[torch.arange(N), acc.accepted], g)
        broken = Acceptance(acc.accepted, torch.where(acc.accepted < lens, from_p, acc.next_tokens))
    else:
        wrong = sample(P[k - 1].expand(N, v), g)
        broken = Acceptance(acc.accepted, torch.where(acc.accepted == lens, wrong, acc.next_tokens))
    assert_sequences_fit(sequence_counts(drafts, broken), fits=False)
    if bug != "bonus_wrong_position":  # that bug only touches full-length outputs
        t0, _ = first_two_completed(drafts, broken, g)
        assert_fits(torch.bincount(t0, minlength=v).numpy(), P[0].numpy(), fits=False)


# --------------------------------------------------------------------------- edge cases, seeds


def test_sure_accepts_and_sure_rejects():
    # p >= q at every draft: everything is accepted, whatever the seed.
    q = torch.tensor([[0.5, 0.5, 0.0], [0.5, 0.5, 0.0]]).expand(64, 2, 3)
    p = torch.tensor([[0.5, 0.5, 0.0], [0.6, 0.4, 0.0], [0.0, 0.0, 1.0]]).expand(64, 3, 3)
    drafts = torch.tensor([[0, 0]]).expand(64, 2)
    acc = speculative_accept(drafts, q, p, torch.full((64,), 2), gen(0))
    assert (acc.accepted == 2).all() and (acc.next_tokens == 2).all()
    # p(d_1) = 0: always rejected, and the correction is never d_1.
    p = torch.tensor([[0.0, 0.5, 0.5]]).expand(64, 3, 3)
    acc = speculative_accept(drafts, q, p, torch.full((64,), 2), gen(0))
    assert (acc.accepted == 0).all() and (acc.next_tokens != 0).all()


def test_residual_rounded_to_zero_falls_back_to_p():
    # q >= p everywhere (as rounding can leave it): the residual is empty, use p.
    q = torch.tensor([[0.5, 0.5]]).expand(N, 1, 2)
    p = torch.tensor([[0.42, 0.42], [1.0, 0.0]]).expand(N, 2, 2)
    acc = speculative_accept(
        torch.zeros(N, 1, dtype=torch.long), q, p, torch.ones(N, dtype=torch.long), gen(6)
    )
    rejected = acc.accepted == 0
    assert 0.1 < rejected.float().mean() < 0.25  # 1 - 0.42 / 0.5
    assert_fits(torch.bincount(acc.next_tokens[rejected], minlength=2).numpy(), np.array([1, 1]))


def test_draft_weights_are_normalised_as_sample_takes_them():
    # a drafter that draws with sample(w) and returns w (unnormalised, negative entries
    # read as 0) gets the verdict of the distribution it drew from; no weight at all:
    # every draft rejected, the token drawn from p
    q = torch.tensor([[0.5, 0.25, 0.25, 0.0]]).expand(N, 1, 4)
    p = torch.tensor([[0.2, 0.3, 0.4, 0.1], [0.6, 0.2, 0.1, 0.1]]).expand(N, 2, 4)
    drafts, lens = torch.zeros(N, 1, dtype=torch.long), torch.ones(N, dtype=torch.long)
    want = speculative_accept(drafts, q, p, lens, gen(7))
    for w in ([1.5, 0.75, 0.75, 0.0], [0.5, 0.25, 0.25, -1.0]):
        got = speculative_accept(drafts, torch.tensor([[w]]).expand(N, 1, 4), p, lens, gen(7))
        assert torch.equal(got.accepted, want.accepted)
        assert torch.equal(got.next_tokens, want.next_tokens)
    none = speculative_accept(drafts, torch.zeros(N, 1, 4), p, lens, gen(8))
    assert (none.accepted == 0).all()
    assert_fits(torch.bincount(none.next_tokens, minlength=4).numpy(), np.array([2, 3, 4, 1]))


def random_batch(seed: int, b: int = 512, k: int = 4, v: int = 50):
    g = gen(seed)
    q = torch.softmax(torch.randn(b, k, v, generator=g), -1)
    p = torch.softmax(torch.randn(b, k + 1, v, generator=g), -1)
    drafts = (
        torch.stack([sample(q[:, i], g) for i in range(k)], 1)
        if k
        else torch.empty(b, 0, dtype=torch.long)
    )
    lens = torch.randint(0, k + 1, (b,), generator=g)
    return torch.where(torch.arange(k) < lens[:, None], drafts, 0), q, p, lens


def test_seeded_determinism_and_fixed_draws():
    drafts, q, p, lens = random_batch(0)
    a, b = (
        speculative_accept(drafts, q, p, lens, gen(7)),
        speculative_accept(drafts, q, p, lens, gen(7)),
    )
    assert torch.equal(a.accepted, b.accepted) and torch.equal(a.next_tokens, b.next_tokens)
    c = speculative_accept(drafts, q, p, lens, gen(8))
    assert not torch.equal(a.next_tokens, c.next_tokens)
    # Padding values, even outside the vocabulary, change nothing.
    garbage = torch.where(
        torch.arange(4) < lens[:, None], drafts, torch.randint(-9, 99, drafts.shape)
    )
    d = speculative_accept(garbage, q, p, lens, gen(7))
    assert torch.equal(a.accepted, d.accepted) and torch.equal(a.next_tokens, d.next_tokens)
    # The generator advances by the same amount whatever the data.
    g1, g2 = gen(9), gen(9)
    speculative_accept(drafts, q, p, lens, g1)
    speculative_accept(*random_batch(1), g2)
    assert torch.equal(g1.get_state(), g2.get_state())


@HYP
@given(st.integers(0, 2**31), st.integers(0, 4), st.integers(2, 9), st.booleans())
def test_speculative_accept_invariants(seed, k, v, double):
    drafts, q, p, lens = random_batch(seed, b=16, k=k, v=v)
    if double:
        q, p = q.double(), p.double()
    acc = speculative_accept(drafts, q, p, lens.int(), gen(seed))
    assert acc.accepted.dtype == acc.next_tokens.dtype == torch.int64
    assert ((acc.accepted >= 0) & (acc.accepted <= lens)).all()
    assert ((acc.next_tokens >= 0) & (acc.next_tokens < v)).all()
    for r, seq in enumerate(output_tokens(drafts, acc)):
        assert len(seq) == acc.accepted[r] + 1 and seq[:-1] == drafts[r, : len(seq) - 1].tolist()
        assert p[r, len(seq) - 1, seq[-1]] > 0


def test_shape_errors():
    d, q, p, lens = random_batch(0, b=2, k=3, v=5)
    with pytest.raises(ValueError, match="target_probs"):
        speculative_accept(d, q, p[:, :3], lens)
    with pytest.raises(ValueError, match="draft_probs"):
        speculative_accept(d, q[..., :4], p, lens)
    with pytest.raises(ValueError, match="draft_lens"):
        speculative_accept(d, q, p, lens.float())
    with pytest.raises(ValueError, match="draft_tokens"):
        speculative_accept(d.int(), q, p, lens)
