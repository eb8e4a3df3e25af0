"""Tests of bass.policies: the step statistics, the built-in policies (``bass`` against
hand-computed traces of Algorithm 1, the others' traces, goodput's estimates), hooks
bound from protocol policies, and bounds under random input. Loading (the entry-point
registry, options) is tested in test_policy_registry.py."""

from __future__ import annotations

import math
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bass.policies import DraftContext, EarlyStop, Policy, StepRecord, bind
from bass.policies.base import capabilities
from bass.policies.builtin import (
    BassPolicy,
    ConfidencePolicy,
    ConstantPolicy,
    HFHeuristicPolicy,
)
from bass.policies.goodput import GoodputPolicy


def _step(k: int, accepted, drafted=None, **kw) -> StepRecord:
    return StepRecord(draft_length=k, accepted=accepted, drafted=drafted, **kw)


def _run(policy, steps) -> list[int]:
    """Feed each step's accepted counts (drafting the policy's current k); return the draft
    length after each update."""
    out = []
    for accepted in steps:
        policy.update(_step(policy.draft_length(), accepted))
        out.append(policy.draft_length())
    return out


# --------------------------------------------------------------------------- StepRecord


def test_step_record_helpers():
    s = _step(5, [3, 5, 0], drafted=[3, 5, 2])
    assert s.accepted_list() == [3, 5, 0]
    assert s.max_accepted() == 5
    assert s.drafted_list() == [3, 5, 2]
    assert _step(4, [1, 2]).drafted_list() == [4, 4]
    assert _step(4, []).max_accepted() == 0
    assert _step(4, []).num_rows == 0
    assert _step(2, [1], draft_pass_tokens=(3, 2)).draft_tokens == 5


# --------------------------------------------------------------------------- bass (Algorithm 1)
# Rule, after a step where row i accepted x_i of l drafted tokens:
#   max x == l: l = min(l + l_incre, l_limit), s = 0
#   else:       l = max(1, max x, l - ceil(l / l_mod) - s), s = 1


def test_bass_hand_trace_defaults():
    p = BassPolicy()  # l0=7, l_incre=2, l_mod=10, l_limit=32; s=0
    assert (p.draft_length(), p.s) == (7, 0)
    steps = [
        [7, 3],  # max 7 == 7: l = min(7 + 2, 32) = 9, s = 0
        [3, 0],  # max 3 < 9: l = max(1, 3, 9 - ceil(0.9)=1 - 0) = 8, s = 1
        [2, 2],  # max 2 < 8: l = max(1, 2, 8 - 1 - 1) = 6, s = 1
        [0, 0],  # max 0 < 6: l = max(1, 0, 6 - 1 - 1) = 4
        [0],  # max(1, 0, 4 - 1 - 1) = 2
        [0],  # max(1, 0, 2 - 1 - 1 = 0) = 1: the floor at 1
        [0],  # max(1, 0, 1 - 1 - 1 = -1) = 1: stays at the floor
        [1],  # max 1 == 1: l = min(1 + 2, 32) = 3, s = 0
        [0],  # max(1, 0, 3 - 1 - 0) = 2, s = 1 (s was reset by the increase)
    ]
    assert _run(p, steps) == [9, 8, 6, 4, 2, 1, 1, 3, 2]
    assert p.s == 1


def test_bass_hand_trace_near_limit_and_repeated_decreases():
    p = BassPolicy(l0=29)
    steps = [
        [29],  # 29 == 29: min(29 + 2, 32) = 31
        [31, 2],  # 31 == 31: min(33, 32) = 32 (capped)
        [32],  # 32 == 32: min(34, 32) = 32 (stays at the limit)
        [0, 32],  # the best row decides: 32 again
        [5, 1],  # 5 < 32: max(1, 5, 32 - ceil(3.2)=4 - 0) = 28, s = 1
        [5],  # max(1, 5, 28 - ceil(2.8)=3 - 1) = 24, s = 1: a repeated decrease is larger
        [5],  # max(1, 5, 24 - ceil(2.4)=3 - 1) = 20
        [20],  # 20 == 20: min(22, 32) = 22, s = 0
        [0],  # max(1, 0, 22 - ceil(2.2)=3 - 0) = 19, s = 1
    ]
    assert _run(p, steps) == [31, 32, 32, 32, 28, 24, 20, 22, 19]


def test_bass_hand_trace_floor_at_max_accepted():
    p = BassPolicy(l0=20)
    steps = [
        [19, 3],  # max(1, 19, 20 - ceil(2.0)=2 - 0 = 18) = 19: the floor at max x
        [17],  # max(1, 17, 19 - ceil(1.9)=2 - 1 = 16) = 17: max x again
        [3],  # max(1, 3, 17 - 2 - 1) = 14
    ]
    assert _run(p, steps) == [19, 17, 14]


def test_bass_hand_trace_custom_options():
    p = BassPolicy(l0=3, l_incre=5, l_mod=2, l_limit=10)
    steps = [
        [3],  # min(3 + 5, 10) = 8
        [8],  # min(13, 10) = 10
        [4],  # max(1, 4, 10 - ceil(10 / 2)=5 - 0) = 5, s = 1
        [1],  # max(1, 1, 5 - ceil(2.5)=3 - 1) = 1
    ]
    assert _run(p, steps) == [8, 10, 5, 1]


def test_bass_uses_batch_wide_length_and_ignores_empty_steps():
    p = BassPolicy(l0=9)
    # Row 0 stopped early and accepted all it drafted, but max x = 4 < draft_length 9:
    # a decrease, max(1, 4, 9 - 1 - 0) = 8.
    p.update(_step(9, [2, 4], drafted=[2, 9]))
    assert (p.draft_length(), p.s) == (8, 1)
    # The engine capped this step at 3 (end of generation); all accepted: grow from the
    # state, min(8 + 2, 32) = 10, not from 3.
    p.update(_step(3, [3]))
    assert (p.draft_length(), p.s) == (10, 0)
    p.update(_step(10, []))  # no active rows: nothing learned
    p.update(_step(0, [0, 0]))  # an engine-forced regular step: nothing learned
    assert (p.draft_length(), p.s) == (10, 0)


# --------------------------------------------------------------------------- other built-ins


def test_constant_policy_including_zero():
    assert ConstantPolicy().draft_length() == 4
    p = ConstantPolicy(k=0)  # regular decoding
    p.update(_step(0, [0, 0]))
    assert p.draft_length() == 0
    assert bind(p).early_stop(DraftContext([0], [4])) is None


def test_hf_heuristic_hand_trace():
    p = HFHeuristicPolicy()  # k0 = 5
    steps = [
        [5, 5],  # every row accepted all: 5 + 2 = 7
        [7, 6],  # one row did not: 7 - 1 = 6
        [6, 6],  # 6 + 2 = 8
        [0],  # 8 - 1 = 7
    ]
    assert _run(p, steps) == [7, 6, 8, 7]
    # A row that stopped early counts as all-accepted if it accepted what it drafted.
    p.update(_step(7, [3, 7], drafted=[3, 7]))
    assert p.draft_length() == 9
    low = HFHeuristicPolicy(k0=1)
    assert _run(low, [[0], [0]]) == [1, 1]  # never below 1
    high = HFHeuristicPolicy(k0=63, max_k=64)
    assert _run(high, [[63], [64]]) == [64, 64]  # 63 + 2 capped at max_k


def _keep(stop: EarlyStop, probs, survival=None):
    """What ``stop`` keeps of one draft pass over every row of ``probs``."""
    rows = torch.arange(probs.shape[0])
    survival = torch.ones(probs.shape[0], dtype=torch.float64) if survival is None else survival
    keep, conf = stop.keep(probs, survival, rows)
    assert keep.dtype == torch.bool and keep.shape == (probs.shape[0],)
    assert torch.equal(conf, probs.float().amax(-1))
    return keep.tolist()


def test_confidence_early_stop():
    p = ConfidencePolicy()  # k_max 8, min_top1 0.4, no entropy rule
    assert p.draft_length() == 8
    probs = torch.tensor(
        [
            [0.90, 0.05, 0.05],  # confident
            [0.39, 0.31, 0.30],  # top-1 below 0.4: stop
            [0.40, 0.40, 0.20],  # exactly 0.4: keep (stop strictly below)
            [0.50, 0.50, 0.00],  # entropy ln 2 = 0.693 nats
        ]
    )
    stop = bind(p).early_stop(DraftContext(prompts=[0, 1, 2, 3], caps=[8] * 4))
    assert stop == EarlyStop(min_top1=0.4)
    assert _keep(stop, probs) == [True, False, True, True]
    # Entropies: row 0 = -(0.9 ln 0.9 + 2 * 0.05 ln 0.05) = 0.394, row 2 = 1.055, row 3 = 0.693
    # (0 ln 0 counts as 0).
    strict = ConfidencePolicy(min_top1=0.0, max_entropy=0.7).early_stop(None)
    assert _keep(strict, probs) == [True, False, False, True]
    assert _keep(strict, probs.to(torch.bfloat16)) == [True, False, False, True]


def test_a_calibrated_early_stop_multiplies_each_rows_chances():
    """With a calibration (P(accepted) = a + b c per decile of the top-1 c) and per-row
    floors, a row stops once the product of its tokens' chances falls below its floor."""
    table = [(0.0, 1.0)] * 10  # P = c
    stop = EarlyStop(calibration=table, floors=[0.5, 0.3])
    probs = torch.tensor([[0.8, 0.2], [0.6, 0.4]])
    survival = torch.ones(2, dtype=torch.float64)
    assert _keep(stop, probs, survival) == [True, True]  # 0.8 >= 0.5, 0.6 >= 0.3
    assert _keep(stop, probs, survival) == [True, True]  # 0.64 >= 0.5, 0.36 >= 0.3
    assert _keep(stop, probs, survival) == [True, False]  # 0.512 >= 0.5, 0.216 < 0.3
    assert survival.tolist() == pytest.approx([0.8**3, 0.6**3])


def test_only_policies_with_an_early_stop_return_one():
    """The hooks are declared on the base class (bass.hooks.Policy) and resolved once
    (bind): policies without an early stop return None, so no draft pass reads the host."""
    ctx = DraftContext(prompts=[0], caps=[4])
    assert bind(ConfidencePolicy()).early_stop(ctx) is not None
    for cls in (ConstantPolicy, BassPolicy, HFHeuristicPolicy, GoodputPolicy):
        assert bind(cls()).early_stop(ctx) is None
    assert capabilities(ConfidencePolicy) == ["one length", "per-row early stop"]
    assert capabilities(ConstantPolicy) == ["one length"]


def test_bind_takes_policies_without_the_base_class():
    """A policy object that does not subclass Policy: its hooks are found once; what its
    early stop returns is checked."""
    seen = []

    class Mine:
        def draft_length(self):
            return 2

        def update(self, record):
            seen.append(record.step)

        def early_stop(self, ctx):
            return EarlyStop(min_top1=0.6)

    hooks = bind(Mine())
    ctx = DraftContext(prompts=[0, 1], caps=[5, 1])
    assert hooks.draft_lengths(ctx) == [2, 1]  # capped per row
    assert hooks.early_stop(ctx) == EarlyStop(min_top1=0.6)
    hooks.update(_step(2, [1, 1], step=3))
    assert seen == [3]
    with pytest.raises(TypeError, match="needs draft_length"):
        bind(object())

    class Odd(Mine):
        def early_stop(self, ctx):
            return 0.5

    with pytest.raises(ValueError, match=r"early_stop returned 0.5; expected a bass.hooks"):
        bind(Odd()).early_stop(ctx)

    class Short(Mine):
        def early_stop(self, ctx):
            return EarlyStop(calibration=[(0.0, 1.0)] * 10, floors=[0.1])

    with pytest.raises(ValueError, match="1 floors for 2 active rows"):
        bind(Short()).early_stop(ctx)


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        (dict(min_top1=math.nan), "min_top1 must be a number in [0, 1], got nan"),
        (dict(min_top1="0.5"), "min_top1 must be a number in [0, 1], got '0.5'"),
        (dict(max_entropy="x"), "max_entropy must be None or a number >= 0, got 'x'"),
        (dict(calibration=[(0.0, 1.0)] * 3, floors=[0.1]), "calibration must be 10 pairs (a, b)"),
        (dict(calibration=[(0.0, 1.0)] * 10), "calibration and EarlyStop.floors go together"),
        (dict(calibration=[(0.0, 1.0)] * 10, floors=[math.nan]), "floors must be numbers (not"),
    ],
)
def test_an_early_stop_that_cannot_work_is_refused_as_the_policys(fields, said):
    """A NaN threshold stopped every row's drafting silently; a short calibration table, a
    string threshold or floors failed deep inside the drafter, naming no policy."""
    from bass.errors import PluginError

    with pytest.raises(ValueError, match=re.escape(f"EarlyStop.{said}")):
        EarlyStop(**fields)

    class Broken(Policy):
        def draft_length(self):
            return 2

        def early_stop(self, ctx):
            return EarlyStop(**fields)

    Broken.__module__ = "another_package.policies"  # not bass's own: guarded as a plugin's
    with pytest.raises(PluginError, match=r"raised in early_stop\(\): ValueError: EarlyStop\."):
        bind(Broken()).early_stop(DraftContext(prompts=[0], caps=[4]))
    assert EarlyStop(calibration=[(0.0, 1.0)] * 10, floors=[math.inf, 0.2]).floors[0] == math.inf


def test_a_policy_changes_neither_the_caps_nor_the_steps_statistics():
    """The caps were one list the drafter's view and the policy's context shared: a policy
    widening them drafted past the cache (an IndexError in attention); update(record)
    rewrote the run's own step record."""

    class Greedy(Policy):
        def draft_lengths(self, ctx):
            ctx.caps = [50] * ctx.num_rows
            return [50] * ctx.num_rows

        def update(self, record):
            record.accepted[:] = [9] * len(record.accepted)

    Greedy.__module__ = "another_package.policies"
    hooks = bind(Greedy())
    assert hooks.draft_lengths(DraftContext(prompts=[0, 1], caps=(3, 1))) == [3, 1]
    record = StepRecord(draft_length=2, accepted=[1, 0], drafted=[2, 2])
    hooks.update(record)
    assert record.accepted == [1, 0]


# --------------------------------------------------------------------------- goodput


def _accept_alpha_08(k: int) -> list[int]:
    """Rows whose successes / trials is exactly 0.8 at draft length k (MLE alpha = 0.8):
    for k >= 5 one row accepting 4 (4 successes in 5 trials); otherwise 4 rows accepting
    all k (4k in 4k trials) and k rows rejecting at once (0 in k trials): 4k / 5k."""
    return [4] if k >= 5 else [k] * 4 + [0] * k


def _feed(policy, steps, accept, t_draft, verify_a, verify_b=0.0):
    for _ in range(steps):
        k = policy.draft_length()
        acc = accept(k) if k else [0, 0]
        policy.update(
            _step(k, acc, draft_seconds=t_draft * k, verify_seconds=verify_a + verify_b * (k + 1))
        )


def test_goodput_starts_at_k0_and_waits_for_timings():
    p = GoodputPolicy()
    assert p.draft_length() == 4
    for _ in range(5):  # an engine that reports no timings
        p.update(_step(4, [4, 1]))
    assert p.draft_length() == 4
    # MLE: row 0 4 successes in 4 trials, row 1 1 success in 2 trials -> 5 / 6.
    assert p.alpha == pytest.approx(5 / 6)
    assert GoodputPolicy(k0=0).draft_length() == 0


def test_goodput_high_alpha_cheap_draft_drafts_long():
    p = GoodputPolicy()
    _feed(p, 10, lambda k: [k, k, k], t_draft=0.001, verify_a=0.02, verify_b=0.0005)
    assert p.alpha == 1.0
    # E = k + 1 grows faster than the cost 0.0205 + 0.0015 k: k_max.
    assert p.draft_length() == 8


def test_goodput_alpha_08_and_draft_cost():
    # alpha = 0.8, verify flat at 20 ms. Goodput E(k) / (0.02 + t_draft k) with
    # E(k) = (1 - 0.8^(k+1)) / 0.2:
    #   t_draft 1 ms: k=7: 4.161 / 0.027 = 154.1, k=8: 4.329 / 0.028 = 154.6 -> 8
    #   t_draft 5 ms: k=3: 2.952 / 0.035 = 84.34, k=4: 3.362 / 0.040 = 84.04 -> 3
    cheap, costly = GoodputPolicy(), GoodputPolicy()
    _feed(cheap, 12, _accept_alpha_08, t_draft=0.001, verify_a=0.02)
    _feed(costly, 12, _accept_alpha_08, t_draft=0.005, verify_a=0.02)
    assert cheap.alpha == pytest.approx(0.8) and costly.alpha == pytest.approx(0.8)
    assert cheap.draft_length() == 8
    assert costly.draft_length() == 3
    # Drafting as costly as verifying never pays: E(k) / (k + 1) falls with k -> 0.
    same = GoodputPolicy()
    _feed(same, 12, _accept_alpha_08, t_draft=0.02, verify_a=0.02)
    assert same.draft_length() == 0


def test_goodput_alpha_zero_goes_to_zero_and_probes():
    p = GoodputPolicy(probe_every=3)
    p.update(_step(4, [0, 0], draft_seconds=0.004, verify_seconds=0.02))
    # alpha = 0: E = 1 whatever k, so the cheapest step, k = 0.
    assert p.alpha == 0.0 and p.draft_length() == 0
    seen = []
    for _ in range(8):
        k = p.draft_length()
        p.update(_step(k, [0, 0], draft_seconds=0.001 * k, verify_seconds=0.02))
        seen.append(p.draft_length())
    # Three steps at 0, then one probe at 1 (still all rejected), and so on.
    assert seen == [0, 0, 1, 0, 0, 0, 1, 0]


def test_goodput_recovers_after_probe():
    p = GoodputPolicy(probe_every=2, ema=1.0)  # ema 1: estimates are the last step
    p.update(_step(4, [0], draft_seconds=0.004, verify_seconds=0.02))
    assert p.draft_length() == 0
    p.update(_step(0, [0], verify_seconds=0.02))
    p.update(_step(0, [0], verify_seconds=0.02))
    assert p.draft_length() == 1  # the probe
    p.update(_step(1, [1], draft_seconds=0.001, verify_seconds=0.021))  # alpha now 1
    assert p.draft_length() == 8


def test_goodput_timing_estimates():
    p = GoodputPolicy(ema=1.0)
    # Rows stopped early: the longest draft (3) sets the number of draft passes.
    p.update(_step(4, [2, 1], drafted=[2, 3], draft_seconds=0.03, verify_seconds=0.023))
    assert p.t_draft == pytest.approx(0.01)
    assert p.verify_seconds(0) == pytest.approx(0.023)  # one k observed: flat
    # 0.02 + 0.001 (k + 1) at k = 4 and k = 8 -> the line extrapolates to k = 10.
    p.update(_step(4, [4], verify_seconds=0.025))
    p.update(_step(8, [4], verify_seconds=0.029))
    assert p.verify_seconds(10) == pytest.approx(0.031)
    # A negative fitted slope is noise: use the mean.
    q = GoodputPolicy()
    q.update(_step(2, [0], verify_seconds=0.03))
    q.update(_step(6, [0], verify_seconds=0.02))
    assert q.verify_seconds(8) == pytest.approx(0.025)


# --------------------------------------------------------------------------- bounds


BOUNDED = [
    # (policy class, options, lowest and highest draft length it may return)
    (ConstantPolicy, {}, 4, 4),
    (ConstantPolicy, {"k": 0}, 0, 0),
    (BassPolicy, {}, 1, 32),
    (BassPolicy, {"l0": 1, "l_incre": 3, "l_mod": 1, "l_limit": 5}, 1, 5),
    (HFHeuristicPolicy, {}, 1, 64),
    (HFHeuristicPolicy, {"k0": 2, "max_k": 3}, 1, 3),
    (ConfidencePolicy, {"k_max": 3}, 3, 3),
    (GoodputPolicy, {}, 0, 8),
    (GoodputPolicy, {"k_max": 2, "k0": 0, "probe_every": 1, "ema": 1.0}, 0, 2),
]


@settings(max_examples=60, deadline=None, database=None)
@given(case=st.sampled_from(BOUNDED), data=st.data())
def test_draft_length_stays_in_bounds(case, data):
    cls, options, lo, hi = case
    policy = cls(**options)
    assert lo <= policy.draft_length() <= hi
    for step in range(data.draw(st.integers(1, 40), label="steps")):
        k = policy.draft_length()
        # The engine may cap k (end of generation); rows may stop drafting early.
        used = data.draw(st.integers(0, k), label="used") if data.draw(st.booleans()) else k
        rows = data.draw(st.integers(0, 4), label="rows")
        drafted = [data.draw(st.integers(min(1, used), used)) for _ in range(rows)]
        accepted = [data.draw(st.integers(0, d)) for d in drafted]
        seconds = st.floats(0.0, 1.0, allow_nan=False)
        policy.update(
            StepRecord(
                draft_length=used,
                accepted=accepted,
                drafted=drafted,
                draft_seconds=data.draw(seconds),
                verify_seconds=data.draw(seconds),
                step=step,
            )
        )
        got = policy.draft_length()
        assert isinstance(got, int) and lo <= got <= hi


def test_a_policy_without_a_name_is_named_by_its_class():
    """``hooks.Policy.name`` defaults to "": errors said "policy '' (Neg)"."""
    from bass.errors import PluginOutputError

    class Neg(Policy):
        def draft_length(self):
            return -1

    with pytest.raises(PluginOutputError, match=r"^policy Neg\.draft_length\(\) returned -1;"):
        bind(Neg()).draft_lengths(DraftContext(prompts=[0], caps=[3]))


@pytest.mark.parametrize("got", [{0: 2, 1: 2}, {2, 3}, "22"], ids=["dict", "set", "str"])
def test_lengths_that_are_no_sequence_are_refused(got):
    """A dict (its keys would be read as the lengths), a set (no order) or a string: not
    one length per row in row order."""
    from bass.errors import PluginOutputError

    class Odd(Policy):
        def draft_lengths(self, ctx):
            return got

    with pytest.raises(PluginOutputError, match=r"^policy Odd\.draft_lengths returned .*expected"):
        bind(Odd()).draft_lengths(DraftContext(prompts=[0, 1], caps=[3, 3]))
