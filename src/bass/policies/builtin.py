"""The built-in policies ``constant``, ``bass``, ``hf-heuristic`` and ``confidence``,
registered like any plugin (what each decides: docs/guides/policies.md). An update with
no active rows or ``draft_length == 0`` (an engine-forced regular step) says nothing
about acceptance.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from ..hooks import EarlyStop, Policy, StepRecord
from ..plugins import BUILTIN
from .base import OptionsMixin, option

__all__ = [
    "BUILTIN_ENTRY_POINTS",
    "BassPolicy",
    "ConfidencePolicy",
    "ConstantPolicy",
    "HFHeuristicPolicy",
]

#: name -> entry-point value of every built-in policy; ``pyproject.toml``'s
#: ``[project.entry-points."bass.policies"]`` table must list exactly these.
BUILTIN_ENTRY_POINTS: dict[str, str] = BUILTIN["bass.policies"]


def _uninformative(stats: StepRecord) -> bool:
    # no active rows, or an engine-forced regular step: nothing about acceptance
    return stats.draft_length == 0 or stats.num_rows == 0


@dataclass
class ConstantPolicy(OptionsMixin, Policy):
    """Always draft ``k`` tokens; ``k=0`` never drafts (regular autoregressive decoding,
    the baseline speculative decoding is measured against).

    >>> p = ConstantPolicy(k=3)
    >>> p.update(StepRecord(draft_length=3, accepted=[0, 1]))
    >>> p.draft_length()
    3
    """

    name: ClassVar[str] = "constant"
    k: int = option(4, "draft length of every step (0: regular decoding)", low=0)

    def draft_length(self) -> int:
        return self.k


@dataclass
class BassPolicy(OptionsMixin, Policy):
    """BASS's dynamic draft length, Algorithm 1 of arXiv 2404.15778, exactly.

    >>> p = BassPolicy()
    >>> p.draft_length()
    7
    >>> p.update(StepRecord(draft_length=7, accepted=[7, 2]))  # all accepted: 7 + 2
    >>> p.draft_length()
    9
    >>> p.update(StepRecord(draft_length=9, accepted=[3, 0]))  # max(1, 3, 9 - 1 - 0)
    >>> p.draft_length()
    8
    """

    name: ClassVar[str] = "bass"
    l0: int = option(7, "initial draft length", low=1, high="l_limit")
    l_incre: int = option(2, "increase after a step where some row accepted all", low=1)
    l_mod: int = option(10, "a decrease removes ceil(l / l_mod) (+1 if decreasing again)", low=1)
    l_limit: int = option(32, "maximum draft length", low=1)
    l: int = field(init=False)
    s: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.l = self.l0

    def draft_length(self) -> int:
        return self.l

    def update(self, stats: StepRecord) -> None:
        if _uninformative(stats):
            return
        x_max = stats.max_accepted()
        if x_max >= stats.draft_length:  # Algorithm 1: max_i x_i == l
            self.l = min(self.l + self.l_incre, self.l_limit)
            self.s = 0
        else:
            # -(-a // b) is ceil(a / b) in exact integer arithmetic.
            self.l = max(1, x_max, self.l - -(-self.l // self.l_mod) - self.s)
            self.s = 1


@dataclass
class HFHeuristicPolicy(OptionsMixin, Policy):
    """The schedule of transformers' assisted generation
    (``num_assistant_tokens_schedule="heuristic"``), batched.

    >>> p = HFHeuristicPolicy()
    >>> p.update(StepRecord(draft_length=5, accepted=[5, 5]))
    >>> p.draft_length()
    7
    >>> p.update(StepRecord(draft_length=7, accepted=[7, 6]))
    >>> p.draft_length()
    6
    """

    name: ClassVar[str] = "hf-heuristic"
    k0: int = option(5, "initial draft length", low=1, high="max_k")
    max_k: int = option(64, "maximum draft length", low=1)
    k: int = field(init=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.k = self.k0

    def draft_length(self) -> int:
        return self.k

    def update(self, stats: StepRecord) -> None:
        if _uninformative(stats):
            return
        pairs = zip(stats.accepted_list(), stats.drafted_list(), strict=True)
        if all(a >= d for a, d in pairs):
            self.k = min(self.k + 2, self.max_k)
        else:
            self.k = max(1, self.k - 1)


@dataclass
class ConfidencePolicy(OptionsMixin, Policy):
    """Per-row early exit from drafting on low draft confidence; needs no training.

    >>> p = ConfidencePolicy(k_max=6, min_top1=0.5)
    >>> p.draft_length(), p.early_stop(None)
    (6, EarlyStop(min_top1=0.5, max_entropy=None, calibration=None, floors=None))
    """

    name: ClassVar[str] = "confidence"
    k_max: int = option(8, "batch-wide draft length cap", low=1)
    min_top1: float = option(
        0.4, "stop a row when the draft's top-1 probability is below this", low=0, high=1
    )
    max_entropy: float | None = option(
        None,
        "if set, also stop when the draft's entropy (nats) exceeds this",
        kind=float,
        low=0,
        optional=True,
    )

    def draft_length(self) -> int:
        return self.k_max

    def early_stop(self, ctx) -> EarlyStop:
        return EarlyStop(min_top1=self.min_top1, max_entropy=self.max_entropy)
