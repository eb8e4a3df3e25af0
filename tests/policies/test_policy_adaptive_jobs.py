"""``adaptive`` in a simulator of whole jobs whose rows change as they go: acceptance that
rises after a row's first tokens, and a draft model whose passes cost time of their own.
(``test_policy_adaptive.py`` holds the estimates, the static-batch makespans and the
choice's optimality.)"""

from __future__ import annotations

import math
import random

import pytest

from bass.policies import DraftContext, StepRecord
from bass.policies.adaptive import AdaptivePolicy


@pytest.fixture(autouse=True)
def frozen_clock(monkeypatch):
    """Host time between updates is measured with ``time.perf_counter``: frozen, so the
    simulated step times are all the policy sees."""
    from bass.policies import adaptive

    monkeypatch.setattr(adaptive.time, "perf_counter", lambda: 0.0)


def job(policy, rows, budget, alpha, cost, seed, noise=0.15, drafter="ngram", draft_pass=0.0):
    """A static batch of ``rows`` rows of ``budget`` tokens, run until the last is done:
    ``alpha(done)`` the acceptance of a draft token at a row's ``done``-th token, a step of
    ``N`` tokens costs ``cost(N)`` times a drifting noise, plus ``draft_pass`` seconds per
    draft-model pass; the n-gram lookup finds 8 tokens every step. ``policy=None`` decodes
    plainly. Returns the batch's seconds."""
    rng, jitter = random.Random(seed), random.Random(seed + 1)
    left, done = dict.fromkeys(range(rows), budget), dict.fromkeys(range(rows), 0)
    total, drift, step = 0.0, 0.0, 0
    while left:
        ids = sorted(left)
        caps = [left[r] - 1 for r in ids]
        ks = [0] * len(ids)
        if policy is not None:
            ngram = drafter == "ngram"
            found = [min(c, 8) for c in caps] if ngram else None
            ctx = DraftContext(
                prompts=ids, caps=caps, drafter=drafter, available=found,
                match_len=[2 if f else 0 for f in found] if ngram else None, step=step,
            )  # fmt: skip
            ks = policy.draft_lengths(ctx)
        accepted = []
        for k, r in zip(ks, ids):
            x = 0
            while x < k and rng.random() < alpha(done[r] + x):
                x += 1
            accepted.append(x)
        drift = 0.9 * drift + 0.44 * noise * jitter.gauss(0, 1)
        n = sum(1 + k for k in ks)
        verify = cost(n) * math.exp(drift + noise / 3 * jitter.gauss(0, 1))
        passes = max(ks) if drafter == "model" else 0
        total += verify + draft_pass * passes
        if policy is not None:
            policy.update(
                StepRecord(
                    draft_length=max(ks), accepted=accepted, drafted=ks,
                    verify_seconds=verify, draft_seconds=draft_pass * passes, prompts=ids,
                    verify_tokens=n,
                    draft_pass_tokens=[sum(k > i for k in ks) for i in range(passes)],
                )
            )  # fmt: skip
        for r, x in zip(ids, accepted):
            left[r] -= x + 1
            done[r] += x + 1
            if left[r] <= 0:
                del left[r]
        step += 1
    return total


def test_drafting_resumes_when_rows_start_copying():
    """16 rows on a CPU (a token 4% of a pass, noisy steps) that free-write their first 48
    tokens (drafts accepted 5% of the time) and then copy (95%): drafting must come back
    when the copying starts. With a single measuring step behind it (drafting and a wider
    pass at once: the jump and the slope not yet told apart), the price of a probe token
    had the jump's whole uncertainty in it, every probe was skipped as one that "would not
    pay even if accepted", and most runs never drafted again (0.99x the time of plain
    decoding, where one token per row takes 0.94x; now ~0.87x)."""

    def alpha(done):
        return 0.05 if done < 48 else 0.95

    def cost(n):
        return 0.06 + 0.0025 * n

    plain = sum(job(None, 16, 128, alpha, cost, s) for s in range(10))
    ours = sum(job(AdaptivePolicy(), 16, 128, alpha, cost, s) for s in range(10))
    assert ours < 0.92 * plain


def test_draft_model_probes_pay_for_their_draft_pass():
    """A draft model that is almost never right (2%) beside a nearly free verify token (a
    GPU), its pass 30% of a verify pass: each exploration token in an otherwise plain step
    runs a draft pass, which the probe budget did not count (16 rows probing at different
    steps: half the steps ran a draft pass, 1.14x the time of plain decoding)."""

    def cost(n):
        return 0.02 + 1e-5 * n

    kw = dict(rows=16, budget=48, alpha=lambda done: 0.02, cost=cost, drafter="model")
    plain = sum(job(None, seed=s, **kw) for s in range(4))
    ours = sum(job(AdaptivePolicy(), seed=s, draft_pass=0.006, **kw) for s in range(4))
    assert ours < 1.05 * plain
