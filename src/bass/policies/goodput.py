"""The ``goodput`` draft-length policy, after SmartSpec (arXiv 2406.14066):
docs/guides/policies.md, "How goodput chooses".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from ..hooks import Policy, StepRecord
from .base import OptionsMixin, option, running_mean

__all__ = ["GoodputPolicy", "expected_tokens"]


def expected_tokens(k: int, alpha: float) -> float:
    """Expected tokens a row gains from a step drafting ``k`` tokens, acceptance ``alpha``.

    >>> expected_tokens(0, 0.5), expected_tokens(2, 0.5), expected_tokens(3, 1.0)
    (1.0, 1.75, 4.0)
    """
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


@dataclass
class GoodputPolicy(OptionsMixin, Policy):
    """Cost-aware draft length: ``k`` in ``0..k_max`` maximising
    ``E[tokens | k, alpha] / (k * t_draft + t_verify(k))``, ``k0`` until every estimate
    is measured, one probing token after ``probe_every`` steps at 0, ties to the smaller
    ``k`` (docs/guides/policies.md, "How goodput chooses").

    >>> p = GoodputPolicy()
    >>> for k in (4, 8, 8):  # every row accepts everything: alpha = 1
    ...     p.update(StepRecord(draft_length=k, accepted=[k, k], draft_seconds=0.001 * k,
    ...                        verify_seconds=0.020 + 0.001 * k))
    >>> p.alpha, p.draft_length()
    (1.0, 8)
    """

    name: ClassVar[str] = "goodput"
    k_max: int = option(8, "largest draft length considered", low=1)
    k0: int = option(
        4, "draft length until acceptance and timings are measured", low=0, high="k_max"
    )
    ema: float = option(
        0.3,
        "weight of the newest observation in each running estimate",
        low=0,
        high=1,
        low_exclusive=True,
    )
    probe_every: int = option(8, "after this many steps at k=0, draft 1 token to re-measure", low=1)
    k: int = field(init=False)
    successes: float | None = field(init=False, default=None)
    trials: float | None = field(init=False, default=None)
    t_draft: float | None = field(init=False, default=None)
    t_verify: dict[int, float] = field(init=False, default_factory=dict)
    zero_run: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.k = self.k0

    @property
    def alpha(self) -> float | None:
        """The estimated per-token acceptance probability (``None`` until measured)."""
        if self.trials is None or self.successes is None or self.trials <= 0:
            return None
        return min(1.0, self.successes / self.trials)

    def draft_length(self) -> int:
        return self.k

    def verify_seconds(self, k: int) -> float | None:
        """Predicted verification seconds at draft length ``k`` (``None`` if unmeasured)."""
        if not self.t_verify:
            return None
        xs = [kk + 1.0 for kk in self.t_verify]
        ys = list(self.t_verify.values())
        n = len(xs)
        xm, ym = sum(xs) / n, sum(ys) / n
        sxx = sum((x - xm) ** 2 for x in xs)
        if n == 1 or sxx == 0.0:
            return ym
        b = sum((x - xm) * (y - ym) for x, y in zip(xs, ys, strict=True)) / sxx
        a = ym - b * xm
        if b < 0.0:  # more positions never verify faster: noise, use the mean
            a, b = ym, 0.0
        elif a < 0.0:  # a negative fixed cost is noise too: fit through the origin
            a, b = 0.0, sum(x * y for x, y in zip(xs, ys, strict=True)) / sum(x * x for x in xs)
        return a + b * (k + 1)

    def goodput(self, k: int) -> float | None:
        """Expected tokens per second per row at draft length ``k`` (``None`` until all
        estimates are known)."""
        alpha, verify = self.alpha, self.verify_seconds(k)
        if alpha is None or self.t_draft is None or verify is None:
            return None
        seconds = k * self.t_draft + verify
        return expected_tokens(k, alpha) / max(seconds, 1e-12)

    def best_k(self) -> int:
        """The ``k`` in ``0..k_max`` with the highest :meth:`goodput` (``k0`` while
        unknown)."""
        best, best_rate = self.k0, None
        for k in range(self.k_max + 1):
            rate = self.goodput(k)
            if rate is None:
                return self.k0
            if best_rate is None or rate > best_rate:  # strict: ties keep the smaller k
                best, best_rate = k, rate
        return best

    def update(self, stats: StepRecord) -> None:
        if stats.num_rows == 0:
            return
        k, w = stats.draft_length, self.ema
        if stats.verify_seconds > 0.0 and not stats.prefill_tokens:  # verify passes alone
            self.t_verify[k] = running_mean(self.t_verify.get(k), stats.verify_seconds, w)
        if k > 0:
            accepted, drafted = stats.accepted_list(), stats.drafted_list()
            trials = sum(x + (x < d) for x, d in zip(accepted, drafted, strict=True))
            if trials > 0:
                self.successes = running_mean(self.successes, float(sum(accepted)), w)
                self.trials = running_mean(self.trials, float(trials), w)
            passes = max(drafted)
            if stats.draft_seconds > 0.0 and passes > 0:
                self.t_draft = running_mean(self.t_draft, stats.draft_seconds / passes, w)
            self.zero_run = 0
        else:
            self.zero_run += 1
        self.k = self.best_k()
        if self.k == 0 and self.zero_run >= self.probe_every:
            # At k = 0 alpha and t_draft are frozen; one cheap probe lets them recover.
            self.k = 1
