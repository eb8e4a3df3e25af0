"""``C(N)``, the verify-pass cost model of the ``adaptive`` policy (:class:`VerifyCost`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .base import running_mean

__all__ = ["VerifyCost"]


@dataclass
class VerifyCost:
    """``C(N)``: seconds of a verify pass computing ``N`` tokens, from measurements:
    ``c0 + c1 N``, plus ``J`` when the pass verifies drafts (any row brings more than
    one token).

    ``J`` is there because a pass of one token per row and a longer one may run
    different kernels: on a CPU with torch's ``F.linear`` a batch of one row decodes
    through matrix-vector products, and its first draft token turns them into
    matrix-matrix ones (+45% for the embedded model on 2 cores; with
    :mod:`bass.cpu_linear`'s layouts, the default, +1%, and each further token ~+7%).

    ``c1`` and ``J`` come from consecutive steps: a least-squares fit, through the
    origin, of each step's change in seconds on its change in tokens and in drafting
    (older pairs decaying by ``decay``). A machine's speed drifts (on a shared 2-core
    CPU a step's time wanders 10-15% over tens of steps while a token adds ~4%), and
    differences of neighbouring steps cancel the drift that a fit through all points
    would mistake for a slope, or for none. Each is used plus one standard error (from
    the pairs' residuals): a cost that noise hides is not taken for free; on steady
    steps (a GPU) the error is small. The level ``c0`` follows a running average of
    recent steps (weight ``ema``), so the line follows the drift.

    A line cannot draw a staircase, and a CPU's costs are one: with
    :mod:`bass.cpu_linear`'s layouts a batch-1 pass of 2 tokens costs +1% over 1 token and
    one of 3 tokens +20%; at batch 8, 9 to 12 tokens cost the same (+9-14%). So each size
    ``(N, drafting)`` keeps its own correction: a running mean ``r`` (weight ``step_ema``) of
    its residuals against the fitted line (without the standard errors: a size's offset,
    not the line's caution), added as ``r n / (n + 2)`` after ``n`` steps of that size.
    A size never seen stays on the line; residuals are only taken once two pairs exist
    (before that the line is a guess).

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
        """``J``: what verifying drafts adds to a pass besides the tokens (>= 0; plus its
        standard error)."""
        return self._params()[2]

    def slope(self) -> float:
        """``c1``: seconds per extra token (>= 0; 0 before two steps that differ; plus
        its standard error)."""
        return self._params()[1]

    def line(self) -> tuple[float, float]:
        """``(c0, c1)``: intercept and slope (seconds, seconds per token) of plain passes."""
        return self._params()[:2]

    def _at(self, tokens: int, drafting: bool, caution: bool = True) -> float:
        c0, c1, jump = self._params(caution)
        return c0 + c1 * tokens + (jump if drafting else 0.0)

    def __call__(self, tokens: int, drafting: bool = False) -> float | None:
        """The line (with its caution) plus the size's own correction: the running mean
        ``r`` of its residuals against the fitted line, weighted ``n / (n + 2)`` after
        ``n`` steps of that size (a size seen once or twice is mostly noise)."""
        if self.level is None:
            return None
        y = self._at(tokens, drafting)
        r, n = self.steps.get((tokens, drafting), (0.0, 0))
        y += r * n / (n + 2.0)
        return max(y, 0.25 * self.level[2])  # a pass never costs nothing
