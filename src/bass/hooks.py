"""Every hook a plugin implements, declared once with its default, and the data each
exchanges with the engine's step. A policy subclasses :class:`Policy`, a drafter
:class:`Drafter`; another package registers either under an entry-point group
(``bass.policies``, ``bass.drafters``) and :mod:`bass.plugins` loads it, checked, with
every hook's failure reported as its own. When each hook is called, and the terms (slot,
active rows, cap, length, drafted, accepted): docs/concepts/engine.md.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

import torch

from .sampling import SamplingParams
from .stats import StepRecord

if TYPE_CHECKING:
    from .batch_state import BatchState
    from .passes import Passes
    from .repetition import SeenTokens

__all__ = [
    "DraftContext",
    "Drafter",
    "EarlyStop",
    "Offer",
    "Policy",
    "Proposal",
    "StepRecord",
    "StepView",
]


@dataclass
class Offer:
    """What a drafter has for each active row before the policy decides (n-gram lookup:
    the continuation it found), handed back to its :meth:`Drafter.propose` in
    ``view.offer``: ``tokens[r]`` (at most the row's cap) and ``match_len[r]`` (the
    matched suffix's length, 0: none)."""

    tokens: list[list[int]]
    match_len: list[int]


@dataclass
class DraftContext:
    """What a policy knows before a step, for :meth:`Policy.draft_lengths` and
    :meth:`Policy.early_stop`.

    Attributes:
        prompts: each active row's prompt index (stable while slots are compacted).
        caps: per row, the most tokens it may draft.
        drafter: the drafter's ``name`` (``"ngram"``, ``"model"``, yours).
        available: per row, the tokens the drafter has to offer (an n-gram continuation),
            or ``None`` when it can draft any number (a model).
        match_len: per row, the length of the n-gram suffix that matched (0: none), or
            ``None``.
        step: 0-based index of the step.
        waiting: prompts of the job still waiting for a slot (continuous batching: a row
            that finishes meanwhile frees its slot for the next).

    >>> DraftContext(prompts=[0, 2], caps=[8, 3]).num_rows
    2
    """

    prompts: Sequence[int]
    caps: Sequence[int]
    drafter: str = "model"
    available: Sequence[int] | None = None
    match_len: Sequence[int] | None = None
    step: int = 0
    waiting: int = 0

    @property
    def num_rows(self) -> int:
        return len(self.prompts)


def _real(x) -> bool:
    """A finite real number (a bool is not one)."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)


@dataclass(frozen=True)
class EarlyStop:
    """A per-row early stop that a drafter drawing from distributions (a draft model)
    applies while it drafts, returned by :meth:`Policy.early_stop` as data.

    With ``c`` the top-1 probability of the distribution a row's next draft token comes
    from, the row stops (that token is not proposed, and the row drafts nothing more this
    step) when ``c < min_top1``; or when its entropy (nats) exceeds ``max_entropy``; or,
    with ``calibration`` (10 pairs ``(a, b)``, one per decile of ``c``: the chance the
    token is accepted is ``a + b * c``) and ``floors`` (one per active row), when the
    product of those chances over the row's drafts so far falls below ``floors[r]``.
    Every row drafted is recorded with its tokens' ``c`` (``StepRecord.confidence``).
    """

    min_top1: float = 0.0
    max_entropy: float | None = None
    calibration: Sequence[tuple[float, float]] | None = None
    floors: Sequence[float] | None = None

    def keep(self, probs: torch.Tensor, survival: torch.Tensor, rows: torch.Tensor):
        """bool ``[R']``: which rows ``rows`` (int64 ``[R']``, positions among the
        step's active rows) keep the token they drew from ``probs`` ``[R', V]``;
        ``survival`` float64 ``[R]`` (ones at the step's start) is updated in place.
        Also returns the tokens' top-1 probabilities ``[R']``. No host read."""
        p = probs.float()
        conf = p.amax(dim=-1)
        keep = conf >= self.min_top1
        if self.max_entropy is not None:  # entr(p) = -p ln p, 0 at p = 0
            keep &= torch.special.entr(p).sum(dim=-1) <= self.max_entropy
        if self.calibration is not None and self.floors is not None:
            table, floors = self._tables(p.device)
            ab = table[(conf.double() * 10).long().clamp(0, 9)]  # [R', 2]
            chance = (ab[:, 0] + ab[:, 1] * conf.double()).clamp(0, 1)
            survival[rows] *= chance
            keep &= survival[rows] >= floors[rows]
        return keep, conf

    def __post_init__(self) -> None:  # frozen lists too: keep()'s tensors are made once
        # checked here, in the policy's own hook (a NaN threshold stopped every row
        # silently; a short table failed deep in a drafter)
        if not _real(self.min_top1) or not 0 <= self.min_top1 <= 1:
            raise ValueError(
                f"EarlyStop.min_top1 must be a number in [0, 1], got {self.min_top1!r}"
            )
        if self.max_entropy is not None and not (_real(self.max_entropy) and self.max_entropy >= 0):
            raise ValueError(
                f"EarlyStop.max_entropy must be None or a number >= 0, got {self.max_entropy!r}"
            )
        if (self.calibration is None) != (self.floors is None):
            raise ValueError(
                "EarlyStop.calibration and EarlyStop.floors go together (the chances, and the "
                "floor each row's product of chances must stay above): give both or neither"
            )
        if self.calibration is not None:
            pairs = tuple(map(tuple, self.calibration))
            if len(pairs) != 10 or not all(len(ab) == 2 and all(map(_real, ab)) for ab in pairs):
                raise ValueError(
                    "EarlyStop.calibration must be 10 pairs (a, b) of numbers, one per decile "
                    f"of the top-1 probability, got {self.calibration!r}"
                )
            object.__setattr__(self, "calibration", pairs)
        if self.floors is not None:
            floors = tuple(self.floors)
            if not all(_real(f) or f in (math.inf, -math.inf) for f in floors):  # inf: stop
                raise ValueError(f"EarlyStop.floors must be numbers (not NaN), got {self.floors!r}")
            object.__setattr__(self, "floors", floors)

    def __getstate__(self) -> dict:  # not the device tensors made for keep()
        return {k: v for k, v in self.__dict__.items() if k != "_made"}

    def _tables(self, device) -> tuple[torch.Tensor, torch.Tensor]:
        """``calibration`` and ``floors`` as float64 tensors on ``device``, made on the
        first draft pass of a step and kept (the stop is fixed for the step)."""
        made = self.__dict__.get("_made")
        if made is None or made[0].device != torch.device(device):
            as64 = dict(dtype=torch.float64, device=device)
            made = (torch.tensor(self.calibration, **as64), torch.tensor(self.floors, **as64))
            self.__dict__["_made"] = made  # frozen: the cache bypasses __setattr__
        return made


@dataclass
class StepView:
    """What a drafter sees of a step: the active ``slots`` (ascending), their
    ``prompts`` and ``caps``, the generation's ``state`` (:class:`bass.batch_state.BatchState`:
    ``seqs[slot]`` prompt plus committed tokens, ``draft_lens[slot]`` what the draft
    cache holds), the sampling ``params``, its ``offer`` (:meth:`Drafter.offer`'s, if
    any), the policy's ``stop`` (an :class:`EarlyStop` or ``None``).

    ``keys`` int64 ``[R, K]`` (coupled drafting, the default when sampling):
    ``keys[r, j]`` the key of the position draft token ``j + 1`` of row ``r`` would take,
    for ``sample_keyed(probs, keys[r, j])``; ``None``: draw with ``generator`` and return
    ``probs`` for rejection sampling (docs/guides/drafters.md, "Your own drafter").

    ``agree``: a per-row decision (bool ``[R']``) as the whole tensor-parallel group
    takes it (its first rank's); the identity in one process.

    ``penalty``: the generation's penalties (repetition, frequency, presence: a
    :class:`bass.repetition.SeenTokens`), else ``None``: a drafter whose drafts should
    follow the penalised choice penalises its logits with it
    (:class:`bass.drafters.ModelDrafter` does; the result is exact either way).

    The view and what it holds (``state`` above all) are the engine's: read them, never
    change them (a drafter keeps its own state); another package's drafter that changes
    a row (its list, length or newest token) is stopped with a PluginError.
    """

    slots: list[int]
    prompts: list[int]
    caps: Sequence[int]
    state: BatchState
    params: SamplingParams = field(default_factory=SamplingParams)
    generator: torch.Generator | None = None
    keys: torch.Tensor | None = None
    offer: Offer | None = None
    stop: EarlyStop | None = None
    agree: Callable[[torch.Tensor], torch.Tensor] = lambda mask: mask
    penalty: SeenTokens | None = None


@dataclass
class Proposal:
    """What a drafter proposes for the active rows of a step (``R`` rows, ``K`` the most
    any row drafted).

    ``drafted`` (host ``list[int]``, or any integers): tokens per row,
    ``0 <= drafted[r] <= lengths[r]``. The tokens either on the device, ``tokens`` an
    integer tensor ``[R, >= K]`` (past a row's count: padding), or on the host,
    ``host_tokens`` (``list[list[int]]``), not both; ids within the main model's
    vocabulary. ``probs`` ``[R, >= K, V]`` over the main model's ``V`` logits: the
    distributions sampled tokens were drawn from, for rejection sampling (probabilities,
    each in ``[0, 1]``, a drafted token's above 0; a row's sum need not be exactly 1: the
    verifier normalises it; ``None`` for deterministic or coupled drafts).
    ``bad`` bool ``[R]``: rows whose draft logits were not finite; ``confidence``
    ``[R, K]``: the drafted tokens' top-1 probabilities (with an early stop); both read
    with the step's one host read.
    ``slots``: the active slots it was made for (:meth:`Drafter.commit` reads them).
    ``passes``, ``pass_tokens``, ``forward_seconds``: the draft model's passes, the
    tokens each computed, and their time.
    """

    drafted: list[int]
    tokens: torch.Tensor | None = None
    host_tokens: list[list[int]] | None = None
    probs: torch.Tensor | None = None
    bad: torch.Tensor | None = None
    confidence: torch.Tensor | None = None
    slots: list[int] = field(default_factory=list)
    passes: int = 0
    pass_tokens: tuple[int, ...] = ()
    forward_seconds: float = 0.0

    @classmethod
    def none(cls, slots: list[int]) -> Proposal:
        """Nothing drafted for the active ``slots`` (a plain decoding step)."""
        return cls([0] * len(slots), host_tokens=[[] for _ in slots], slots=list(slots))


class Policy:
    """A draft-length policy: every hook with its default.

    Override :meth:`draft_length` (one length for every row) or :meth:`draft_lengths`
    (per row), and :meth:`update`; :meth:`early_stop` for a per-row early stop while a
    draft model drafts. A policy need not subclass this: any object with
    ``draft_length()`` or ``draft_lengths(ctx)``, and ``update(record)``, works; its other
    hooks take these defaults (:func:`bass.policies.bind`). Policies keep
    per-generation state: the engine makes a fresh one for each ``generate`` call.
    """

    name: ClassVar[str] = ""

    def draft_length(self) -> int:
        """The batch-wide draft length of the next step (``>= 0``; ``0``: regular
        decoding)."""
        raise NotImplementedError(
            f"{type(self).__name__} must define draft_length() or draft_lengths(ctx)"
        )

    def draft_lengths(self, ctx: DraftContext) -> Sequence[int]:
        """One draft length per active row of ``ctx`` (capped at ``ctx.caps`` by the
        engine; an n-gram drafter proposes at most what it found, ``ctx.available``).
        Default: :meth:`draft_length` for every row."""
        return [self.draft_length()] * ctx.num_rows

    def early_stop(self, ctx: DraftContext) -> EarlyStop | None:
        """This step's per-row early stop (asked after :meth:`draft_lengths`), or
        ``None`` (the default): rows draft their whole length."""
        return None

    def update(self, record: StepRecord) -> None:
        """Learn from the step just finished."""


class Drafter:
    """A draft source: every hook with its default; override :meth:`propose` and
    whatever else your drafter needs (when each is called: docs/guides/drafters.md, "Your
    own drafter").

    Class attributes: ``name`` (what :attr:`DraftContext.drafter` reports to policies),
    ``deterministic`` (``False`` when its proposals are sampled: they then carry
    ``probs`` unless coupled). ``model``: the draft model, if any (the Generator checks
    its vocabulary against the main model's and prepares it with the main model).
    """

    name: ClassVar[str] = "drafter"
    deterministic: ClassVar[bool] = True
    model: torch.nn.Module | None = None

    def start(self, state: BatchState, passes: Passes, max_len: int, device) -> int:
        """A generation starts: ``state`` holds its prompts (``state.by_prompt``) and
        its slots (``len(state.seqs)``, filled by :meth:`admit`), ``passes`` how packed
        passes run, ``max_len`` the caches' length, ``device`` the main model's. Returns
        the forward passes it ran."""
        return 0

    def admit(self, state: BatchState, slots: list[int]) -> int:
        """Rows were just placed in ``slots`` (ascending; ``state.seqs[slot]`` the prompt,
        which the main model prefills before or, riding in the next verify pass, after
        this call; no row has its first token yet): at a generation's start, and again
        whenever waiting prompts take the slots of finished rows (continuous batching).
        A drafter that keeps anything per slot resets it here. Returns the forward
        passes it ran (a draft model's prefill). ``state.copied`` names the rows whose
        prompt a running row holds (its slot): a drafter with a cache may copy that row's
        prompt positions instead of computing them, as the main model's cache does."""
        return 0

    def offer(self, view: StepView) -> Offer | None:
        """Optional: what it has for each active row (at most ``view.caps[r]`` tokens),
        before the policy decides; handed back in ``view.offer``."""
        return None

    def propose(self, view: StepView, lengths: list[int]) -> Proposal:
        """Up to ``lengths[r]`` draft tokens for each active slot ``view.slots[r]``."""
        raise NotImplementedError(f"{type(self).__name__} must implement propose()")

    def commit(self, proposal: Proposal, accepted: list[int]) -> None:
        """After verification: ``accepted[r]`` of ``proposal``'s row ``r`` were kept
        (before the rows append them)."""

    def compact(self, keep: list[int]) -> None:
        """Slots ``keep`` (ascending) become slots ``0..len(keep)-1``."""

    def finish(self) -> None:
        """The generation ended (done, failed or closed): drop what it held (a draft
        cache, the rows' state), so none of it outlives the call; :meth:`start` comes
        before any other hook again."""
