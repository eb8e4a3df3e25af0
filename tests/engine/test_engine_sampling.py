"""Speculative sampling through the whole engine leaves the main model's distribution intact.

Over a 5-token vocabulary, the exact distribution of 4-token continuations of a prompt is
computed by enumerating all 625 of them with the main model alone (4 tokens: room for
steps that draft 2, so the second draft position is tested too). The engine then draws
N continuations (N rows of one batch, one seeded generator) with a draft that disagrees
with the main model, and a chi-square goodness-of-fit test compares the counts with the
exact distribution. Each test's false-alarm rate is ALPHA = 1e-3; seeds are fixed, so the
outcome is deterministic. ``test_the_check_has_power`` shows the same check rejecting a
deliberately broken acceptance rule. The enumeration and the test are ``bass.testing``'s,
the ones users run on their own drafters and policies.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from models import tiny_lm

import bass.engine
import bass.verify
from bass import Generator, testing
from bass.sampling import SamplingParams

ALPHA = 1e-3
N = 4000
PROMPT = [1, 2, 3]
L = 4  # a step drafts at most L - 2 tokens
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
    return testing.exact_distribution(
        model, PROMPT, L, temperature=params.temperature, top_k=params.top_k, top_p=params.top_p,
        min_p=params.min_p,
    )  # fmt: skip


def goodness_of_fit(samples: list[tuple[int, ...]], exact: dict) -> float:
    """Chi-square p-value of ``samples`` against ``exact`` (bass.testing's test)."""
    return testing.chi_square_test(Counter(samples), exact).p_value


def draw(main, draft, params: SamplingParams, seed: int, k: int = 2, policy=None, mode=None):
    policy = policy or ("constant", {"k": k})
    gen = Generator(main, draft, policy=policy[0], policy_options=policy[1], draft_sampling=mode)
    res = gen.generate(
        [PROMPT] * N,
        max_new_tokens=L,
        do_sample=True,
        temperature=params.temperature,
        top_k=params.top_k,
        top_p=params.top_p,
        min_p=params.min_p,
        seed=seed,
    )
    assert all(len(s) == L for s in res.sequences)
    return [tuple(s) for s in res.sequences], res


@pytest.mark.parametrize(
    "params,drafter,mode",
    [
        (SamplingParams(True, 1.0), "model", "coupled"),
        (SamplingParams(True, 1.0), "model", "rejection"),
        (SamplingParams(True, 0.7, top_k=3, top_p=0.9), "model", "coupled"),
        (SamplingParams(True, 0.7, top_k=3, top_p=0.9), "model", "rejection"),
        (SamplingParams(True, 0.7, top_k=3, top_p=0.9, min_p=0.5), "model", "rejection"),
        (SamplingParams(True, 1.3), "ngram", None),
    ],
    ids=[
        "t1",
        "t1-rejection",
        "t0.7-topk3-topp0.9",
        "t0.7-topk3-topp0.9-rejection",
        "t0.7-topk3-topp0.9-minp0.5-rejection",
        "ngram-t1.3",
    ],
)
def test_continuations_follow_the_main_model(pair, params, drafter, mode):
    """(min_p 0.5 drops 15 of the 81 continuations top-k and top-p keep here.)"""
    main, draft = pair
    d = draft if drafter == "model" else "ngram"
    samples, res = draw(main, d, params, seed=1234, mode=mode)
    exact = exact_distribution(main, params)
    assert goodness_of_fit(samples, exact) > ALPHA
    if drafter == "model":  # the draft disagrees: rejections really happened
        drafted = sum(sum(s.drafted) for s in res.stats.steps)
        accepted = sum(sum(s.accepted) for s in res.stats.steps)
        assert 0 < accepted < drafted


@pytest.mark.parametrize("mode", ["coupled", "rejection"])
def test_rows_admitted_as_others_finish_keep_the_distribution(pair, mode):
    """Continuous batching: a quarter of the rows at once, the rest admitted into the
    slots of finished ones (rejection sampling's draws depend on the batch: still exact
    in distribution)."""
    main, draft = pair
    # a fixed draft length: the default policy's, from timings, would change the draws
    gen = Generator(main, draft, draft_sampling=mode, policy="constant", policy_options={"k": 2})
    testing.assert_distribution_equivalent(
        gen, main, PROMPT, L, rows=N, alpha=ALPHA, seed=3, max_rows=N // 4, temperature=0.9
    )


def test_per_row_early_stop_keeps_the_distribution(pair):
    """The confidence policy stops rows on the draft's own probabilities only, so the
    output distribution is still the main model's."""
    main, draft = pair
    params = SamplingParams(True, 1.0)
    policy = ("confidence", {"k_max": 3, "min_top1": 0.3})
    samples, res = draw(main, draft, params, seed=99, policy=policy)
    assert any(d < s.draft_length for s in res.stats.steps for d in s.drafted)
    assert goodness_of_fit(samples, exact_distribution(main, params)) > ALPHA


@pytest.mark.parametrize("mode", ["coupled", "rejection"])
def test_the_check_has_power(pair, monkeypatch, mode):
    """Accepting every draft token (a wrong rule) samples the draft's distribution; the
    same check must reject it, in each way of verifying sampled drafts."""
    main, draft = pair
    if mode == "rejection":
        real = bass.verify.speculative_accept

        def accept_all(drafts, draft_probs, target_probs, counts, gen):
            acc = real(drafts, draft_probs, target_probs, counts, gen)
            acc.accepted = counts.clone()
            last = target_probs[torch.arange(len(counts)), counts]
            acc.next_tokens = torch.multinomial(last, 1, generator=gen).squeeze(-1)
            return acc

        monkeypatch.setattr(bass.verify, "speculative_accept", accept_all)
    else:  # coupled drafts kept whatever the main model's keyed draws were
        real = bass.verify.greedy_accept_ids

        def keep_all(drafts, draws, counts):
            acc = real(drafts, draws, counts)
            acc.accepted = counts.clone()
            acc.next_tokens = draws.gather(1, counts[:, None]).squeeze(1)
            return acc

        monkeypatch.setattr(bass.verify, "greedy_accept_ids", keep_all)
    params = SamplingParams(True, 1.0)
    samples, _ = draw(main, draft, params, seed=1234, mode=mode)
    assert goodness_of_fit(samples, exact_distribution(main, params)) < ALPHA


class RandomRows:
    """Per-row draft lengths drawn at random each step (0 included)."""

    def __init__(self, seed=0):
        import random

        self.rng = random.Random(seed)

    def draft_length(self):
        raise AssertionError("draft_lengths is the contract used")

    def draft_lengths(self, ctx):
        return [self.rng.randint(0, 2) for _ in ctx.prompts]  # L - 2 at most

    def update(self, stats):
        pass


class ConfidenceRows(RandomRows):
    """Every row allowed L - 2 tokens, cut by a draft-confidence stop (bass.hooks.EarlyStop:
    a draft token whose top-1 probability is under 0.26, near these models' median, is not
    proposed): some rows stop early, others not (the default policy's own stop, on these
    models, stopped every draft: nothing was checked)."""

    def draft_lengths(self, ctx):
        return [L - 2] * len(ctx.prompts)

    def early_stop(self, ctx):
        return bass.hooks.EarlyStop(min_top1=0.26)


@pytest.mark.parametrize(
    "drafter,policy",
    [
        ("model", "adaptive"),
        ("model", "confidence-rows"),
        ("model", "random-rows"),
        ("ngram", "adaptive"),
        ("ngram", "random-rows"),
    ],
)
def test_per_row_draft_lengths_keep_the_distribution(pair, drafter, policy):
    """Per-row lengths (the default policy's, random ones, and fixed ones cut by a
    draft-confidence stop) with either drafter: bass.testing's check against the exact
    distribution."""
    main, draft = pair
    p, opts = {
        # k_max = L - 2: drafts the test draws whole (its timings pick the lengths, and a
        # deeper draft in the check's probe would warn)
        "adaptive": ("adaptive", {"k_max": L - 2, "k0": L - 2}),
        "confidence-rows": (ConfidenceRows(), None),
        "random-rows": (RandomRows(), None),
    }[policy]
    gen = Generator(main, draft if drafter == "model" else "ngram", policy=p, policy_options=opts)
    if policy == "confidence-rows":  # the stop cuts some drafts, not all
        res = gen.generate([PROMPT] * 64, max_new_tokens=L, do_sample=True, seed=7, temperature=0.9)
        made = sum(sum(s.drafted_list()) for s in res.stats.steps)
        assert 0 < made < sum(len(s.drafted_list()) * (L - 2) for s in res.stats.steps)
    testing.assert_distribution_equivalent(
        gen, main, PROMPT, L, rows=N, alpha=ALPHA, seed=7, temperature=0.9
    )
