"""What a generation returns: the new tokens, why each row ended, and its statistics
(:class:`GenerationStats`, one :class:`StepRecord` per step). Re-exported by
:mod:`bass.engine` and :mod:`bass`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields

__all__ = ["GenerationResult", "GenerationStats", "StepRecord"]


@dataclass
class StepRecord:
    """One speculative step: the batch-wide draft length, and per active row (``rows``
    are prompt indices) the tokens drafted and accepted."""

    draft_length: int
    rows: list[int]
    drafted: list[int]
    accepted: list[int]
    draft_seconds: float
    verify_seconds: float


@dataclass
class GenerationStats:
    steps: list[StepRecord] = field(default_factory=list)
    main_passes: int = 0  # main-model forward passes, prefill included
    draft_passes: int = 0  # draft-model forward passes, prefill included
    tokens_generated: int = 0
    wall_seconds: float = 0.0
    prefill_seconds: float = 0.0
    stopped_by_time_budget: bool = False
    forced_acceptance: float | None = None  # set: a systems benchmark, not real output
    rows: int = 0  # prompts in the batch
    prefill_passes: int = 0  # main-model passes of the prefill (rows grouped by length)

    @classmethod
    def merge(cls, parts: Sequence[GenerationStats]) -> GenerationStats:
        """Several batches' statistics as one: steps concatenated, counts and seconds
        summed, flags or-ed; ``forced_acceptance`` kept when every part agrees."""
        out = cls()
        for f in fields(cls):
            values = [getattr(p, f.name) for p in parts]
            if f.name == "forced_acceptance":
                merged = values[0] if values and all(v == values[0] for v in values) else None
            elif f.type in ("bool", bool):
                merged = any(values)
            else:
                merged = sum(values, start=getattr(out, f.name))
            setattr(out, f.name, merged)
        return out

    @property
    def mean_accepted(self) -> float:
        """Mean accepted draft tokens per step per active row."""
        counts = [a for s in self.steps for a in s.accepted]
        return sum(counts) / len(counts) if counts else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.tokens_generated / self.wall_seconds if self.wall_seconds else 0.0

    @property
    def main_passes_per_token(self) -> float:
        """Main-model passes each row took part in, per token it generated (prefill
        included): 1.0 is regular decoding, lower is what speculation buys."""
        row_passes = self.rows + sum(len(s.rows) for s in self.steps)
        return row_passes / self.tokens_generated if self.tokens_generated else 0.0

    def draft_length_trace(self) -> list[int]:
        return [s.draft_length for s in self.steps]

    def summary(self) -> dict:
        return {
            "tokens_generated": self.tokens_generated,
            "wall_seconds": round(self.wall_seconds, 4),
            "tokens_per_second": round(self.tokens_per_second, 2),
            "steps": len(self.steps),
            "main_passes": self.main_passes,
            "draft_passes": self.draft_passes,
            "mean_accepted_per_step_per_row": round(self.mean_accepted, 4),
            "main_passes_per_token": round(self.main_passes_per_token, 4),
            "draft_length_trace": self.draft_length_trace(),
            **(
                {"forced_acceptance": self.forced_acceptance}
                if self.forced_acceptance is not None
                else {}
            ),
        }


@dataclass
class GenerationResult:
    """``sequences``: the new token ids per prompt, in prompt order. ``finish_reasons``:
    per prompt, why its row ended: ``"eos"`` (an eos token, kept as the last id),
    ``"stop"`` (a stop sequence or stop string; its tokens are kept), ``"length"``
    (``max_new_tokens``) or ``"time"`` (the time budget ran out first)."""

    sequences: list[list[int]]
    stats: GenerationStats
    finish_reasons: list[str] = field(default_factory=list)
