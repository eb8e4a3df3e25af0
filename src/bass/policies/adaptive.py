"""The ``adaptive`` draft-length policy (bass's default): each row's draft length chosen to
finish the whole batch soonest, 0 included.

The model. Row ``r``'s first draft token is accepted with probability ``a_r`` and each
later one, given that the previous was, with probability ``c_r``; verification stops at
the first rejection. The ``j``-th draft token of row ``r`` is therefore committed with
probability ``g_rj = a_r c_r^(j-1)``, and drafting ``k_r`` tokens commits in expectation

    E_r(k_r) = 1 + g_r1 + ... + g_rk   (the main model always adds one token)

Two parameters, not one, because drafts are either right from the start and then keep
being right (text being copied, a draft model in agreement) or wrong at once: with
HumanEval prompts and n-grams, a 3-token match gets its first token accepted ~80% of the
time and a 1-token match ~20%, while a draft whose first token was right goes on being
right ~70% of the time either way.

What a step costs: ``C(N)`` seconds for a verify pass of ``N = sum_r (1 + k_r)`` tokens
(a packed pass computes exactly its real tokens), plus, with a draft model,
``D = a_d * passes + b_d * draft tokens`` (passes = max_r k_r; n-gram lookups are host
work). Locally ``C(N) = c0 + c1 N``: ``c0`` is what every pass costs (reading the
weights, bass's host work ``t_host``), ``c1`` what each token adds.

What a committed token is worth. ``generate`` returns when its slowest row is done, so
the time left is about ``c0 * max_r s_r`` (every pass until the last row finishes) plus
``c1`` per token still to compute, where ``s_r = left_r / p_r`` is the steps row ``r``
still needs (its remaining token budget over ``p_r``, the tokens it commits per step, a
running average). Which row ends last is uncertain, so the maximum is a smooth one,

    T(s) = tau log sum_r exp(s_r / tau),

``tau = 0.5 + sd`` steps, ``sd`` the spread of the rows' remaining steps
(``left_r var_r / p_r^3`` from the variance of their per-step counts). A plan that
commits ``E_r`` more tokens of row ``r`` in expectation saves

    S(k) = c0 (T(s) - T(s - E / p)) + c1 sum_r E_r,
    E_r = g_r1 + ... + g_rk_r

seconds: ``c1`` for each token no longer to compute later, and ``c0`` for each pass the
batch's end moves forward (``c0`` with a draft model includes its passes per step). In
a batch of rows that end together, one row's token moves the end by little (the others
still need their steps) while a token for every row moves it by a whole step: the
saving is not a sum over rows. A row well ahead of the slowest moves nothing (its
drafts would only cost: the batch waits for the slowest anyway), while in the batch's
tail, when few rows are left and a pass costs almost as much as with all of them,
drafting for the lagging rows pays even at low acceptance. With one row, ``S`` is
``(c0 / p + c1) E``: the familiar tokens-per-second trade-off.

Continuous batching. While prompts of the job wait for a slot (``ctx.waiting``), a row
that finishes sooner hands its slot to the next one: the job ends when all of its work is
done, at about ``c0`` times its total remaining steps spread over the ``R`` rows, and the
smooth maximum becomes the mean (``tau`` infinite): ``S(k) = c0 sum_r E_r / (R p_r) +
c1 sum_r E_r``, each row's token worth ``c0 / (R p_r) + c1`` whatever its rank. Without
it, each newly admitted row (the slowest by far) would look like the batch's end and
draw drafts for itself that only slow the others. Once no prompt waits, the rule above
applies again.

The policy picks the lengths that save the most:

    k* = argmax_k  S(k)  -  (C(R + M) - C(R))  -  D,
         M = sum_r k_r,  0 <= k_r <= cap_r

Candidates are the prefixes of the draft tokens ranked by ``V_r g_rj``, ``V_r = c0 w_r
/ p_r + c1`` the first-order value of row ``r``'s token (``w_r``: the softmax of ``s_r``
at temperature ``tau``, ``T``'s gradient); the policy scores every prefix length ``M``
(and, for a draft model, every depth), at most twice the widest pass measured so far
(``C`` beyond is an extrapolation), and keeps the best. ``k = 0`` everywhere (plain
decoding) is always a candidate, and a plan that drafts must be predicted to save
``margin`` (2%) of a plain step: choosing the best of many noisy estimates overrates it.

Estimates, all measured online from the step statistics the engine reports:

* ``C(N) = c0 + c1 N``: the slope from consecutive steps of different sizes (their
  differences cancel the machine's drift), the level from a running average of recent
  steps (:class:`VerifyCost`), plus each size's own correction (the running mean of its
  residuals against the line, shrunk by how often it was seen): on a CPU one draft
  token of a batch-1 pass costs 1.01x a plain pass and two 1.20x (matrix-vector products
  turning into matrix-matrix ones; ``bench/results/cpu_pass_cost.md``), a staircase no
  line draws. The first step decodes plainly and
  the second drafts one token for the row whose match is longest (a second size), so the
  line exists before any decision depends on it.
* ``a_r`` and ``c_r``: successes over Bernoulli trials (a row that accepted ``x`` of
  ``d`` drafted tokens had one first-token trial, a success iff ``x >= 1``, and, when
  ``x >= 1``, ``x - 1`` continuation successes in ``x - 1 + [x < d]`` trials). Each is
  estimated at two levels, each shrunk towards the level above with weight
  ``prior_trials`` (as a Beta prior would), plus ``optimism`` standard errors (rows with
  thin evidence get tried): drafter-wide (each row's observation one trial at its own
  rate, so one long copy cannot speak for every row), keyed by the drafter's own
  signal (for n-grams the length of the suffix that matched; a draft model has none),
  decayed slowly, shrunk towards ``prior_alpha``; and per row (first-token estimates per
  row and signal), decayed by ``1 - ema`` per observation.
* ``D``: ``a_d, b_d`` from a running least-squares fit of draft seconds on (passes,
  tokens); ``t_host``: the wall time between updates minus the measured draft and verify
  time.
* ``p_r`` and ``var_r``: running mean and variance of row ``r``'s committed tokens per
  step (1 plus what it accepted).

Draft-model confidence (option ``draft_confidence=1``): while drafting, a row stops
once the calibrated chance that its tokens so far are all accepted, times ``V_r``, falls
below the gain of the plan's last token (the price one more token must beat). The
calibration maps the draft's top-1 probability, per decile, to the acceptance measured
for it, starting from the probability itself. It needs each pass's confidences on the
host (a device sync per draft pass), so it is off by default.

Caps: ``cap_r = min(k_max, ctx.caps[r], ctx.available[r], k0 + 2 m_r)``: what the
n-gram lookup found, and a depth that grows with evidence (``m_r``: what the row accepted
at its last drafting step, halved at each one since), as the paper's rule grows its length
only after drafts were accepted. Exploration: a row that had something to draft but was
given 0 for ``probe_every`` steps waits to draft one token, so its estimate cannot go
stale for good (the interval doubles while its probes do not make the allocation choose
it); likewise in depth, a row drafting fewer tokens than its cap for ``probe_every``
steps without a continuation trial (a 1-token draft gives none) waits to draft one more,
so one early rejection cannot pin ``c_r`` low for good. The longest waiting goes first,
as long as exploration has cost at most ``probe_budget`` (3%) of the time, and only where
a certain acceptance would pay for the token (``V_r`` at least its price).

The tests check the policy in a simulator of ``generate`` (rows with budgets, the batch
running until the last is done, noisy step times): across GPU-like, CPU-like and
compute-bound costs, batch sizes 1-16 and acceptance from 0.1 to 0.85, it stays within
5% of plain decoding's time and gains where drafting pays.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import ClassVar

from ..hooks import DraftContext, EarlyStop, Policy, StepRecord
from .base import OptionsMixin, option, running_mean
from .verify_cost import VerifyCost

__all__ = ["AdaptivePolicy", "VerifyCost"]


@dataclass
class AdaptivePolicy(OptionsMixin, Policy):
    """Per-row draft lengths that get the whole batch done soonest, 0 included (see the
    module docstring for the model and its estimates).

    >>> from bass.policies import DraftContext
    >>> p = AdaptivePolicy()
    >>> ctx = DraftContext(prompts=[0, 1], caps=[10, 10], drafter="ngram",
    ...                    available=[6, 0], match_len=[3, 0])
    >>> p.draft_lengths(ctx)  # first step: plain decoding, to measure C(R)
    [0, 0]
    """

    name: ClassVar[str] = "adaptive"
    k_max: int = option(32, "largest draft length of a row", low=1)
    k0: int = option(4, "draft length of the second (measuring) step", low=1, high="k_max")
    ema: float = option(
        0.3,
        "weight of the newest observation in each estimate",
        kind=float,
        low=0,
        high=1,
        low_exclusive=True,
    )
    prior_trials: float = option(
        1.0,
        "weight (in trials) of the drafter-wide acceptance prior",
        kind=float,
        low=0,
        low_exclusive=True,
    )
    optimism: float = option(
        0.25,
        "standard errors added to each acceptance estimate (exploration)",
        kind=float,
        low=0,
    )
    prior_alpha: float = option(
        0.5, "acceptance assumed before any is measured", kind=float, low=0, high=1
    )
    margin: float = option(
        0.02,
        "drafting must be predicted to save this share of a plain step",
        kind=float,
        low=0,
    )
    probe_budget: float = option(
        0.03,
        "share of the time exploration tokens may cost",
        kind=float,
        low=0,
    )
    draft_confidence: int = option(
        0,
        "1: with a draft model, stop a row when its draft's confidence says the next token "
        "is not worth verifying (costs a host read per draft pass)",
        low=0,
        high=1,
    )
    probe_every: int = option(
        8, "a row left at k=0 this many steps (with something to draft) drafts 1 token", low=1
    )
    cost: VerifyCost = field(init=False)
    # [successes, trials]: ("first" | "cont", signal) drafter-wide; per row ("first", row,
    # signal) and ("cont", row)
    shared: dict[tuple, list[float]] = field(init=False, default_factory=dict)
    rows: dict[tuple, list[float]] = field(init=False, default_factory=dict)
    # each row's part of the drafter-wide sums (taken out when it is shrunk towards them):
    # (shared key, row) -> (successes, trials, index of its last observation under the key)
    own: dict[tuple, tuple[float, float, int]] = field(init=False, default_factory=dict)
    seen: dict[tuple, int] = field(init=False, default_factory=dict)  # observations per key
    draft_fit: list[float] = field(init=False, default_factory=lambda: [0.0] * 6)
    t_host: float | None = field(init=False, default=None)
    steps: int = field(init=False, default=0)
    # row -> (steps at k = 0, probes since the allocation last chose the row)
    idle: dict[int, tuple[int, int]] = field(init=False, default_factory=dict)
    # row -> steps it drafted short of its cap without a continuation trial
    shallow: dict[int, int] = field(init=False, default_factory=dict)
    reach: dict[int, float] = field(init=False, default_factory=dict)  # row -> recent accepted
    last: dict[int, int] = field(init=False, default_factory=dict)  # row -> match length
    # per row, running averages: committed tokens per step and its variance
    credit: float = field(init=False, default=0.0)  # seconds exploration may still cost
    widest: int = field(init=False, default=0)  # most draft tokens of any step so far
    tie_steps: ClassVar[float] = 0.5  # how uncertain a row's end is, whatever its history
    draft_step: float = field(init=False, default=0.0)  # draft-model seconds per step
    pace: dict[int, float] = field(init=False, default_factory=dict)
    spread: dict[int, float] = field(init=False, default_factory=dict)
    clock: float | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.cost = VerifyCost(self.ema)
        self.price, self.values = math.inf, []
        self.calibration: dict[int, list[float]] = {}  # confidence decile -> [succ, trials]

    def early_stop(self, ctx: DraftContext) -> EarlyStop | None:
        """Per-row early stop from the draft model's confidence (option
        ``draft_confidence``): a row goes on drafting while the calibrated chance that
        all its tokens so far are accepted, times what a token of the row is worth
        (``values``), still beats the plan's last token (``price``)."""
        if not self.draft_confidence:
            return None
        w = self.prior_trials  # per decile: (s + w c) / (t + w), linear in c
        table = []
        for d in range(10):
            s, t = self.calibration.get(d, (0.0, 0.0))
            table.append((s / (t + w), w / (t + w)))
        floors = [
            self.price / v if v > 0 else (0.0 if self.price <= 0 else math.inf) for v in self.values
        ]
        return EarlyStop(calibration=table, floors=floors)

    # ----------------------------------------------------------------- estimates

    def _rate(self, shared_key: tuple, row_key: tuple) -> float:
        """An optimistic estimate: the shrunk mean plus ``optimism`` standard errors, so a
        row whose evidence is thin gets tried (and its estimate learns) rather than
        written off by the prior."""
        w = self.prior_trials
        ps, pt = self.shared.get(shared_key, (0.0, 0.0))
        # the row shrinks towards what the OTHER rows say (its own part taken out of the
        # drafter-wide sums: counting one observation at both levels would make a single
        # rejection look like two)
        ms, mt = self._own_part(shared_key, row_key[1])
        ps, pt = max(0.0, ps - ms), max(0.0, pt - mt)
        # each level shrinks towards the one above (a Beta prior of weight w): one row's
        # bad luck cannot zero the drafter-wide estimate, nor that a row's
        prior = (ps + w * self.prior_alpha) / (pt + w)
        s, t = self.rows.get(row_key, (0.0, 0.0))
        mean = (s + w * prior) / (t + w)
        bonus = self.optimism * math.sqrt(mean * (1.0 - mean) / (t + w + 1.0))
        return min(1.0, mean + bonus)

    def _own_part(self, shared_key: tuple, row: int) -> tuple[float, float]:
        """Row ``row``'s share of the drafter-wide sums ``self.shared[shared_key]``,
        decayed as they were since it was added."""
        ms, mt, at = self.own.get((shared_key, row), (0.0, 0.0, 0))
        f = (1 - self.ema / 4) ** (self.seen.get(shared_key, 0) - 1 - at)
        return ms * f, mt * f

    def acceptance(self, row: int, signal: int = 0) -> tuple[float, float]:
        """Row ``row``'s estimated ``(a, c)``: first-token and continuation acceptance,
        ``signal`` the drafter's signal (n-gram match length; 0 for a draft model)."""
        first = self._rate(("first", signal), ("first", row, signal))
        return first, self._rate(("cont", 0), ("cont", row))

    def draft_cost(self, passes: int, tokens: int) -> float:
        """Predicted seconds of ``passes`` draft-model passes computing ``tokens`` tokens
        (0 for n-grams: their lookup is host time)."""
        if passes == 0:
            return 0.0
        s_pp, s_pt, s_tt, s_py, s_ty, n = self.draft_fit
        if n == 0:
            return 0.0
        det = s_pp * s_tt - s_pt * s_pt
        if abs(det) < 1e-12 * max(1.0, s_pp * s_tt):  # one configuration seen: per pass
            return passes * s_py / s_pp
        a = (s_py * s_tt - s_ty * s_pt) / det
        b = (s_ty * s_pp - s_py * s_pt) / det
        a, b = max(a, 0.0), max(b, 0.0)
        return a * passes + b * tokens

    # ----------------------------------------------------------------- decisions

    def draft_length(self) -> int:
        """The batch-wide fallback for engines without per-row lengths."""
        return self.k0

    def draft_lengths(self, ctx: DraftContext) -> list[int]:
        R = ctx.num_rows
        signal = list(ctx.match_len) if ctx.match_len is not None else [0] * R
        caps = [min(self.k_max, m) for m in ctx.caps]
        if ctx.available is not None:
            caps = [min(c, a) for c, a in zip(caps, ctx.available, strict=True)]
        self.last = dict(zip(ctx.prompts, signal, strict=True))
        self.price, self.values = math.inf, [1.0] * R
        if R == 0 or not any(caps):
            return [0] * R
        if self.steps == 0:  # 1) plain decoding: C(R)
            return [0] * R
        if not self.cost.pairs:  # 2) a second size of pass, for C's slope: one token,
            # for the row whose match is longest (the likeliest to be accepted): what the
            # first draft token of a pass costs is what decides whether to draft at all,
            # and at batch 4-16 on a CPU it is dear (+17-34% of a plain pass)
            best = max((r for r in range(R) if caps[r]), key=lambda r: signal[r])
            return [int(r == best) for r in range(R)]
        rates = [self.acceptance(r, s) for r, s in zip(ctx.prompts, signal, strict=True)]
        # depth grows with evidence: at most k0 + 2x what the row last accepted (decayed)
        # (a row's first draft is one token: what the other rows accept says little)
        caps = [
            min(c, self.k0 + 2 * int(self.reach[row]) if row in self.reach else 1)
            for c, row in zip(caps, ctx.prompts)
        ]
        ends = self.ends(ctx.prompts, [m + 1 for m in ctx.caps], ctx.waiting)
        self.values = self.values_at(ends)
        # a plan at most twice as wide as the widest pass measured: C beyond the sizes
        # seen is an extrapolation (from one measuring token, a line can miss a +100%
        # step by 4x), and at batch 4-16 on a CPU a wrong bet costs a whole step
        ks = self.allocate(
            rates,
            caps,
            model=ctx.drafter == "model",
            values=self.values,
            limit=2 * max(1, self.widest),
            ends=ends,
        )
        self.explore(ctx.prompts, ks, caps)
        return ks

    def explore(self, rows, ks, caps) -> None:
        """Exploration tokens, added to ``ks`` in place: estimates the allocation stopped
        testing would otherwise never change. A row left at 0 though it had something to
        draft for ``probe_every`` steps (then twice that while its probes fail) waits to
        draft one token; a row drafting short of its cap without a continuation trial
        (a 1-token draft gives none) for ``probe_every`` steps waits to draft one more.
        The longest waiting goes first, and only while exploration has cost at most
        ``probe_budget`` of the time (a token costs ``C(R + 1) - C(R)``); a row whose
        committed token would save less than that, ``V_r`` < price, is not probed: no
        acceptance it could show would make the allocation draft it (at batch 8 on a
        CPU, where the rows end together, such probes cost 2-3% of a generation)."""
        R = len(rows)
        plain = self.cost(R) or 0.0
        # an exploration token costs what one more token adds to the planned pass (on a
        # step that would otherwise not draft: the first draft token's price, the dearest
        # on a CPU)
        n = R + sum(ks)
        token = self.cost.slope()
        if self.cost.level is not None:
            now = self.cost(n, drafting=True) if any(ks) else plain
            token = max(token, self.cost(n + 1, drafting=True) - now)
        self.credit = min(self.credit + self.probe_budget * plain, 2 * token)
        waiting = []
        for r, row in enumerate(rows):
            idle, probes = self.idle.get(row, (0, 0))
            if ks[r]:
                idle, probes = 0, 0
            elif caps[r] > 0:
                idle += 1
            self.idle[row] = (idle, probes)
            if not ks[r] and caps[r] > 0 and idle >= self.probe_every << min(probes, 1):
                waiting.append((idle, r, True))
            if 1 <= ks[r] < caps[r]:
                shallow = self.shallow.get(row, 0) + 1
                self.shallow[row] = shallow
                if shallow >= self.probe_every:
                    waiting.append((shallow, r, False))
            else:
                self.shallow[row] = 0
        for _, r, idle in sorted(waiting, reverse=True):
            if self.credit < token:
                break
            if self.values[r] < token:
                continue  # accepted for sure, its token would not pay: nothing to learn
            self.credit -= token
            ks[r] += 1
            if idle:
                self.idle[rows[r]] = (0, self.idle[rows[r]][1] + 1)
            else:
                self.shallow[rows[r]] = 0

    def ends(self, rows, left, waiting: int = 0) -> tuple:
        """``(steps, pace, tau, c0, c1)``: each row's expected steps to go and tokens per
        step, the smooth maximum's temperature, and what a pass and a token cost (module
        docstring), ``left``: each row's remaining token budget. ``waiting`` prompts
        waiting for a slot: ``tau`` is infinite, the smooth maximum a mean (module
        docstring, continuous batching)."""
        R = len(rows)
        c0, c1 = self.cost.line()
        # what every step costs: the verify pass's fixed part (with the jump, as often
        # as steps drafted lately), bass's host work and, with a draft model, its passes
        # as drafted lately (future steps will draft too)
        share = self.cost.level[1] if self.cost.level else 0.0
        c0 = max(0.0, c0) + share * self.cost.jump() + (self.t_host or 0.0) + self.draft_step
        pace = [self.pace.get(row, 1.0) for row in rows]
        steps = [n / p for n, p in zip(left, pace, strict=True)]  # expected steps to go
        # uncertainty of a row's remaining steps: left * var / pace^3 (renewal theory)
        var = [self.spread.get(row, 0.0) * n / p**3 for row, n, p in zip(rows, left, pace)]
        tau = self.tie_steps + math.sqrt(sum(var) / R) if not waiting else math.inf
        return steps, pace, tau, c0, c1

    def values_at(self, ends: tuple) -> list[float]:
        """``V_r``: the first-order seconds one more committed token of each row saves the
        batch (module docstring), from :meth:`ends`: ``c0 w_r / p_r + c1``, ``w_r`` the
        chance that row ``r`` is the last to finish (``1 / R`` each while prompts wait).
        They rank the draft tokens (and price them for the draft-confidence stop);
        :meth:`allocate` scores plans jointly from :meth:`ends`."""
        steps, pace, tau, c0, c1 = ends
        R = len(steps)
        top = max(steps)
        w = [math.exp((s - top) / tau) for s in steps]  # tau infinite: 1 each
        z = sum(w)
        # a quarter of each row's share is kept whatever its rank: which row ends last is
        # less certain than the softmax says (a row that stops drafting slows down), and
        # where tokens are nearly free the allocation should not turn on noise
        return [c0 * (0.75 * wr / z + 0.25 / R) / p + c1 for wr, p in zip(w, pace, strict=True)]

    def allocate(
        self,
        rates: list[tuple[float, float]],
        caps: list[int],
        model: bool,
        values: list[float] | None = None,
        limit: int | None = None,
        ends: tuple | None = None,
    ) -> list[int]:
        """The per-row lengths that save the batch the most time (module docstring),
        ``rates[r] = (a_r, c_r)``, ``values[r]`` the seconds a committed token of row ``r``
        saves (1 each when not given: then the unit is a token), at most ``limit`` draft
        tokens in all. With ``ends = (steps, pace, tau, c0, c1)`` (:meth:`ends`)
        a plan's saving is evaluated jointly: ``c0`` times the drop of the batch's end,
        a smooth maximum ``tau log sum_r exp(s_r / tau)`` of the rows' remaining steps
        ``s_r`` (each moved forward by its expected committed tokens over ``p_r``), plus
        ``c1`` per token. A lone row's token in a batch of rows that end together saves
        little, every row's token together a whole step: values added row by row
        (``values``) cannot tell the two apart."""
        R = len(rates)
        values = values or [1.0] * R
        gains = sorted(  # (value, row, position, probability it is committed)
            (
                (values[r] * prob, r, j, prob)
                for r in range(R)
                for j in range(1, caps[r] + 1)
                for prob in (rates[r][0] * rates[r][1] ** (j - 1),)
            ),
            key=lambda g: (-g[0], g[2]),  # ties: a row's earlier tokens first
        )
        if ends is not None:
            steps, pace, tau, c0, c1 = ends
            top = max(steps)
            mean = math.isinf(tau)  # prompts wait: the end moves by the mean of the steps
            terms0 = [] if mean else [math.exp((s - top) / tau) for s in steps]
            z0 = sum(terms0)
        plain = self.cost(R)
        # drafting must be predicted to save a margin of a step: the best of many noisy
        # estimates is biased upwards, and a step mispredicted costs for real
        best_net, best_m, best_depth = self.margin * plain, 0, 0
        depths = range(1, max(caps) + 1) if model else [max(caps, default=0)]
        for depth in depths:
            saved, m, deepest = 0.0, 0, 0
            if ends is not None:
                terms, z, committed, total, moved = list(terms0), z0, [0.0] * R, 0.0, 0.0
            for g, r, j, prob in gains:
                if j > depth:
                    continue
                if limit is not None and m >= limit:
                    break
                if ends is None:
                    saved += g
                elif mean:  # every row's step saved counts 1 / R of a pass
                    total += prob
                    moved += prob / pace[r] / R
                    saved = c0 * moved + c1 * total
                else:  # the smooth maximum's drop, updated one row's term at a time
                    committed[r] += prob
                    total += prob
                    new = math.exp((steps[r] - committed[r] / pace[r] - top) / tau)
                    z += new - terms[r]
                    terms[r] = new
                    saved = c0 * tau * math.log(z0 / z) + c1 * total
                m += 1
                deepest = max(deepest, j)
                extra = self.cost(R + m, drafting=True) - plain
                if model:
                    extra += self.draft_cost(deepest, m)
                if saved - extra > best_net * (1 + 1e-9):  # ties keep fewer tokens
                    best_net, best_m, best_depth = saved - extra, m, depth
        ks = [0] * R
        taken = 0
        self.price = math.inf  # the smallest gain taken: what one more token must beat
        for g, r, j, _ in gains:
            if taken == best_m:
                break
            if j <= best_depth:
                ks[r] = max(ks[r], j)
                taken += 1
                self.price = g
        return ks

    # ----------------------------------------------------------------- learning

    def update(self, stats: StepRecord) -> None:
        now = time.perf_counter()
        w = self.ema
        if stats.num_rows == 0:
            return
        drafted = stats.drafted_list()
        tokens = stats.verify_tokens + stats.padding_tokens or stats.num_rows + sum(drafted)
        self.widest = max(self.widest, sum(drafted))
        if not stats.prefill_tokens:  # a pass that prefilled prompts too: not a verify cost
            self.cost.observe(tokens, stats.verify_seconds, any(drafted))
        passes = len(stats.draft_pass_tokens)
        if self.clock is not None:  # the whole step minus the model passes' share
            host = now - self.clock - stats.verify_seconds
            if passes:  # n-gram lookups (draft_seconds without passes) are host time
                host -= stats.draft_seconds
            self.t_host = running_mean(self.t_host, max(0.0, host), w)
        self.clock = now
        if passes:
            self.draft_step = running_mean(self.draft_step, stats.draft_seconds, w)
        if passes and stats.draft_seconds > 0.0:  # draft-model passes: D's fit
            x1, x2, y = float(passes), float(sum(stats.draft_pass_tokens)), stats.draft_seconds
            obs = [x1 * x1, x1 * x2, x2 * x2, x1 * y, x2 * y, 1.0]
            self.draft_fit = [
                running_mean(o, n, w) for o, n in zip(self.draft_fit, obs, strict=True)
            ]
        rows = stats.prompts if stats.prompts is not None else range(stats.num_rows)
        pairs = zip(rows, stats.accepted_list(), drafted, strict=True)
        for r, (row, x, d) in enumerate(pairs):
            # draft confidence calibration: tokens before x accepted, token x rejected
            confs = stats.confidence[r] if stats.confidence is not None else ()
            for i, c in enumerate(confs[: min(x + 1, d)]):
                cs, ct = self.calibration.get(min(int(c * 10), 9), (0.0, 0.0))
                self.calibration[min(int(c * 10), 9)] = [cs + (i < x), ct + 1.0]
            if d == 0:
                continue
            sig = self.last.get(row, 0)
            obs = [(("first", sig), ("first", row, sig), float(x >= 1), 1.0)]
            if x >= 1 and (x > 1 or x < d):  # continuation trials after a first success
                obs.append((("cont", 0), ("cont", row), x - 1.0, x - 1.0 + (x < d)))
                self.shallow[row] = 0
            for shared, own, succ, trials in obs:
                # drafter-wide: each row's observation weighs one trial (its own rate), so
                # one row's long copy cannot speak for every row; per row: every token
                ps, pt = self.shared.get(shared, (0.0, 0.0))
                self.shared[shared] = [(1 - w / 4) * ps + succ / trials, (1 - w / 4) * pt + 1.0]
                n = self.seen.get(shared, 0)  # this observation's index under the key
                ms, mt = self._own_part(shared, row)
                f = 1 - w / 4  # one more decay: this observation's
                self.own[(shared, row)] = (f * ms + succ / trials, f * mt + 1.0, n)
                self.seen[shared] = n + 1
                rs, rt = self.rows.get(own, (0.0, 0.0))
                self.rows[own] = [(1 - w / 6) * rs + succ, (1 - w / 6) * rt + trials]
            self.reach[row] = max(float(x), self.reach.get(row, 0.0) / 2)
        for row, x in zip(rows, stats.accepted_list(), strict=True):  # pace and its spread
            pace = self.pace.get(row, 1.0)
            self.spread[row] = running_mean(self.spread.get(row), (1.0 + x - pace) ** 2, w)
            self.pace[row] = running_mean(pace, 1.0 + x, w)
        self.steps += 1
