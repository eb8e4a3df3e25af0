"""The ``adaptive`` draft-length policy (bass's default): each row's draft length chosen to
maximise the whole batch's expected committed tokens per second, 0 included.

The model. Row ``r``'s first draft token is accepted with probability ``a_r`` and each
later one, given that the previous was, with probability ``c_r``; verification stops at
the first rejection. Drafting ``k_r`` tokens then commits in expectation

    E_r(k_r) = 1 + a_r (1 + c_r + c_r^2 + ... + c_r^(k_r - 1))

tokens (the main model always adds one). Two parameters, not one, because drafts are
either right from the start and then keep being right (text being copied, a draft
model in agreement) or wrong at once: with HumanEval prompts and n-grams, a 3-token match
gets its first token accepted ~80% of the time and a 1-token match ~20%, while a draft
whose first token was right goes on being right ~70% of the time either way. A step of
the batch costs

    T(k) = t_host + D(k) + C(N),   N = sum_r (1 + k_r)

with ``C(N)`` the verify pass's seconds as a function of the tokens it computes (a packed
pass computes exactly its real tokens), ``D(k)`` the draft cost (a draft model:
``a_d * passes + b_d * draft tokens``, passes = max_r k_r; n-grams: a host lookup, part of
``t_host``) and ``t_host`` bass's own per-step work. The policy picks

    k* = argmax_k  sum_r w_r E_r(k_r) / T(k),   0 <= k_r <= cap_r

where ``w_r`` is row ``r``'s remaining token budget over the largest in the batch: a
batch finishes with its slowest row, so a token of a row that is nearly done is worth
less than one on the critical path (and in the batch's tail, when few rows are left and
a step costs almost as much as with all of them, drafting for the lagging rows pays even
at low acceptance).

The ``j``-th draft token of row ``r`` adds ``w_r a_r c_r^(j-1)`` expected tokens,
non-increasing in ``j``, so for a given number ``M`` of draft tokens (and draft depth) the
best allocation takes the ``M`` largest of those gains; the policy scores every ``M``
(and, for a draft model, every depth) and keeps the best rate. ``k = 0`` everywhere
(plain decoding) is always a candidate, so drafting happens only when it is predicted to
pay.

Estimates, all measured online from the step statistics the engine reports:

* ``C(N)``: a running average (EMA weight ``ema``) of ``verify_seconds`` for each token
  count ``N`` seen; between seen counts it interpolates, above them it extrapolates
  with the slope of a least-squares line through them (0 if that slope is negative),
  below them it takes the smallest seen count's cost. The first step decodes plainly
  (``C(R)``) and the second drafts up to ``k0`` per row (a second point), so the line
  exists before any decision depends on it.
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

Draft-model confidence (option ``draft_confidence=1``): while drafting, a row stops
once the calibrated chance that its tokens so far are all accepted falls below the gain
of the plan's last token (the price one more token must beat). The calibration maps the
draft's top-1 probability, per decile, to the acceptance measured for it, starting from
the probability itself. It needs each pass's confidences on the host (a device sync per
draft pass), so it is off by default.

Caps: ``cap_r = min(k_max, ctx.max_draft[r], ctx.available[r], k0 + 2 m_r)``: what the
n-gram lookup found, and a depth that grows with evidence (``m_r``: what the row accepted
at its last drafting step, halved at each one since), as the paper's rule grows its length
only after drafts were accepted. A row that had something to draft but was given 0 for
``probe_every`` steps drafts one token, so its estimate cannot go stale for good; the
interval doubles while its probes do not make the allocation choose it. Likewise in
depth: a row drafting fewer tokens than its cap for ``probe_every`` steps without a
continuation trial (a 1-token draft gives none) drafts one token more, so one early
rejection cannot pin ``c_r`` low for good.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import ClassVar

from .base import DraftContext, OptionsMixin, StepStats, option

__all__ = ["AdaptivePolicy", "VerifyCost"]


def _ema(old: float | None, new: float, weight: float) -> float:
    return new if old is None else (1.0 - weight) * old + weight * new


@dataclass
class VerifyCost:
    """``C(N)``: seconds of a verify pass computing ``N`` tokens, from measurements.

    >>> c = VerifyCost(ema=1.0)
    >>> c.observe(4, 0.010); c.observe(12, 0.014)
    >>> round(c(8), 4), round(c(20), 4), c(2)
    (0.012, 0.018, 0.01)
    """

    ema: float = 0.3
    table: dict[int, float] = field(default_factory=dict)

    def observe(self, tokens: int, seconds: float) -> None:
        if tokens > 0 and seconds > 0.0:
            self.table[tokens] = _ema(self.table.get(tokens), seconds, self.ema)

    def slope(self) -> float:
        """Seconds per extra token beyond the measured counts (least squares, >= 0)."""
        xs, ys = list(self.table), list(self.table.values())
        n = len(xs)
        if n < 2:
            return 0.0
        xm, ym = sum(xs) / n, sum(ys) / n
        sxx = sum((x - xm) ** 2 for x in xs)
        b = sum((x - xm) * (y - ym) for x, y in zip(xs, ys, strict=True)) / sxx
        return max(0.0, b)

    def __call__(self, tokens: int) -> float | None:
        if not self.table:
            return None
        if tokens in self.table:
            return self.table[tokens]
        below = [n for n in self.table if n < tokens]
        above = [n for n in self.table if n > tokens]
        if not below:
            return self.table[min(above)]
        lo = max(below)
        if not above:
            return self.table[lo] + self.slope() * (tokens - lo)
        hi = min(above)
        f = (tokens - lo) / (hi - lo)
        return (1 - f) * self.table[lo] + f * self.table[hi]


@dataclass
class AdaptivePolicy(OptionsMixin):
    """Per-row draft lengths maximising the batch's expected tokens per second (see the
    module docstring for the model and its estimates).

    >>> from bass.policies import DraftContext, StepStats
    >>> p = AdaptivePolicy()
    >>> ctx = DraftContext(rows=[0, 1], max_draft=[10, 10], drafter="ngram",
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
        0.5,
        "standard errors added to each acceptance estimate (exploration)",
        kind=float,
        low=0,
    )
    prior_alpha: float = option(
        0.5, "acceptance assumed before any is measured", kind=float, low=0, high=1
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
    draft_fit: list[float] = field(init=False, default_factory=lambda: [0.0] * 6)
    t_host: float | None = field(init=False, default=None)
    steps: int = field(init=False, default=0)
    # row -> (steps at k = 0, probes since the allocation last chose the row)
    idle: dict[int, tuple[int, int]] = field(init=False, default_factory=dict)
    # row -> steps it drafted short of its cap without a continuation trial
    shallow: dict[int, int] = field(init=False, default_factory=dict)
    reach: dict[int, float] = field(init=False, default_factory=dict)  # row -> recent accepted
    last: dict[int, int] = field(init=False, default_factory=dict)  # row -> match length
    clock: float | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.cost = VerifyCost(self.ema)
        self.price = math.inf
        self.calibration: dict[int, list[float]] = {}  # confidence decile -> [succ, trials]
        self.confs: dict[int, list[float]] = {}  # this step: row position -> confidences
        self.survival: dict[int, float] = {}
        if self.draft_confidence:  # the engine looks the hook up on the instance
            self.keep_drafting = self._keep_drafting

    # ----------------------------------------------------------------- estimates

    def _rate(self, shared_key: tuple, row_key: tuple) -> float:
        """An optimistic estimate: the shrunk mean plus ``optimism`` standard errors, so a
        row whose evidence is thin gets tried (and its estimate learns) rather than
        written off by the prior."""
        w = self.prior_trials
        ps, pt = self.shared.get(shared_key, (0.0, 0.0))
        # each level shrinks towards the one above (a Beta prior of weight w): one row's
        # bad luck cannot zero the drafter-wide estimate, nor that a row's
        prior = (ps + w * self.prior_alpha) / (pt + w)
        s, t = self.rows.get(row_key, (0.0, 0.0))
        mean = (s + w * prior) / (t + w)
        bonus = self.optimism * math.sqrt(mean * (1.0 - mean) / (t + w + 1.0))
        return min(1.0, mean + bonus)

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
        caps = [min(self.k_max, m) for m in ctx.max_draft]
        if ctx.available is not None:
            caps = [min(c, a) for c, a in zip(caps, ctx.available, strict=True)]
        self.last = dict(zip(ctx.rows, signal, strict=True))
        self.confs, self.survival, self.price = {}, {}, math.inf
        if R == 0 or not any(caps):
            return [0] * R
        if self.steps == 0:  # 1) plain decoding: C(R)
            return [0] * R
        if self.steps == 1 or self.cost(R) is None:  # 2) a second point of C
            return [min(self.k0, c) for c in caps]
        rates = [self.acceptance(r, s) for r, s in zip(ctx.rows, signal, strict=True)]
        # depth grows with evidence: at most k0 + 2x what the row last accepted (decayed)
        caps = [
            min(c, self.k0 + 2 * int(self.reach.get(row, 0.0))) for c, row in zip(caps, ctx.rows)
        ]
        # a batch finishes with its slowest row: a row's tokens count in proportion to
        # how much it still has to generate (its budget against the largest)
        left = [m + 1 for m in ctx.max_draft]
        weights = [n / max(left) for n in left]
        ks = self.allocate(rates, caps, model=ctx.drafter == "model", weights=weights)
        for r, row in enumerate(ctx.rows):  # a row left out for long drafts one token:
            idle, probes = self.idle.get(row, (0, 0))  # its estimate cannot go stale
            if ks[r]:
                idle, probes = 0, 0
            elif caps[r] > 0:
                idle += 1
                # every probe_every steps, then every 2x that while its probes fail
                if idle >= self.probe_every << min(probes, 1):
                    ks[r], idle, probes = 1, 0, probes + 1
            self.idle[row] = (idle, probes)
            # the same in depth: a row drafting short of its cap never tests its
            # continuation estimate (drafting 1 token gives no continuation trial), so
            # after probe_every such steps it drafts one token more
            if 1 <= ks[r] < caps[r]:
                shallow = self.shallow.get(row, 0) + 1
                if shallow >= self.probe_every:
                    ks[r], shallow = ks[r] + 1, 0
                self.shallow[row] = shallow
        return ks

    def allocate(
        self,
        rates: list[tuple[float, float]],
        caps: list[int],
        model: bool,
        weights: list[float] | None = None,
    ) -> list[int]:
        """The per-row lengths maximising expected (weighted) tokens per second (module
        docstring), ``rates[r] = (a_r, c_r)``, ``weights[r]`` row ``r``'s tokens' worth."""
        R = len(rates)
        weights = weights or [1.0] * R
        gains = sorted(
            (
                (weights[r] * rates[r][0] * rates[r][1] ** (j - 1), r, j)
                for r in range(R)
                for j in range(1, caps[r] + 1)
            ),
            key=lambda g: (-g[0], g[2]),  # ties: a row's earlier tokens first
        )
        host = self.t_host or 0.0
        base = sum(weights)
        best_rate, best_m, best_depth = base / (host + self.cost(R)), 0, 0
        depths = range(1, max(caps) + 1) if model else [max(caps, default=0)]
        for depth in depths:
            expected, m, deepest = base, 0, 0
            for g, _, j in gains:
                if j > depth:
                    continue
                expected += g
                m += 1
                deepest = max(deepest, j)
                seconds = host + self.cost(R + m) + (self.draft_cost(deepest, m) if model else 0)
                rate = expected / max(seconds, 1e-12)
                if rate > best_rate * (1 + 1e-9):  # ties keep fewer tokens
                    best_rate, best_m, best_depth = rate, m, depth
        ks = [0] * R
        taken = 0
        self.price = math.inf  # the smallest gain taken: what one more token must beat
        for g, r, j in gains:
            if taken == best_m:
                break
            if j <= best_depth:
                ks[r] = max(ks[r], j)
                taken += 1
                self.price = g
        return ks

    # ----------------------------------------------------------------- confidence

    def _calibrated(self, conf: float) -> float:
        """P(a draft token is accepted | the draft gave it probability ``conf``): per
        confidence decile, successes over trials shrunk towards ``conf`` itself."""
        s, t = self.calibration.get(min(int(conf * 10), 9), (0.0, 0.0))
        w = self.prior_trials
        return (s + w * conf) / (t + w)

    def _keep_drafting(self, probs, index: int, rows=None):
        """Per-row early stop from the draft model's confidence (option
        ``draft_confidence``): a row goes on drafting while the calibrated chance that
        all its tokens so far are accepted is still worth the price of the plan's last
        token (``self.price``). ``rows``: each probs row's position in this step's rows."""
        import torch

        conf = probs.float().amax(dim=-1).tolist()  # host read (once per draft pass)
        rows = list(range(len(conf))) if rows is None else list(rows)
        keep = []
        for r, c in zip(rows, conf, strict=True):
            self.confs.setdefault(r, []).append(c)
            survive = self.survival.get(r, 1.0) * self._calibrated(c)
            self.survival[r] = survive
            keep.append(survive >= self.price)
        return torch.tensor(keep, device=probs.device)

    # ----------------------------------------------------------------- learning

    def update(self, stats: StepStats) -> None:
        now = time.perf_counter()
        w = self.ema
        if stats.num_rows == 0:
            return
        tokens = stats.verify_tokens or stats.num_rows + sum(stats.drafted_list())
        self.cost.observe(tokens, stats.verify_seconds)
        passes = len(stats.draft_pass_tokens)
        if self.clock is not None:  # the whole step minus the model passes' share
            host = now - self.clock - stats.verify_seconds
            if passes:  # n-gram lookups (draft_seconds without passes) are host time
                host -= stats.draft_seconds
            self.t_host = _ema(self.t_host, max(0.0, host), w)
        self.clock = now
        if passes and stats.draft_seconds > 0.0:  # draft-model passes: D's fit
            x1, x2, y = float(passes), float(sum(stats.draft_pass_tokens)), stats.draft_seconds
            obs = [x1 * x1, x1 * x2, x2 * x2, x1 * y, x2 * y, 1.0]
            self.draft_fit = [_ema(o, n, w) for o, n in zip(self.draft_fit, obs, strict=True)]
        rows = stats.rows if stats.rows is not None else range(stats.num_rows)
        pairs = zip(rows, stats.accepted_list(), stats.drafted_list(), strict=True)
        for r, (row, x, d) in enumerate(pairs):
            # draft confidence calibration: tokens before x accepted, token x rejected
            for i, c in enumerate(self.confs.get(r, ())[: min(x + 1, d)]):
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
                rs, rt = self.rows.get(own, (0.0, 0.0))
                self.rows[own] = [(1 - w / 3) * rs + succ, (1 - w / 3) * rt + trials]
            self.reach[row] = max(float(x), self.reach.get(row, 0.0) / 2)
        self.steps += 1
