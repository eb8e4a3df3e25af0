"""The ``adaptive`` draft-length policy (bass's default) and its verify-pass cost model
``C(N)`` (:class:`VerifyCost`): docs/guides/policies.md, "How adaptive chooses".
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import ClassVar

from ..hooks import DraftContext, EarlyStop, Policy, StepRecord
from .base import OptionsMixin, option, running_mean

__all__ = ["AdaptivePolicy", "VerifyCost"]


@dataclass
class VerifyCost:
    """``C(N)``: seconds of a verify pass computing ``N`` tokens, ``c0 + c1 N``, plus ``J``
    when it verifies drafts, plus the size's own offset ``r n / (n + 2)`` (``r``: the
    running mean, weight ``step_ema``, of its ``n`` residuals against the line). ``c1`` and
    ``J``: a fit of consecutive steps' differences (pairs decaying by ``decay``), each plus
    one standard error; ``c0``: from a running average (``ema``). :meth:`more`: what a
    pass costs over another, plus one standard error of that difference. See
    docs/guides/policies.md, "Estimates".

    >>> c = VerifyCost(ema=1.0)
    >>> c.observe(4, 0.010); c.observe(12, 0.014)  # plain passes of 4 and 12 tokens
    >>> round(c(8), 3), round(c(20), 3), round(c.slope(), 4)
    (0.012, 0.018, 0.0005)
    """

    ema: float = 0.3
    decay: float = 0.95  # per informative pair (two steps that differ)
    # pseudo-pairs saying "no jump" (0.1) and "no slope" (3 tokens^2): when the sizes of
    # the drafting steps hardly vary, a cost that comes with drafting is taken for the
    # jump rather than for its few tokens (or longer drafts would look dear for good)
    ridge: float = 0.1
    ridge_slope: float = 3.0
    level: tuple[float, float, float] | None = None  # running averages: N, drafting, s
    last: tuple[int, float, float] | None = None  # the previous step: N, drafting, s
    sums: list[float] = field(default_factory=lambda: [0.0] * 5)  # dI^2 dIdN dN^2 dIdy dNdy
    pairs: int = 0  # consecutive steps that differ in size or in drafting
    noise: float | None = None  # mean squared residual of a pair against the fit
    # (tokens, drafting) -> (running mean of that size's residual against the fitted
    # line, steps seen): the staircase a line cannot draw (see ``__call__``)
    steps: dict[tuple[int, bool], tuple[float, int]] = field(default_factory=dict)
    step_ema: float = 0.3

    def observe(self, tokens: int, seconds: float, drafting: bool = False) -> None:
        if tokens <= 0 or seconds <= 0.0:
            return
        d = float(drafting)
        if self.pairs >= 2:  # a fitted line to measure against (before this step moves it)
            err = seconds - self._at(tokens, drafting, caution=False)
            m, n = self.steps.get((tokens, drafting), (err, 0))
            self.steps[(tokens, drafting)] = (running_mean(m, err, self.step_ema), n + 1)
        if self.last is not None:
            di, dn, dy = d - self.last[1], tokens - self.last[0], seconds - self.last[2]
            # the noise: how far neighbouring steps land from the fit (equal steps: their
            # difference; steps that differ once a fit exists: its residual)
            if (di, dn) == (0.0, 0) or self.pairs >= 2:
                jump, slope = self._fit()
                err = (dy - jump * di - slope * dn) ** 2
                self.noise = err if self.noise is None else running_mean(self.noise, err, 0.2)
        if self.last is not None and (tokens, d) != self.last[:2]:
            new = (di * di, di * dn, dn * dn, di * dy, dn * dy)
            self.sums = [self.decay * a + b for a, b in zip(self.sums, new, strict=True)]
            self.pairs += 1
        self.last = (tokens, d, seconds)
        if self.level is None:
            self.level = (float(tokens), d, seconds)
        else:
            self.level = tuple(
                running_mean(old, x, self.ema) for old, x in zip(self.level, (tokens, d, seconds))
            )

    def _inverse(self) -> tuple[float, float, float]:
        sii, sin, snn = self.sums[0] + self.ridge, self.sums[1], self.sums[2] + self.ridge_slope
        det = sii * snn - sin * sin
        return snn / det, -sin / det, sii / det  # (X'X + ridge)^-1: [0,0], [0,1], [1,1]

    def _fit(self) -> tuple[float, float]:
        """``(J, c1)`` by least squares, unclipped."""
        a, b, c = self._inverse()
        siy, sny = self.sums[3], self.sums[4]
        return a * siy + b * sny, b * siy + c * sny

    def _params(self, caution: bool = True) -> tuple[float, float, float]:
        """``(c0, c1, J)`` from one fit (the standard errors added unless
        ``caution=False``); all zeros before the first step."""
        if self.level is None:
            return 0.0, 0.0, 0.0
        jump = slope = 0.0
        if self.pairs:
            jump, slope = (max(0.0, x) for x in self._fit())
            if caution:  # plus their standard errors
                a, _, c = self._inverse()
                noise = self.noise or 0.0
                jump, slope = jump + math.sqrt(noise * a), slope + math.sqrt(noise * c)
        n, d, y = self.level
        return y - slope * n - jump * d, slope, jump

    def jump(self) -> float:
        """``J``: what verifying drafts adds to a pass (>= 0, plus its standard error)."""
        return self._params()[2]

    def slope(self) -> float:
        """``c1``: seconds per extra token (>= 0, plus its standard error; 0 before two
        steps that differ)."""
        return self._params()[1]

    def line(self) -> tuple[float, float]:
        """``(c0, c1)``: intercept and slope (seconds, seconds per token) of plain passes."""
        return self._params()[:2]

    def _at(self, tokens: int, drafting: bool, caution: bool = True) -> float:
        c0, c1, jump = self._params(caution)
        return c0 + c1 * tokens + (jump if drafting else 0.0)

    def more(
        self,
        tokens: int,
        drafting: bool,
        base: int,
        base_drafting: bool = False,
        caution: bool = True,
    ) -> float:
        """What a pass of ``tokens`` (verifying drafts or not) costs over one of ``base``
        tokens: the line's difference plus the sizes' own offsets, plus one standard
        error of that difference (not of each parameter: a jump and a slope fitted from
        the same steps err in opposite directions); 0 before the first step."""
        if self.level is None:
            return 0.0
        _, c1, jump = self._params(caution=False)
        dn, di = tokens - base, float(drafting) - float(base_drafting)
        y = c1 * dn + jump * di + self._offset(tokens, drafting) - self._offset(base, base_drafting)
        if self.pairs and caution:
            a, b, c = self._inverse()
            y += math.sqrt(
                max(0.0, (self.noise or 0.0) * (a * di * di + 2 * b * di * dn + c * dn * dn))
            )
        return max(0.0, y)

    def _offset(self, tokens: int, drafting: bool) -> float:
        r, n = self.steps.get((tokens, drafting), (0.0, 0))
        return r * n / (n + 2.0)

    def __call__(self, tokens: int, drafting: bool = False) -> float | None:
        """The line (with its standard errors) plus the size's own offset (see the class);
        ``None`` before the first step."""
        if self.level is None:
            return None
        y = self._at(tokens, drafting) + self._offset(tokens, drafting)
        return max(y, 0.25 * self.level[2])  # a pass never costs nothing


@dataclass
class AdaptivePolicy(OptionsMixin, Policy):
    """Per-row draft lengths that get the whole batch done soonest, 0 included (the model
    and its estimates: docs/guides/policies.md, "How adaptive chooses").

    >>> from bass.policies import DraftContext
    >>> p = AdaptivePolicy()
    >>> ctx = DraftContext(prompts=[0, 1], caps=[10, 10], drafter="ngram",
    ...                    available=[6, 0], match_len=[3, 0])
    >>> p.draft_lengths(ctx)  # first step: plain decoding, to measure C(R)
    [0, 0]
    """

    name: ClassVar[str] = "adaptive"
    k_max: int = option(32, "largest draft length of a row", low=1)
    k0: int = option(
        4,
        "base of a row's depth cap (k0 + 2 x what it accepted lately); the batch-wide length",
        low=1,
        high="k_max",
    )
    ema: float = option(
        0.3, "weight of the newest observation in each estimate", low=0, high=1, low_exclusive=True
    )
    prior_trials: float = option(
        1.0, "weight (in trials) of the drafter-wide acceptance prior", low=0, low_exclusive=True
    )
    optimism: float = option(
        0.25, "standard errors added to each acceptance estimate (exploration)", low=0
    )
    prior_alpha: float = option(0.5, "acceptance assumed before any is measured", low=0, high=1)
    margin: float = option(
        0.02, "drafting must be predicted to save this share of a plain step", low=0
    )
    probe_budget: float = option(0.03, "share of the time exploration tokens may cost", low=0)
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
    credit: float = field(init=False, default=0.0)  # seconds exploration may still cost
    widest: int = field(init=False, default=0)  # most draft tokens of any step so far
    tie_steps: ClassVar[float] = 0.5  # how uncertain a row's end is, whatever its history
    draft_step: float = field(init=False, default=0.0)  # draft-model seconds per step
    # per row, running averages: committed tokens per step and its variance
    pace: dict[int, float] = field(init=False, default_factory=dict)
    spread: dict[int, float] = field(init=False, default_factory=dict)
    clock: float | None = field(init=False, default=None)
    # a drafter that can always draft (a model), planning that costs more than ``margin``
    # of a plain step: after a plan of no drafts, the next ``hold`` steps (1, 3, 7, ... up
    # to hold_max) of the same rows draft none without planning (``held`` of them left);
    # a plan with drafts, or rows joining or leaving, ends it
    hold: int = field(init=False, default=0)
    held: int = field(init=False, default=0)
    held_rows: tuple = field(init=False, default=())
    hold_max: ClassVar[int] = 7

    def __post_init__(self) -> None:
        super().__post_init__()
        self.cost = VerifyCost(self.ema)
        self.price, self.values = math.inf, []
        self.calibration: dict[int, list[float]] = {}  # confidence decile -> [succ, trials]

    def early_stop(self, ctx: DraftContext) -> EarlyStop | None:
        """Per-row early stop from the draft model's confidence (option
        ``draft_confidence``; docs/guides/policies.md, "Draft-model confidence")."""
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
        """The shrunk mean plus ``optimism`` standard errors (docs/guides/policies.md,
        "Estimates")."""
        w = self.prior_trials
        ps, pt = self.shared.get(shared_key, (0.0, 0.0))
        # the row shrinks towards what the OTHER rows say (its own part taken out: one
        # observation counted at both levels would make one rejection look like two)
        ms, mt = self._own_part(shared_key, row_key[1])
        ps, pt = max(0.0, ps - ms), max(0.0, pt - mt)
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
        s_pp, s_pt, s_tt, s_py, s_ty, n = self.draft_fit
        if passes == 0 or n == 0:
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
        if R == 0 or not any(caps) or self.steps == 0:  # 1) plain decoding: C(R)
            return [0] * R
        if not self.cost.pairs:  # 2) a second size of pass: one token, every row
            return [int(c > 0) for c in caps]
        # depth grows with evidence (a row's first draft is one token)
        caps = [
            min(c, self.k0 + 2 * int(self.reach[row]) if row in self.reach else 1)
            for c, row in zip(caps, ctx.prompts)
        ]
        ends = self.ends(ctx.prompts, [m + 1 for m in ctx.caps], ctx.waiting)
        self.values = self.values_at(ends)
        rows = tuple(ctx.prompts)
        if self.held > 0 and ctx.available is None and rows == self.held_rows:
            self.held -= 1  # 3) a plan of no drafts holds (docs: "What deciding costs")
            ks = [0] * R
        else:
            t0 = time.perf_counter()
            rates = [self.acceptance(r, s) for r, s in zip(ctx.prompts, signal, strict=True)]
            # at most twice as wide as the widest pass measured: C beyond is an extrapolation
            ks = self.allocate(
                rates,
                caps,
                model=ctx.drafter == "model",
                values=self.values,
                limit=2 * max(1, self.widest),
                ends=ends,
            )
            # planning again at once pays unless it costs more than drafting must save
            dear = time.perf_counter() - t0 > self.margin * (self.cost(R) or math.inf)
            self.hold = min(2 * self.hold + 1, self.hold_max) if dear and not any(ks) else 0
            self.held, self.held_rows = self.hold, rows
        self.explore(ctx.prompts, ks, caps, model=ctx.drafter == "model")
        return ks

    def explore(self, rows, ks, caps, model: bool = False) -> None:
        """Exploration tokens, added to ``ks`` in place (docs/guides/policies.md,
        "Exploration")."""
        R = len(rows)
        plain = self.cost(R) or 0.0
        # an exploration token costs what one more token adds to the planned pass
        n = R + sum(ks)
        token = fair = self.cost.slope()
        if self.cost.level is not None:
            token = max(token, self.cost.more(n + 1, True, n, any(ks)))
            fair = self.cost.more(n + 1, True, n, any(ks), caution=False)
        if model and not any(ks):  # a probe in a plain step runs a draft pass of its own
            token, fair = token + self.draft_cost(1, 1), fair + self.draft_cost(1, 1)
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
            if self.values[r] < fair:
                continue  # accepted for sure, its token would not pay: nothing to learn
            self.credit -= token
            ks[r] += 1
            if idle:
                self.idle[rows[r]] = (0, self.idle[rows[r]][1] + 1)
            else:
                self.shallow[rows[r]] = 0

    def ends(self, rows, left, waiting: int = 0) -> tuple:
        """``(steps, pace, tau, c0, c1)`` (``s_r``, ``p_r``, ``tau``, ``c0``, ``c1`` of
        docs/guides/policies.md), ``left`` each row's remaining token budget; with prompts
        ``waiting`` for a slot ``tau`` is infinite (continuous batching)."""
        R = len(rows)
        c0, c1 = self.cost.line()
        # what every step costs: the verify pass's fixed part (with the jump as often as
        # steps drafted lately), bass's host work and the draft model's passes
        share = self.cost.level[1] if self.cost.level else 0.0
        c0 = max(0.0, c0) + share * self.cost.jump() + (self.t_host or 0.0) + self.draft_step
        pace = [self.pace.get(row, 1.0) for row in rows]
        steps = [n / p for n, p in zip(left, pace, strict=True)]  # expected steps to go
        # uncertainty of a row's remaining steps: left * var / pace^3 (renewal theory)
        var = [self.spread.get(row, 0.0) * n / p**3 for row, n, p in zip(rows, left, pace)]
        tau = self.tie_steps + math.sqrt(sum(var) / R) if not waiting else math.inf
        return steps, pace, tau, c0, c1

    def values_at(self, ends: tuple) -> list[float]:
        """``V_r = c0 w_r / p_r + c1`` for each row, from :meth:`ends`: what ranks the
        draft tokens and prices them for the draft-confidence stop."""
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
        """The per-row lengths ``k*`` that save the batch the most time, at most ``limit``
        tokens in all (docs/guides/policies.md, "The choice"): ``rates[r] = (a_r, c_r)``,
        ``values[r]`` what row ``r``'s token saves (default 1: a token), ``ends`` from
        :meth:`ends` (without: a plan saves the sum of its tokens' values)."""
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
        # drafting must be predicted to save a margin of a step (docs: "The choice")
        best_net, best_m, best_depth = self.margin * plain, 0, 0
        depths = range(1, max(caps) + 1) if model else [max(caps, default=0)]
        more, draft = {}, {}  # C(R + m, drafting) - C(R), and D(passes, m): pure here
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
                extra = more.get(m)
                if extra is None:
                    extra = more[m] = self.cost.more(R + m, True, R)
                if model:
                    d = draft.get((deepest, m))
                    if d is None:
                        d = draft[deepest, m] = self.draft_cost(deepest, m)
                    extra += d
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
        live = set(rows)  # every active row is in every step: one missing has finished
        if max(len(self.idle), len(self.pace)) > 2 * len(live) + 64:  # now and then: O(1)
            self._forget(live)

    def _forget(self, live: set) -> None:
        """Drop the per-row state of rows not in ``live`` (finished: a job of any size keeps
        the state of the rows running, not of every row it ran)."""
        for d in (self.idle, self.shallow, self.reach, self.pace, self.spread):
            for row in [r for r in d if r not in live]:
                del d[row]
        self.rows = {k: v for k, v in self.rows.items() if k[1] in live}  # ("first", row, sig)
        self.own = {k: v for k, v in self.own.items() if k[1] in live}  # (shared key, row)
