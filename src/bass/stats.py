"""What a generation returns: the new tokens, why each row ended, and its statistics
(:class:`GenerationStats`, one :class:`StepRecord` per step). Re-exported by
:mod:`bass.engine` and :mod:`bass`."""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field, fields

__all__ = ["FinishedRow", "GenerationResult", "GenerationStats", "StepRecord"]


@dataclass
class StepRecord:
    """One speculative step, recorded once: the statistics keep it (``stats.steps``) and
    the policy learns from it (:meth:`bass.policies.Policy.update`).

    Per active row, in the step's order (terms: docs/concepts/engine.md):
    ``prompts`` (each row's prompt index), ``drafted`` (tokens the drafter proposed,
    ``<=`` the row's length) and ``accepted`` (drafts verification kept, ``<= drafted``).
    ``draft_length``: the largest length this step (``0``: regular decoding);
    ``drafted=None`` means every row drafted ``draft_length`` tokens (records written by
    hand). ``confidence``: per row, the draft model's top-1 probability of each drafted
    token, recorded when the policy asked for an early stop (else ``None``).

    ``draft_seconds`` / ``verify_seconds``: wall time of the step's drafting and of its
    verification (the verify pass, acceptance and the step's host read);
    ``forward_seconds`` of those inside the models' passes; ``step_seconds`` the whole
    step, bass's host work included. ``verify_tokens``: real tokens of the verify pass
    (the sum over rows of ``1 + drafted``), ``padding_tokens`` tokens of no row in it
    (static-shape buckets), ``prefill_tokens`` the prompt tokens of rows just admitted
    whose prefill rode in it (their time is in ``verify_seconds``: policies that fit a
    verify pass's cost skip such steps); ``draft_pass_tokens``: the tokens each
    draft-model pass computed (empty for n-grams).

    >>> s = StepRecord(4, accepted=[1, 4, 0])
    >>> s.drafted_list(), s.max_accepted(), s.num_rows
    ([4, 4, 4], 4, 3)
    """

    draft_length: int
    accepted: Sequence[int]
    drafted: Sequence[int] | None = None
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    step: int = 0
    prompts: Sequence[int] | None = None
    verify_tokens: int = 0
    padding_tokens: int = 0
    prefill_tokens: int = 0
    draft_pass_tokens: Sequence[int] = ()
    forward_seconds: float = 0.0
    step_seconds: float = 0.0
    confidence: list[list[float]] | None = None

    def accepted_list(self) -> list[int]:
        """Each active row's accepted count as a list of Python ints."""
        return [int(c) for c in self.accepted]

    def drafted_list(self) -> list[int]:
        """Each active row's drafted count (``draft_length`` each where ``drafted`` is
        ``None``)."""
        if self.drafted is None:
            return [self.draft_length] * len(self.accepted)
        return [int(c) for c in self.drafted]

    def max_accepted(self) -> int:
        """The largest accepted count over active rows (0 when no row is active)."""
        return max(self.accepted_list(), default=0)

    @property
    def num_rows(self) -> int:
        """The number of active rows this step."""
        return len(self.accepted)

    @property
    def draft_tokens(self) -> int:
        """Tokens the draft model's passes computed this step (padding included)."""
        return sum(self.draft_pass_tokens)


@dataclass
class GenerationStats:
    """A generation's statistics (what each figure counts: docs/concepts/engine.md, "What
    the statistics count"). Each step is added once (:meth:`record`) to running totals
    (``row_steps``: active rows summed over steps; ``accepted_tokens``: their accepted
    drafts) and to two traces, one number per step (``accepted_means``: its mean accepted
    drafts per active row); its :class:`StepRecord` is kept in ``steps``, or only the
    latest one when ``keep_steps`` is false (:meth:`bass.Generator.stream`)."""

    steps: list[StepRecord] = field(default_factory=list)
    main_passes: int = 0  # main-model forward passes, prefill included
    draft_passes: int = 0  # draft-model forward passes, prefill included
    tokens_generated: int = 0
    wall_seconds: float = 0.0
    prefill_seconds: float = 0.0
    stopped_by_time_budget: bool = False
    forced_acceptance: float | None = None  # set: a systems benchmark, not real output
    rows: int = 0  # prompts in the batch
    prefill_passes: int = 0  # main-model passes of the prefill (chunks of prompt tokens)
    prefill_tokens: int = 0  # prompt tokens the main model's prefill computed
    # prompt tokens copied from another row's cache instead (a prompt's other samples)
    shared_prompt_tokens: int = 0
    backend: dict = field(default_factory=dict)  # the device tuning (bass.backends)
    # the attention implementation per pass kind, and why (what impl="auto" picked);
    # "draft <kind>": the draft model's, where it differs
    attention: dict = field(default_factory=dict)
    max_rows: int = 0  # rows generating at once (continuous batching: the cache's slots)
    kv_budget_bytes: int = 0  # the KV budget the rows at once were sized by (0: none known)
    kv_bytes_per_row: int = 0  # KV cache bytes of one slot (main and draft models)
    admissions: int = 0  # prefill waves: prompts admitted into free slots, the first included
    riding_admissions: int = 0  # of those, waves whose prefill rode in a verify pass
    keep_steps: bool = True  # false: ``steps`` holds the latest record only
    step_count: int = 0
    row_steps: int = 0
    accepted_tokens: int = 0
    drafted_tokens: int = 0  # draft tokens the rows made (accepted_tokens of them kept)
    verify_tokens: int = 0  # real tokens of the main model's decoding passes
    padding_tokens: int = 0  # tokens of no row in them (static-shape buckets)
    step_seconds: float = 0.0
    forward_seconds: float = 0.0
    draft_lengths: array = field(default_factory=lambda: array("i"))
    accepted_means: array = field(default_factory=lambda: array("d"))

    def __post_init__(self) -> None:
        steps, self.steps = self.steps, []
        for step in steps:  # statistics built from records (by hand, a replay)
            self.record(step)

    def record(self, step: StepRecord) -> None:
        """Add one step to the totals and traces (and to ``steps``, see ``keep_steps``)."""
        accepted = step.accepted_list()
        self.step_count += 1
        self.row_steps += len(accepted)
        self.accepted_tokens += sum(accepted)
        self.drafted_tokens += sum(step.drafted_list())
        self.verify_tokens += step.verify_tokens
        self.padding_tokens += step.padding_tokens
        self.step_seconds += step.step_seconds
        self.forward_seconds += step.forward_seconds
        self.draft_lengths.append(step.draft_length)
        self.accepted_means.append(sum(accepted) / len(accepted) if accepted else 0.0)
        if self.keep_steps:
            self.steps.append(step)
        else:
            self.steps[:] = [step]

    @classmethod
    def merge(cls, parts: Sequence[GenerationStats]) -> GenerationStats:
        """Several batches' statistics as one: steps and traces concatenated, counts and
        seconds summed, flags or-ed; ``forced_acceptance`` kept when every part agrees."""
        out = cls()
        for f in fields(cls):
            values = [getattr(p, f.name) for p in parts]
            if f.name == "forced_acceptance":
                merged = values[0] if values and all(v == values[0] for v in values) else None
            elif f.name in ("backend", "attention"):  # one Generator's: the same choice
                merged = values[0] if values else {}
            elif f.name in ("max_rows", "kv_budget_bytes", "kv_bytes_per_row"):
                merged = max(values, default=0)
            elif f.type in ("bool", bool):
                merged = any(values)
            else:
                merged = sum(values, start=getattr(out, f.name))
            setattr(out, f.name, merged)
        return out

    @property
    def mean_accepted(self) -> float:
        """Mean accepted draft tokens per step per active row."""
        return self.accepted_tokens / self.row_steps if self.row_steps else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.tokens_generated / self.wall_seconds if self.wall_seconds else 0.0

    @property
    def main_passes_per_token(self) -> float:
        """Main-model passes each row took part in, per token it generated (prefill
        included): 1.0 is regular decoding, lower is what speculation buys."""
        row_passes = self.rows + self.row_steps
        return row_passes / self.tokens_generated if self.tokens_generated else 0.0

    @property
    def padding_share(self) -> float:
        """Share of the main model's decoding-pass tokens that belong to no row (0 with
        packed eager passes; bucket padding with static shapes)."""
        total = self.padding_tokens + self.verify_tokens
        return self.padding_tokens / total if total else 0.0

    @property
    def host_share(self) -> float:
        """Share of the decoding steps' time spent outside the models' forward passes
        (bass's own host work: drafting lookups, packing, acceptance, bookkeeping). On
        a GPU, forward passes return before their kernels finish, so this is host time,
        not idle device time."""
        total = self.step_seconds
        return (total - self.forward_seconds) / total if total > 0 else 0.0

    def draft_length_trace(self) -> list[int]:
        return list(self.draft_lengths)

    def summary(self) -> dict:
        out = {
            "tokens_generated": self.tokens_generated,
            "wall_seconds": round(self.wall_seconds, 4),
            "tokens_per_second": round(self.tokens_per_second, 2),
            "steps": self.step_count,
            "main_passes": self.main_passes,
            "draft_passes": self.draft_passes,
            "mean_accepted_per_step_per_row": round(self.mean_accepted, 4),
            "drafted_tokens": self.drafted_tokens,
            "accepted_tokens": self.accepted_tokens,
            "main_passes_per_token": round(self.main_passes_per_token, 4),
            "draft_length_trace": self.draft_length_trace(),
            "verify_tokens": self.verify_tokens,
            "padding_share": round(self.padding_share, 4),
            "host_share": round(self.host_share, 4),
            "backend": dict(self.backend),
            "max_rows": self.max_rows,
            "kv_budget_gib": max(  # 3 decimals, or 3 digits where that would show 0
                round(self.kv_budget_bytes / 2**30, 3), float(f"{self.kv_budget_bytes / 2**30:.3g}")
            ),
            "admissions": self.admissions,
            "riding_admissions": self.riding_admissions,
            "shared_prompt_tokens": self.shared_prompt_tokens,
        }
        if self.forced_acceptance is not None:
            out["forced_acceptance"] = self.forced_acceptance
        return out


@dataclass(frozen=True)
class FinishedRow:
    """One row, handed over the moment it finishes (:meth:`bass.Generator.stream`,
    ``generate(on_finish=...)``): ``prompt`` its index among the call's prompts (with
    ``n`` samples per prompt, among its rows: sample ``prompt % n`` of ``prompt // n``),
    ``tokens`` its new token ids, ``finish_reason`` as in
    :attr:`GenerationResult.finish_reasons`, ``logprobs`` and ``prompt_logprobs`` as in
    :attr:`GenerationResult.logprobs` and :attr:`GenerationResult.prompt_logprobs`."""

    prompt: int
    tokens: list[int]
    finish_reason: str
    logprobs: list[float] | None = None
    prompt_logprobs: list[float | None] | None = None


@dataclass
class GenerationResult:
    """``sequences``: the new token ids per row, in prompt order (one row per prompt; with
    ``generate(n=)``, ``n`` rows per prompt, one after another). ``finish_reasons``: per
    row, why it ended: ``"eos"`` (an eos token, kept as the last id),
    ``"stop"`` (a stop sequence or stop string; its tokens are kept), ``"length"``
    (``max_new_tokens``) or ``"time"`` (the time budget ran out first). ``ranks``: in a
    data-parallel job (:func:`bass.distributed.generate`), the rank that generated each
    row. ``logprobs`` (``generate(logprobs=...)``; else ``None``): per row, each new
    token's log-probability under the main model, ``"raw"`` (its own distribution: what a
    forward pass over the sequence gives) or ``"processed"`` (the one the token was drawn
    from: the penalties, temperature, top-k, top-p, min-p applied; greedy decoding: the raw
    one, penalised where a penalty is given). ``prompt_logprobs``
    (``generate(prompt_logprobs=True)``; else ``None``): per row, one entry per token of its
    prompt, its log-probability under the main model's own distribution given the tokens
    before it (what a forward pass over the prompt gives), ``None`` for the first token."""

    sequences: list[list[int]]
    stats: GenerationStats
    finish_reasons: list[str] = field(default_factory=list)
    ranks: list[int] | None = None  # data-parallel jobs: the rank that generated each row
    logprobs: list[list[float]] | None = None
    prompt_logprobs: list[list[float | None]] | None = None
