"""Speculative sampling through the whole engine leaves the main model's distribution intact.

Over a 5-token vocabulary, the exact distribution of 3-token continuations of a prompt is
computed by enumerating all 125 of them with the main model alone. The engine then draws
N continuations (N rows of one batch, one seeded generator) with a draft that disagrees
with the main model, and a chi-square goodness-of-fit test compares the counts with the
exact distribution. Each test's false-alarm rate is ALPHA = 1e-3; seeds are fixed, so the
outcome is deterministic. ``test_the_check_has_power`` shows the same check rejecting a
deliberately broken acceptance rule.
"""

from __future__ import annotations

import copy
import itertools

import pytest
import torch
from models import tiny_lm

import bass.engine
from bass import Generator
from bass.sampling import SamplingParams, warp_probs

# scipy is in the test dependency group; a machine without it (the GPU machine) skips this
# module instead of failing the collection of every test, `pytest -m gpu` included
chisquare = pytest.importorskip("scipy.stats").chisquare

ALPHA = 1e-3
N = 4000
PROMPT = [1, 2, 3]
L = 3
V = 5


@pytest.fixture(scope="module")
def pair():
    main = tiny_lm("llama", vocab=V, sharpen=3.0)
    draft = tiny_lm(
        "llama", vocab=V, seed=11, hidden=16, heads=2, kv_heads=1, layers=1, sharpen=3.0
    )
    return main, draft


def exact_distribution(model, params: SamplingParams) -> dict[tuple[int, ...], float]:
    """P(x_1..x_L | PROMPT) under the warped main model, by enumeration."""
    ref = copy.deepcopy(model)
    ref.set_attn_implementation("sdpa")
    seqs = list(itertools.product(range(V), repeat=L))
    ids = torch.tensor([PROMPT + list(s) for s in seqs])
    with torch.no_grad():
        logits = ref(ids).logits[:, len(PROMPT) - 1 : -1]  # [V^L, L, V]
    probs = warp_probs(logits, params)
    picked = probs.gather(-1, ids[:, len(PROMPT) :, None]).squeeze(-1)  # [V^L, L]
    return dict(zip(seqs, picked.prod(-1).tolist()))


def goodness_of_fit(samples: list[tuple[int, ...]], exact: dict) -> float:
    """Chi-square p-value of ``samples`` against ``exact``; cells expected < 5 pooled."""
    counts = {s: 0 for s in exact}
    for s in samples:
        counts[s] += 1
    obs, exp, pool_o, pool_e = [], [], 0, 0.0
    for s, p in exact.items():
        if p * len(samples) >= 5:
            obs.append(counts[s])
            exp.append(p * len(samples))
        else:
            pool_o += counts[s]
            pool_e += p * len(samples)
    if pool_e == 0 and pool_o > 0:
        return 0.0  # an outcome of probability 0 was drawn
    if pool_e > 0:
        obs.append(pool_o)
        exp.append(pool_e)
    total = sum(exp)
    exp = [e * len(samples) / total for e in exp]  # exact sums to 1 up to rounding
    return chisquare(obs, exp).pvalue


def draw(main, draft, params: SamplingParams, seed: int, k: int = 2, policy=None):
    policy = policy or ("constant", {"k": k})
    gen = Generator(main, draft, policy=policy[0], policy_options=policy[1])
    res = gen.generate(
        [PROMPT] * N,
        max_new_tokens=L,
        do_sample=True,
        temperature=params.temperature,
        top_k=params.top_k,
        top_p=params.top_p,
        seed=seed,
    )
    assert all(len(s) == L for s in res.sequences)
    return [tuple(s) for s in res.sequences], res


@pytest.mark.parametrize(
    "params,drafter",
    [
        (SamplingParams(True, 1.0), "model"),
        (SamplingParams(True, 0.7, top_k=3, top_p=0.9), "model"),
        (SamplingParams(True, 1.3), "ngram"),
    ],
    ids=["t1", "t0.7-topk3-topp0.9", "ngram-t1.3"],
)
def test_continuations_follow_the_main_model(pair, params, drafter):
    main, draft = pair
    samples, res = draw(main, draft if drafter == "model" else "ngram", params, seed=1234)
    exact = exact_distribution(main, params)
    assert goodness_of_fit(samples, exact) > ALPHA
    if drafter == "model":  # the draft disagrees: rejections really happened
        drafted = sum(sum(s.drafted) for s in res.stats.steps)
        accepted = sum(sum(s.accepted) for s in res.stats.steps)
        assert 0 < accepted < drafted


def test_per_row_early_stop_keeps_the_distribution(pair):
    """The confidence policy stops rows on the draft's own probabilities only, so the
    output distribution is still the main model's."""
    main, draft = pair
    params = SamplingParams(True, 1.0)
    policy = ("confidence", {"k_max": 3, "min_top1": 0.3})
    samples, res = draw(main, draft, params, seed=99, policy=policy)
    assert any(d < s.draft_length for s in res.stats.steps for d in s.drafted)
    assert goodness_of_fit(samples, exact_distribution(main, params)) > ALPHA


def test_the_check_has_power(pair, monkeypatch):
    """Accepting every draft token (a wrong rule) samples the draft's distribution; the
    same check must reject it."""
    main, draft = pair
    real = bass.engine.speculative_accept

    def accept_all(drafts, draft_probs, target_probs, counts, gen):
        acc = real(drafts, draft_probs, target_probs, counts, gen)
        acc.accepted = counts.clone()
        last = target_probs[torch.arange(len(counts)), counts]
        acc.next_tokens = torch.multinomial(last, 1, generator=gen).squeeze(-1)
        return acc

    monkeypatch.setattr(bass.engine, "speculative_accept", accept_all)
    params = SamplingParams(True, 1.0)
    samples, _ = draw(main, draft, params, seed=1234)
    assert goodness_of_fit(samples, exact_distribution(main, params)) < ALPHA
