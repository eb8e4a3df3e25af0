"""The ``adaptive`` policy's plan hold: where planning costs more than drafting must save
(a tiny model's step), a plan of no drafts holds for a few steps of the same rows."""

from __future__ import annotations

import random
import types

from bass.policies import DraftContext, StepRecord, adaptive
from bass.policies.adaptive import AdaptivePolicy


def _model_steps(p, steps, draft_seconds, alpha=0.7, rows=4, seed=0):
    """``steps`` steps of ``p`` with a draft model whose pass costs ``draft_seconds``
    (verify: 10 ms plus 0.1 ms a token); returns each step's lengths."""
    rng = random.Random(seed)
    plans = []
    for step in range(steps):
        ks = p.draft_lengths(
            DraftContext(prompts=list(range(rows)), caps=[8] * rows, drafter="model", step=step)
        )
        plans.append(ks)
        acc = []
        for k in ks:
            x = 0
            while x < k and rng.random() < alpha:
                x += 1
            acc.append(x)
        n = rows + sum(ks)
        p.update(StepRecord(
            draft_length=max(ks), accepted=acc, drafted=ks, prompts=list(range(rows)),
            draft_seconds=draft_seconds * max(ks), verify_seconds=0.010 + 0.0001 * n,
            verify_tokens=n, draft_pass_tokens=[rows] * max(ks),
        ))  # fmt: skip
    return plans


def test_a_draft_model_that_does_not_pay_is_not_planned_for_at_every_step(monkeypatch):
    """Planning costs host time each step (about 0.15 ms in Python, a tenth of a tiny
    model's step on a CPU): where it costs more than drafting must save (``margin`` of a
    plain step), once a plan drafted nothing the next 1, 3, then 7 steps of the same rows
    draft none without planning (exploration still probes); where drafting pays, or
    planning is cheap beside a step, every step plans."""
    calls = []
    allocate = AdaptivePolicy.allocate
    monkeypatch.setattr(
        AdaptivePolicy, "allocate", lambda self, *a, **k: calls.append(1) or allocate(self, *a, **k)
    )
    ticks = iter(range(10**9))  # planning takes 1 ms: 10% of a 10 ms verify pass
    monkeypatch.setattr(
        adaptive, "time", types.SimpleNamespace(perf_counter=lambda: next(ticks) / 1e3)
    )
    costly = _model_steps(AdaptivePolicy(), 80, draft_seconds=0.05)  # 5x a verify pass
    assert sum(map(any, costly[20:])) <= 6  # it learned: hardly any drafts (probes)
    assert len(calls) <= 30  # before: 78 (every step but the two measuring ones)
    calls.clear()
    cheap = _model_steps(AdaptivePolicy(), 80, draft_seconds=0.0005)
    assert sum(map(any, cheap[20:])) >= 55 and len(calls) >= 70
    # planning that costs less than drafting must save (a large model's step): every step
    monkeypatch.setattr(adaptive, "time", types.SimpleNamespace(perf_counter=lambda: 0.0))
    calls.clear()
    costly = _model_steps(AdaptivePolicy(), 80, draft_seconds=0.05)
    assert sum(map(any, costly[20:])) <= 6 and len(calls) == 78
    # rows joining or leaving end a hold: the next step plans for them
    monkeypatch.setattr(
        adaptive, "time", types.SimpleNamespace(perf_counter=lambda: next(ticks) / 1e3)
    )
    p = AdaptivePolicy()
    _model_steps(p, 40, draft_seconds=0.05)
    calls.clear()
    p.held = 5
    p.draft_lengths(DraftContext(prompts=[0, 1, 2], caps=[8] * 3, drafter="model", step=40))
    assert len(calls) == 1
