"""``C(N)``, the verify-pass cost model of the ``adaptive`` policy (:class:`VerifyCost`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .base import running_mean

__all__ = ["VerifyCost"]


@dataclass
class VerifyCost:
    """``C(N)``: seconds of a verify pass computing ``N`` tokens, from measurements:
    ``c0 + c1 N``, plus ``J`` when the pass verifies drafts (any row brings more than one
    token), plus each size's own offset: a CPU's costs are a staircase no line draws. How
    each is estimated: docs/guides/policies.md ("Estimates"). ``c1`` and ``J`` are a
    least-squares fit, through the origin, of consecutive steps' differences (older pairs
    decaying by ``decay``; differences cancel the machine's drift), each used plus one
    standard error; ``c0`` follows a running average of recent steps (weight ``ema``); a
    size's offset is the running mean ``r`` (weight ``step_ema``) of its residuals against
    the line, added as ``r n / (n + 2)`` after ``n`` steps of that size.

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

    def __call__(self, tokens: int, drafting: bool = False) -> float | None:
        """The line (with its standard errors) plus the size's own offset (see the class);
        ``None`` before the first step."""
        if self.level is None:
            return None
        y = self._at(tokens, drafting)
        r, n = self.steps.get((tokens, drafting), (0.0, 0))
        y += r * n / (n + 2.0)
        return max(y, 0.25 * self.level[2])  # a pass never costs nothing
