"""The ``adaptive`` policy: its cost model, per-row allocation, and behaviour in simulated
batches whose costs and acceptance rates are known (so the optimum is known too)."""

from __future__ import annotations

import math
import random
import types

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from bass.policies import DraftContext, StepRecord, adaptive, load
from bass.policies.adaptive import AdaptivePolicy, VerifyCost


@pytest.fixture(autouse=True)
def frozen_clock(monkeypatch):
    """The simulations below give each step's verify cost; the policy's host-time estimate
    (the real clock between two updates, less the step's passes) would add this machine's
    speed to them: no host time here."""
    monkeypatch.setattr(adaptive, "time", types.SimpleNamespace(perf_counter=lambda: 0.0))


def expected(k: int, alpha: float) -> float:
    return sum(alpha**j for j in range(k + 1))


def oracle(alphas, caps, cost, host=0.0) -> float:
    """The best expected rate by brute force over every per-row allocation."""
    best = 0.0

    def rec(r, ks):
        nonlocal best
        if r == len(alphas):
            n = sum(1 + k for k in ks)
            rate = sum(expected(k, a) for k, a in zip(ks, alphas)) / (host + cost(n))
            best = max(best, rate)
            return
        for k in range(caps[r] + 1):
            rec(r + 1, [*ks, k])

    rec(0, [])
    return best


def simulate(policy, alphas, caps, cost, steps=60, seed=0, available=None):
    """Run ``policy`` on a batch with true acceptance ``alphas`` and verify cost
    ``cost(N)``; returns the expected rate of each step's choice."""
    rng = random.Random(seed)
    R = len(alphas)
    rates = []
    for step in range(steps):
        ctx = DraftContext(
            prompts=list(range(R)),
            caps=list(caps),
            drafter="ngram",
            available=available or list(caps),
            match_len=[2] * R,
            step=step,
        )
        ks = policy.draft_lengths(ctx)
        assert len(ks) == R and all(0 <= k <= c for k, c in zip(ks, caps))
        n = sum(1 + k for k in ks)
        rates.append(sum(expected(k, a) for k, a in zip(ks, alphas)) / cost(n))
        accepted = []
        for k, a in zip(ks, alphas):
            x = 0
            while x < k and rng.random() < a:
                x += 1
            accepted.append(x)
        policy.update(
            StepRecord(
                draft_length=max(ks),
                accepted=accepted,
                drafted=ks,
                verify_seconds=cost(n),
                prompts=list(range(R)),
                verify_tokens=n,
            )
        )
    return rates


def test_verify_cost_slope_from_neighbouring_steps():
    approx = pytest.approx  # the fit's ridge (3 tokens^2 of "no slope") moves it a little
    c = VerifyCost(ema=1.0)
    assert c(5) is None
    c.observe(4, 0.010)
    assert c(2) == c(4) == c(9) == 0.010 and c.slope() == 0.0  # one size: flat
    c.observe(12, 0.014)  # two sizes: the line through them, both ways
    assert c(8) == approx(0.012, rel=0.02) and c(20) == approx(0.018, rel=0.02)
    assert c.slope() == approx(0.0005, rel=0.06) and c.jump() == 0.0
    c.observe(12, 0.030)  # ema=1: the level follows the newest step; the same size twice
    assert c(12) == approx(0.030)  # 16 ms apart is noise: the slope gets more cautious
    assert c.slope() > 0.001
    noisy = VerifyCost(ema=1.0)
    noisy.observe(4, 0.02)
    noisy.observe(8, 0.01)  # more tokens measured faster: noise, no negative slope
    assert noisy.slope() == 0.0 and noisy(100) == 0.01
    steep = VerifyCost(ema=1.0)
    steep.observe(10, 0.010)
    steep.observe(20, 0.030)
    assert steep(1) == 0.25 * 0.030  # the line would go negative: a pass never costs nothing


def test_verify_cost_separates_the_jump_of_drafting_from_the_tokens():
    """A batch of one row on a CPU: decoding is matrix-vector, verifying drafts is
    matrix-matrix, so a pass with drafts costs 60 ms + 30 ms + 1.5 ms a token while a
    plain one costs 60 ms + 1.5 ms. After plain and drafting steps of a few sizes the
    fit tells the jump from the slope: one more token is cheap once the step drafts."""
    c = VerifyCost()
    sizes = [1, 2, 1, 5, 1, 3, 9, 1, 4, 1, 7, 2, 1, 6] * 3
    for n in sizes:
        c.observe(n, 0.060 + 0.0015 * n + (0.030 if n > 1 else 0.0), drafting=n > 1)
    assert c.jump() == pytest.approx(0.030, rel=0.05)
    assert c.slope() == pytest.approx(0.0015, rel=0.2)
    assert c(1) == pytest.approx(0.0615, rel=0.02)
    assert c(9, drafting=True) == pytest.approx(0.1035, rel=0.02)


def test_verify_cost_learns_a_staircase():
    """A batch of one row with bass's calibrated CPU layouts: the first draft token costs
    +4% over a plain pass, the second +31%, later ones +8% each. No line draws that; each
    size's own residual, once it has been seen a few times, does."""

    def stair(n):
        return 0.031 if n == 1 else 0.0324 if n == 2 else 0.0406 + 0.0025 * (n - 3)

    c = VerifyCost()
    for n in [1, 2, 1, 3, 2, 2, 5, 1, 2, 4, 2, 3] * 4:
        c.observe(n, stair(n), drafting=n > 1)
    one, two, three = c(1), c(2, drafting=True), c(3, drafting=True)
    assert two - one < 0.5 * (three - two)  # the shape: a cheap step, then a dear one
    assert one == pytest.approx(stair(1), rel=0.06)  # (the line's caution pivots at the
    for n in (2, 3, 4):  # level: below it, the cautious line runs a little low)
        assert c(n, drafting=True) == pytest.approx(stair(n), rel=0.05), n
    # a size never seen stays on the line, no correction borrowed from its neighbours
    assert c.steps.get((9, True)) is None


def test_a_cheap_first_draft_token_is_used_at_batch_one():
    """With that staircase, one draft token accepted a third of the time pays (+4% cost
    for +35% tokens) though two do not: the policy finds it despite noisy steps."""

    def stair(n):
        return 0.031 if n == 1 else 0.0324 if n == 2 else 0.0406 + 0.008 * (n - 3)

    gains = [
        makespan(None, [0.35], 200, stair, seed=s, noise=0.1)
        / makespan(load("adaptive"), [0.35], 200, stair, seed=s, noise=0.1, avail=0.6)
        for s in range(4)
    ]
    assert sum(gains) / len(gains) > 1.08, gains
    poor = makespan(None, [0.1], 200, stair, noise=0.1) / makespan(
        load("adaptive"), [0.1], 200, stair, noise=0.1, avail=0.6
    )
    assert poor > 0.95


def test_verify_cost_sees_through_drift():
    """The machine slows down by 1% a step while the policy alternates 8- and 9-token
    passes (a token costs 2.5 ms): neighbouring steps still show the token's cost, where
    a line through all the points would see the drift (here: more tokens, faster)."""
    c = VerifyCost()
    sizes = [9, 8] * 20  # the larger pass first: drift makes later (smaller) ones slower
    for t, n in enumerate(sizes):
        c.observe(n, (0.1 + 0.0025 * n) * (1.01**t))
    drifted = 1.01 ** len(sizes)
    assert c.slope() == pytest.approx(0.0025 * drifted, rel=0.2)
    assert c(8) == pytest.approx((0.1 + 0.0025 * 8) * drifted, rel=0.05)


def test_verify_cost_is_pessimistic_when_steps_are_noisy():
    """Noise between neighbouring steps adds its standard error to the slope: a token
    whose cost cannot be seen is not taken for free."""
    rng = random.Random(0)
    steady, noisy = VerifyCost(), VerifyCost()
    for t in range(40):
        n = 1 + t % 3
        steady.observe(n, 0.06 + 0.0025 * n)
        noisy.observe(n, (0.06 + 0.0025 * n) * (1 + 0.1 * rng.gauss(0, 1)))
    assert steady.slope() == pytest.approx(0.0025, rel=0.1)
    assert noisy.slope() > 0.0025


def test_first_steps_measure_then_decide():
    p = AdaptivePolicy(k0=3)
    ctx = DraftContext(prompts=[0, 1], caps=[9, 9], drafter="ngram", available=[5, 0])
    assert p.draft_lengths(ctx) == [0, 0]  # 1) C(R)
    p.update(
        StepRecord(
            draft_length=0,
            accepted=[0, 0],
            drafted=[0, 0],
            verify_seconds=0.1,
            prompts=[0, 1],
            verify_tokens=2,
        )
    )
    assert p.draft_lengths(ctx) == [1, 0]  # 2) a token where the lookup found something
    # ... for every such row: a pass as much wider than the first as the batch allows,
    # so the price of a draft token is measured over many tokens, not one
    p = AdaptivePolicy()
    three = DraftContext(
        prompts=[0, 1, 2],
        caps=[9] * 3,
        drafter="ngram",
        available=[5, 5, 0],
        match_len=[1, 3, 4],
    )
    p.draft_lengths(three)
    p.update(
        StepRecord(0, [0] * 3, [0] * 3, verify_seconds=0.1, prompts=[0, 1, 2], verify_tokens=3)
    )
    assert p.draft_lengths(three) == [1, 1, 0]


def test_plans_grow_at_most_twice_the_widest_pass_measured():
    """Beyond the sizes measured, C(N) is an extrapolation: the plan's draft tokens at
    most double from step to step (a measuring token per row, then twice that, ...), and
    still reach everything useful within a few steps when verification is nearly free."""
    p = load("adaptive")
    widths = []
    orig = p.update

    def update(stats):
        widths.append(sum(stats.drafted_list()))
        orig(stats)

    p.update = update
    simulate(p, [0.9] * 4, [8] * 4, lambda n: 0.02 + 0.0001 * n, steps=12)
    assert widths[:2] == [0, 4]
    for t in range(2, len(widths)):
        assert widths[t] <= 2 * max(1, *widths[:t]) + 1, widths  # (+1: an exploration token)
    assert widths[2] <= 9 and max(widths) >= 24, widths


def test_cheap_verification_drafts_everything_useful():
    """A GPU-like cost (flat in N) and good acceptance: draft up to what each row has."""
    p = load("adaptive")
    caps = [8, 3, 0, 6]
    rates = simulate(p, [0.9, 0.8, 0.5, 0.7], caps, lambda n: 0.010 + 1e-6 * n)
    assert (
        p.draft_lengths(
            DraftContext(prompts=[0, 1, 2, 3], caps=caps, drafter="ngram", available=caps)
        )
        == caps
    )
    assert rates[-1] > 2.0 * rates[0]


def test_compute_bound_and_poor_drafts_stop_drafting():
    """Cost proportional to tokens and little acceptance: plain decoding wins."""
    p = load("adaptive")
    rates = simulate(p, [0.2] * 8, [6] * 8, lambda n: 0.002 * n)
    plain = 8 / (0.002 * 8)
    assert sum(rates[5:]) / len(rates[5:]) >= 0.95 * plain


def test_per_row_lengths_follow_per_row_acceptance():
    p = load("adaptive")
    caps = [10, 10, 10]

    def cost(n):
        return 0.05 + 0.004 * n  # moderately compute-bound

    simulate(p, [0.95, 0.5, 0.05], caps, cost, steps=80)
    p.pace.clear()  # rows as critical as each other (as before any pulls ahead)
    ctx = DraftContext(
        prompts=[0, 1, 2], caps=caps, drafter="ngram", available=caps, match_len=[2] * 3
    )
    ks = p.draft_lengths(ctx)
    assert ks[0] > ks[1] >= ks[2] and ks[2] <= 1


def test_rows_ahead_of_the_slowest_draft_less():
    """A row far ahead of the slowest is off the batch's critical path: its drafts would
    mostly cost, so it gets fewer than an equally good row that is behind."""
    p = load("adaptive")
    simulate(p, [0.8, 0.8], [8, 8], lambda n: 0.05 + 0.004 * n, steps=40)
    p.pace = {0: 1.0, 1: 1.0}
    ctx = DraftContext(
        prompts=[0, 1], caps=[10, 60], drafter="ngram", available=[8, 8], match_len=[2, 2]
    )
    ks = p.draft_lengths(ctx)
    assert ks[1] > ks[0]


def test_no_probes_where_no_acceptance_could_pay():
    """Batch 8 on the CPU's staircase (a 9-token pass costs +28% of an 8-token one, 16
    tokens what 9 do), rows ending together, the n-gram lookup finding something for a
    row one step in five: one row's token cannot pay whatever its acceptance (here 0.9),
    so the policy must not spend its probe budget learning it (it did: 1-3% lost)."""

    def stair(n):
        return 0.060 if n <= 8 else 0.077 if n <= 16 else 0.077 + 0.004 * (n - 16)

    for seed in range(3):
        plain = makespan(None, [0.9] * 8, 64, stair, seed=seed, noise=0.05)
        ours = makespan(load("adaptive"), [0.9] * 8, 64, stair, seed=seed, noise=0.05, avail=0.2)
        assert plain / ours > 0.993, (seed, plain / ours)


def makespan(policy, alphas, budget, cost, seed=0, avail=1.0, noise=0.0) -> float:
    """A static batch as ``generate`` runs it: every row needs ``budget`` tokens, the batch
    runs until the last is done, a step of ``N`` tokens costs ``cost(N)`` seconds times
    a noise factor (a slow drift and per-step jitter, both of relative size ``noise``);
    each step the n-gram lookup finds up to 8 tokens for a row with probability
    ``avail``. ``policy=None`` decodes plainly. Returns the batch's seconds."""
    rng, jitter = random.Random(seed), random.Random(seed + 1)
    left = {r: budget for r in range(len(alphas))}
    total, step, drift = 0.0, 0, 0.0
    while left:
        rows = sorted(left)
        found = [8 if rng.random() < avail else 0 for _ in rows]
        caps = [min(left[r] - 1, f) for r, f in zip(rows, found)]
        ks = [0] * len(rows)
        if policy is not None:
            ctx = DraftContext(
                prompts=rows,
                caps=[left[r] - 1 for r in rows],
                drafter="ngram",
                available=caps,
                match_len=[2 if c else 0 for c in caps],
                step=step,
            )
            ks = policy.draft_lengths(ctx)
            assert all(0 <= k <= c for k, c in zip(ks, caps))
        accepted = []
        for k, r in zip(ks, rows):
            x = 0
            while x < k and rng.random() < alphas[r]:
                x += 1
            accepted.append(x)
        drift = 0.9 * drift + 0.44 * noise * jitter.gauss(0, 1)  # stationary sd = noise
        seconds = cost(sum(1 + k for k in ks)) * math.exp(drift + noise / 3 * jitter.gauss(0, 1))
        total += seconds
        if policy is not None:
            policy.update(
                StepRecord(
                    draft_length=max(ks),
                    accepted=accepted,
                    drafted=ks,
                    verify_seconds=seconds,
                    prompts=rows,
                    verify_tokens=sum(1 + k for k in ks),
                )
            )
        for r, x in zip(rows, accepted):
            left[r] -= x + 1
            if left[r] <= 0:
                del left[r]
        step += 1
    return total


COSTS = {  # (seconds per pass, seconds per token, relative noise of a step's time)
    "memory-bound": (0.02, 1e-5, 0.03),  # a GPU: extra tokens nearly free, steady steps
    "cpu-like": (0.06, 0.0025, 0.15),  # the embedded 135M model on a shared 2-core CPU
    "compute-bound": (0.005, 0.002, 0.15),  # nothing to amortise: a token is 40% of a pass
}


@settings(max_examples=20, deadline=None)
@given(
    alphas=st.lists(st.floats(0.0, 0.95), min_size=1, max_size=12),
    regime=st.sampled_from(sorted(COSTS)),
    budget=st.integers(32, 64),
    avail=st.sampled_from([0.3, 0.7, 1.0]),
)
@example(alphas=[0.9, 0.1, 0.4, 0.05] * 4, regime="cpu-like", budget=64, avail=0.7)
@example(alphas=[0.3] * 8, regime="compute-bound", budget=64, avail=1.0)
def test_a_batch_never_finishes_much_later_than_plain_decoding(alphas, regime, budget, avail):
    """What ``generate`` runs, with noisy step times: whatever the rows' acceptance and
    the cost regime, the policy's batch takes at most 7% longer than plain decoding's
    (the mean over three seeds), from 32 tokens. The worst cases hypothesis finds are
    a row that never accepts beside one that accepts most (~5-6%: the first learns from
    the second that drafts might pay, and on a CPU a token costs only 4% of a step); a
    structured sweep of the same simulator (GPU-like, CPU-like and compute-bound costs,
    batch 1-16, acceptance 0.1-0.85 and mixed) stays within 3%. What the policy spends
    to measure (a step with a token per row, a first token per row) weighs more in
    shorter generations (up to ~10% at 16 tokens)."""
    fixed, per_token, noise = COSTS[regime]

    def cost(n):
        return fixed + per_token * n

    plain = [makespan(None, alphas, budget, cost, s, avail, noise) for s in range(3)]
    ours = [makespan(AdaptivePolicy(), alphas, budget, cost, s, avail, noise) for s in range(3)]
    assert sum(ours) <= 1.07 * sum(plain)


@pytest.mark.parametrize("regime", ["memory-bound", "cpu-like"])
def test_a_batch_of_good_drafts_finishes_much_sooner(regime):
    fixed, per_token, noise = COSTS[regime]

    def cost(n):
        return fixed + per_token * n

    alphas = [0.9, 0.85, 0.8, 0.9]
    plain = sum(makespan(None, alphas, 64, cost, s, 0.7, noise) for s in range(3))
    ours = sum(makespan(AdaptivePolicy(), alphas, 64, cost, s, 0.7, noise) for s in range(3))
    assert ours < 0.7 * plain


def test_a_wide_batch_of_good_drafts_on_a_cpu_keeps_drafting():
    """16 like rows on a CPU (a token costs 4% of a pass, steps noisy): one drafted token
    per row pays (0.8 acceptance), but a pass verifying drafts for all of them is ~25%
    dearer than a plain one. The price of a draft token measured over a single token
    (the first policy's measuring step), with the jump and slope each taken at one
    standard error up, made every plan look too dear: the policy stopped drafting after
    its second step (no gain; constant k=2 ~18% faster)."""
    fixed, per_token, noise = COSTS["cpu-like"]

    def cost(n):
        return fixed + per_token * n

    alphas = [0.8] * 16
    plain = sum(makespan(None, alphas, 64, cost, s, 0.7, noise) for s in range(3))
    ours = sum(makespan(AdaptivePolicy(), alphas, 64, cost, s, 0.7, noise) for s in range(3))
    assert ours < 0.92 * plain


class Constant:
    """Draft ``k`` tokens per row, as far as the lookup found (the oracle's candidates)."""

    def __init__(self, k):
        self.k = k

    def draft_lengths(self, ctx):
        return [min(self.k, c) for c in ctx.available]

    def update(self, stats):
        pass


@settings(max_examples=12, deadline=None)
@given(
    alpha=st.floats(0.0, 0.95),
    rows=st.integers(1, 8),
    regime=st.sampled_from(sorted(COSTS)),
)
def test_a_batch_finishes_near_the_best_constant_draft_length(alpha, rows, regime):
    """Against the best constant draft length for the batch, chosen knowing the answer
    (k in 0, 1, 2, 4, 8): at most 30% slower, what learning the costs and acceptance as
    it goes can cost in 64 tokens (its ramp-up: one measuring step, a first token per
    row, depth that grows with evidence; a token's cost seen through noisy steps). In
    a simulator sweep over these regimes it averages ~5% behind the best constant."""
    fixed, per_token, noise = COSTS[regime]

    def cost(n):
        return fixed + per_token * n

    alphas = [alpha] * rows
    best = min(
        sum(makespan(Constant(k), alphas, 64, cost, s, 0.7, noise) for s in range(3))
        for k in (0, 1, 2, 4, 8)
    )
    ours = sum(makespan(AdaptivePolicy(), alphas, 64, cost, s, 0.7, noise) for s in range(3))
    assert ours <= 1.3 * best


@settings(max_examples=25, deadline=None)
@given(
    alpha=st.floats(0.0, 0.98),
    rows=st.integers(1, 5),
    fixed=st.floats(0.005, 0.1),
    per_token=st.floats(0.0, 0.01),
    cap=st.integers(1, 6),
)
# near break-even: drafting pays 12% at the true acceptance, and a streak of rejections
# early on can make one trajectory stop drafting for a while (found by CI)
@example(alpha=0.25, rows=1, fixed=0.0625, per_token=0.0078125, cap=1)
def test_never_much_below_plain_decoding_and_near_the_optimum(alpha, rows, fixed, per_token, cap):
    """In a stationary batch of like rows (costs and acceptance fixed; rows unlike each
    other are the makespan tests' business), after the measuring steps the policy's
    choices are worth, in expectation (the mean over four seeds: one 40-step trajectory
    is a noisy sample of a policy that explores), at least 95% of plain decoding and 90%
    of the optimum."""
    alphas, caps = [alpha] * rows, [cap] * rows

    def cost(n):
        return fixed + per_token * n

    means = []
    for seed in range(4):
        late = simulate(AdaptivePolicy(), alphas, caps, cost, steps=60, seed=seed)[20:]
        means.append(sum(late) / len(late))
    mean = sum(means) / len(means)
    assert mean >= 0.95 * rows / cost(rows)
    assert mean >= 0.90 * oracle(alphas, caps, cost)


def test_draft_model_cost_limits_depth():
    """With a draft model, every extra draft pass costs: depth stays short when draft
    passes are expensive even though verification is free."""
    p = AdaptivePolicy()
    for step in range(30):
        ctx = DraftContext(prompts=[0], caps=[16], drafter="model", step=step)
        ks = p.draft_lengths(ctx)
        k = ks[0]
        acc = min(k, 3)
        p.update(
            StepRecord(
                draft_length=k,
                accepted=[acc],
                drafted=[k],
                draft_seconds=0.02 * k,
                verify_seconds=0.05,
                prompts=[0],
                verify_tokens=1 + k,
                draft_pass_tokens=[1] * k,
            )
        )
    # alpha ~ 0.75 (accepts 3, rejects the 4th); a pass costs 40% of a verify
    assert 1 <= p.draft_lengths(DraftContext(prompts=[0], caps=[16], drafter="model"))[0] <= 6


def test_with_prompts_waiting_every_rows_token_is_worth_the_same():
    """Continuous batching: while prompts wait for a slot, a freshly admitted row (far
    behind the others) is not the job's end: every row's token is worth ``c0 / (R p) +
    c1`` (the mean's gradient), where without waiting prompts the row behind is worth
    more (its tokens move the batch's end) and drafts more."""
    p = load("adaptive")
    R = 8
    simulate(p, [0.6] * R, [8] * R, lambda n: 0.05 + 0.004 * n, steps=40)
    p.pace = dict.fromkeys(range(R), 1.0)

    def ctx(waiting):
        return DraftContext(
            prompts=list(range(R)), caps=[60] + [10] * (R - 1), drafter="ngram",
            available=[8] * R, match_len=[2] * R, waiting=waiting,
        )  # fmt: skip

    alone = p.draft_lengths(ctx(0))
    assert p.values[0] > 2 * max(p.values[1:]) and alone[0] > max(alone[1:])
    p.draft_lengths(ctx(5))
    c0, c1 = p.ends(list(range(R)), [61] + [11] * (R - 1), waiting=5)[3:]
    assert p.values == pytest.approx([c0 / R + c1] * R)


def test_state_is_kept_for_the_rows_running_not_every_row_of_the_job():
    """A job of any size: 16 rows at once, one replaced by the next prompt every step,
    5000 prompts; the per-row state stays a few times the rows running."""
    policy, rng = AdaptivePolicy(), random.Random(0)
    running, nxt = list(range(16)), 16
    for step in range(5000):
        ctx = DraftContext(list(running), [8] * 16, "ngram", [rng.randrange(4) for _ in running],
                           [rng.randrange(3) for _ in running], step, 1)  # fmt: skip
        ks = policy.draft_lengths(ctx)
        accepted = [min(k, rng.randrange(3)) for k in ks]
        record = StepRecord(max(ks), accepted, ks, verify_seconds=1e-3, prompts=list(running),
                            verify_tokens=16 + sum(ks))  # fmt: skip
        policy.update(record)
        running[rng.randrange(16)], nxt = nxt, nxt + 1
    per_row = [policy.idle, policy.shallow, policy.reach, policy.pace, policy.spread]
    assert max(map(len, per_row)) <= 2 * 16 + 64, [len(d) for d in per_row]
    assert len(policy.rows) <= 4 * (2 * 16 + 64) and len(policy.own) <= 4 * (2 * 16 + 64)
    assert policy.steps == 5000 and any(ks)  # it kept deciding (and drafting)
