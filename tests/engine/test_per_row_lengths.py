"""Per-row draft lengths (``draft_lengths(ctx)`` policies) keep output exact with every
drafter: greedy output equals the main model's own, sampled output follows its
distribution; and the engine honours, caps and reports each row's length."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest
from models import perturbed, reference_greedy, tiny_lm

from bass import Generator
from bass.policies import DraftContext, StepRecord

PROMPTS = [[1, 2, 3, 4, 5], [7, 8], [9, 10, 11, 12, 13, 14, 15, 16, 3], [5], [6, 6, 6, 2]]


@dataclass
class RandomRows:
    """A per-row policy drawing every row's length at random (0 included), recording
    what it was asked and told."""

    k_max: int = 5
    seed: int = 0
    contexts: list[DraftContext] = field(default_factory=list)
    updates: list[StepRecord] = field(default_factory=list)

    def __post_init__(self):
        self.rng = random.Random(self.seed)
        self.asked: list[list[int]] = []

    def draft_length(self) -> int:  # unused: draft_lengths wins
        raise AssertionError("the engine must call draft_lengths")

    def draft_lengths(self, ctx: DraftContext) -> list[int]:
        self.contexts.append(ctx)
        asked = [self.rng.randint(0, self.k_max) for _ in ctx.prompts]
        self.asked.append(asked)
        return asked

    def update(self, stats: StepRecord) -> None:
        self.updates.append(stats)


@pytest.fixture(scope="module")
def llama():
    return tiny_lm("llama")


@pytest.mark.parametrize("draft", ["ngram", "same", "perturbed"])
def test_random_per_row_lengths_are_exact_and_honoured(llama, draft):
    d = {"same": llama, "perturbed": perturbed(llama)}.get(draft, draft)
    policy = RandomRows()
    res = Generator(llama, d, policy=policy).generate(PROMPTS, max_new_tokens=14)
    for p, seq in zip(PROMPTS, res.sequences):
        assert seq == reference_greedy(llama, p, 14)
    assert len(policy.contexts) == len(res.stats.steps) == len(policy.updates)
    for ctx, asked, step, upd in zip(
        policy.contexts, policy.asked, res.stats.steps, policy.updates
    ):
        assert list(ctx.prompts) == step.prompts == list(upd.prompts)
        assert ctx.drafter == ("ngram" if draft == "ngram" else "model")
        for r in range(len(ctx.prompts)):
            want = min(ctx.caps[r], asked[r])
            if ctx.available is None:  # a model drafts exactly that many
                assert step.drafted[r] == want
            else:  # n-grams: at most what the lookup found
                assert step.drafted[r] <= min(want, ctx.available[r])
        assert step.verify_tokens == sum(1 + d for d in step.drafted)
    if draft != "ngram":  # a model drafts exactly what was asked, within the caps
        drafted = [d for s in res.stats.steps for d in s.drafted]
        assert len(set(drafted)) > 2


def test_caps_are_the_row_budget(llama):
    policy = RandomRows(k_max=9)
    res = Generator(llama, llama, policy=policy).generate(PROMPTS, max_new_tokens=6)
    made = {r: 1 for r in range(len(PROMPTS))}  # the prefill's token
    for ctx, step in zip(policy.contexts, res.stats.steps):
        for r, row in enumerate(ctx.prompts):
            assert ctx.caps[r] == 6 - made[row] - 1
        for r, row in enumerate(step.prompts):
            made[row] += step.accepted[r] + 1
    assert all(len(s) == 6 for s in res.sequences)


def test_wrong_number_of_lengths_is_refused(llama):
    class Broken(RandomRows):
        def draft_lengths(self, ctx):
            return [1]

    with pytest.raises(ValueError, match="draft_lengths returned 1 lengths for 5 active rows"):
        Generator(llama, "ngram", policy=Broken()).generate(PROMPTS, max_new_tokens=4)


@pytest.mark.parametrize("draft", ["ngram", "same", "perturbed"])
def test_adaptive_default_is_exact(llama, draft):
    d = {"same": llama, "perturbed": perturbed(llama)}.get(draft, draft)
    gen = Generator(llama, d)  # the default policy: adaptive, per row
    assert type(gen.new_policy()).__name__ == "AdaptivePolicy"
    prompts = PROMPTS * 2
    res = gen.generate(prompts, max_new_tokens=24)
    for p, seq in zip(prompts, res.sequences):
        assert seq == reference_greedy(llama, p, 24)
    # the exactness above went through drafts (a draft that is the main model itself
    # costs as much as verifying, so the policy need not draft long: it measures, then
    # keeps probing)
    assert sum(sum(s.drafted) for s in res.stats.steps) > 0
    if draft == "same":  # every drafted token is accepted
        assert all(s.accepted == s.drafted for s in res.stats.steps)


def test_adaptive_draft_confidence_stops_rows_and_stays_exact(llama):
    """With draft_confidence=1 the default policy also stops rows early from the draft
    model's confidence; greedy output is still the main model's own."""
    draft = tiny_lm("llama", seed=7, hidden=16, heads=2, kv_heads=1, layers=1)  # unrelated
    gen = Generator(llama, draft, policy="adaptive", policy_options={"draft_confidence": 1})
    ctx = DraftContext(prompts=[0], caps=[4], drafter="model")
    assert gen.new_policy().early_stop(ctx) is not None
    assert Generator(llama, draft).new_policy().early_stop(ctx) is None  # off by default
    res = gen.generate(PROMPTS * 2, max_new_tokens=20)
    for p, seq in zip(PROMPTS * 2, res.sequences):
        assert seq == reference_greedy(llama, p, 20)
