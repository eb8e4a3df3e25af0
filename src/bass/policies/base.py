"""The draft-length policy contract: :class:`StepStats`, :class:`DraftLengthPolicy`, and the
small declarative option system the built-in policies use to validate their options.

A policy decides how many tokens the draft model proposes per speculative step (BASS,
arXiv 2404.15778, Section 3.3 "dynamic draft length"). The engine's loop is::

    k = policy.draft_length()          # batch-wide draft length for this step
    ... draft up to k tokens per active row, verify, accept ...
    policy.update(StepStats(draft_length=k, accepted=..., ...))

Policies are plain Python objects with per-generation state: make a fresh one (usually
with :func:`bass.policies.load`) for each ``generate`` call.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np
import torch

from .. import plugins
from ..errors import OptionError, PluginOutputError
from ..option_kinds import Range, Refused

__all__ = [
    "DraftContext",
    "DraftLengthPolicy",
    "Policy",
    "PolicyHooks",
    "StepStats",
    "bind",
    "capabilities",
    "lengths_for",
    "option",
    "running_mean",
    "validate_options",
]


def _as_list(counts: Sequence[int] | torch.Tensor) -> list[int]:
    if isinstance(counts, torch.Tensor):
        return [int(c) for c in counts.tolist()]
    return [int(c) for c in counts]


@dataclass
class StepStats:
    """What happened in one speculative step, for :meth:`DraftLengthPolicy.update`.

    Attributes:
        draft_length: the batch-wide draft length ``k`` used this step (what
            :meth:`DraftLengthPolicy.draft_length` returned, possibly capped by the engine,
            e.g. to the tokens a row may still generate). ``0`` means a regular decoding
            step (nothing drafted).
        accepted: each *active* row's number of accepted draft tokens, ``0..drafted``,
            not counting the bonus/correction token the target model always adds. A
            ``list[int]`` or an integer tensor ``[B_active]`` (read with
            :meth:`accepted_list`, which syncs a CUDA tensor once).
        drafted: each active row's number of drafted tokens (``<= draft_length``) when
            rows stopped drafting early (see ``keep_drafting`` on
            :class:`DraftLengthPolicy`); ``None`` (the default) means every row drafted
            ``draft_length`` tokens.
        draft_seconds: wall time of this step's drafting (all draft forward passes).
        verify_seconds: wall time of this step's verification (one target forward pass
            over ``k + 1`` positions per row).
        step: 0-based index of the step within the generation.
        rows: each active row's prompt index (stable across steps, unlike positions in
            ``accepted``, which shift as rows finish), so a policy can keep per-row
            estimates; ``None`` when the caller does not say.
        verify_pass_tokens: tokens the verification pass computed (the sum over rows
            of ``1 + drafted``; with CUDA-graph buckets, padding included): with packed
            passes a pass costs what its tokens cost. (``StepRecord.verify_tokens``
            counts the real tokens only, ``padding_tokens`` the rest.)
        draft_pass_tokens: tokens each draft-model pass computed (empty for n-grams).

    >>> s = StepStats(draft_length=4, accepted=[1, 4, 0])
    >>> s.accepted_list(), s.max_accepted(), s.drafted_list()
    ([1, 4, 0], 4, [4, 4, 4])
    >>> StepStats(draft_length=4, accepted=torch.tensor([2, 3]), drafted=[2, 4]).accepted_list()
    [2, 3]
    """

    draft_length: int
    accepted: Sequence[int] | torch.Tensor
    drafted: Sequence[int] | torch.Tensor | None = None
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    step: int = 0
    rows: Sequence[int] | None = None
    verify_pass_tokens: int = 0
    draft_pass_tokens: Sequence[int] = ()

    def __post_init__(self) -> None:
        # Cheap checks only: a CUDA tensor is never read here (that would sync the device
        # for policies such as `constant` that never look at the counts).
        if isinstance(self.draft_length, bool) or not isinstance(self.draft_length, int):
            raise TypeError(f"StepStats.draft_length must be an int, got {self.draft_length!r}")
        if self.draft_length < 0:
            raise ValueError(f"StepStats.draft_length must be >= 0, got {self.draft_length}")
        for name in ("accepted", "drafted"):
            value = getattr(self, name)
            if isinstance(value, torch.Tensor) and (
                value.dim() != 1 or value.dtype.is_floating_point or value.dtype.is_complex
            ):
                raise ValueError(
                    f"StepStats.{name} must be a 1-D integer tensor [B_active], "
                    f"got {value.dtype} of shape {tuple(value.shape)}"
                )
            if isinstance(value, list | tuple):
                bad = [c for c in value if not 0 <= c <= self.draft_length]
                if bad:
                    raise ValueError(
                        f"StepStats.{name} counts must be in 0..draft_length="
                        f"{self.draft_length}, got {list(value)}"
                    )
        if self.drafted is not None and len(self.drafted) != len(self.accepted):
            raise ValueError(
                f"StepStats.drafted has {len(self.drafted)} rows but accepted has "
                f"{len(self.accepted)}"
            )
        both_lists = isinstance(self.accepted, list | tuple) and isinstance(
            self.drafted, list | tuple
        )
        if both_lists and any(a > d for a, d in zip(self.accepted, self.drafted, strict=True)):
            raise ValueError(
                f"StepStats: a row accepted more than it drafted: accepted="
                f"{list(self.accepted)}, drafted={list(self.drafted)}"
            )
        if self.draft_seconds < 0 or self.verify_seconds < 0:
            raise ValueError("StepStats timings must be >= 0")

    def accepted_list(self) -> list[int]:
        """Each active row's accepted count as a list of Python ints."""
        return _as_list(self.accepted)

    def drafted_list(self) -> list[int]:
        """Each active row's drafted count (``draft_length`` for every row if ``drafted``
        is ``None``)."""
        if self.drafted is None:
            return [self.draft_length] * len(self.accepted)
        return _as_list(self.drafted)

    def max_accepted(self) -> int:
        """The largest accepted count over active rows (0 when no row is active)."""
        return max(self.accepted_list(), default=0)

    @property
    def num_rows(self) -> int:
        """The number of active rows this step."""
        return len(self.accepted)


@dataclass
class DraftContext:
    """What a per-row policy knows before a step, for ``draft_lengths(ctx)``.

    Attributes:
        rows: each active row's prompt index.
        max_draft: per row, the most tokens it may draft (its remaining token budget
            minus the one the main model always adds).
        drafter: ``"ngram"`` or ``"model"``.
        available: per row, how many tokens the drafter has to offer (the n-gram
            continuation it found), or ``None`` when it can draft any number (a model).
        match_len: per row, the length of the n-gram suffix that matched (0: none), or
            ``None`` for a model drafter.
        step: 0-based index of the step.

    >>> DraftContext(rows=[0, 2], max_draft=[8, 3]).num_rows
    2
    """

    rows: Sequence[int]
    max_draft: Sequence[int]
    drafter: str = "model"
    available: Sequence[int] | None = None
    match_len: Sequence[int] | None = None
    step: int = 0

    @property
    def num_rows(self) -> int:
        return len(self.rows)


def lengths_for(policy: Any, ctx: DraftContext) -> list[int]:
    """Each of ``ctx``'s rows' draft length from ``policy``, within ``0..ctx.max_draft[r]``
    (:func:`bind`'s ``draft_lengths``, for a single call)."""
    return bind(policy).draft_lengths(ctx)


def _per_row(policy: Any):
    """``policy``'s own ``draft_lengths`` method, or ``None`` where it has only
    ``draft_length()`` (or :class:`Policy`'s default, one length for every row)."""
    if isinstance(policy, Policy) and type(policy).draft_lengths is Policy.draft_lengths:
        return None
    return getattr(policy, "draft_lengths", None)


def _checked_lengths(name: str, per_row, single, ctx: DraftContext) -> list[int]:
    """One draft length per row of ``ctx`` from ``per_row(ctx)`` or, without it, the one
    ``single()`` for every row; capped at ``ctx.max_draft``. A wrong number of lengths, or
    a length that is negative, a bool or not an integer, is a
    :class:`~bass.errors.PluginOutputError` that names the policy (and the row). Called
    every step: the messages are built only for a bad value."""
    if per_row is None:
        k = single()
        if type(k) is not int or k < 0:
            k = _length(k, f"{name}.draft_length() returned")
        return [min(k, c) for c in ctx.max_draft]
    got = per_row(ctx)
    if isinstance(got, (str, bytes)) or not hasattr(got, "__len__"):
        raise PluginOutputError(
            f"policy {name}.draft_lengths returned {got!r}; expected a sequence of "
            f"{ctx.num_rows} draft lengths (integers >= 0), one per active row"
        )
    ks = list(got)
    if len(ks) != ctx.num_rows:
        raise PluginOutputError(
            f"policy {name}.draft_lengths returned {len(ks)} lengths for {ctx.num_rows} active rows"
        )
    for r, k in enumerate(ks):
        if type(k) is not int or k < 0:
            said = f"{name}.draft_lengths returned, for row {r} (prompt "
            ks[r] = _length(k, said + f"{ctx.rows[r]}),")
    return [min(k, c) for k, c in zip(ks, ctx.max_draft)]


def _policy_name(policy: Any) -> str:
    name = getattr(type(policy), "name", None)
    return f"{name!r} ({type(policy).__name__})" if isinstance(name, str) else type(policy).__name__


def _length(k: Any, said: str) -> int:
    """A draft length a policy returned, as an int: a non-negative integer (Python's,
    numpy's or a one-element integer tensor); anything else is the policy's bug, named.
    Capping a length at what the row may still draft is the engine's job, not an error."""
    bad_type = isinstance(k, (bool, np.bool_))
    if isinstance(k, torch.Tensor) and (k.dtype == torch.bool or k.is_floating_point()):
        bad_type = True
    try:
        n = None if bad_type else operator.index(k)
    except TypeError:
        n = None
    if n is None or n < 0:
        raise PluginOutputError(
            f"policy {said} {k!r}; a draft length must be an integer >= 0 (0: no drafting "
            "this step); lengths above what a row may still draft are capped"
        )
    return n


@runtime_checkable
class DraftLengthPolicy(Protocol):
    """Decides the draft length of each speculative step.

    Required:

    * ``draft_length() -> int``: the batch-wide number of tokens to draft this step,
      ``>= 0`` (``0``: a regular, non-speculative decoding step). Called once per step,
      before drafting; must not change state.
    * ``update(stats: StepStats) -> None``: learn from the step just finished.

    Optional, per-row early stop: a policy may also define
    ``keep_drafting(probs: torch.Tensor, index: int) -> torch.Tensor``. The engine checks
    ``hasattr(policy, "keep_drafting")`` and, if present, calls it after drafting the token
    at 0-based position ``index`` of this step's draft, with ``probs`` the draft model's
    warped (temperature/top-k/top-p applied) distribution that token was sampled from,
    ``[B_active, V]``. It returns a bool tensor ``[B_active]`` on ``probs``' device: rows
    where it is ``False`` stop drafting: the token just drafted is *not* proposed (its
    distribution says it is unlikely to be accepted, AdaEDL's criterion) and the row drafts
    nothing more this step, so ``StepStats.drafted`` reports each row's count (``index``
    for a row stopped there). The call is made at every position, the last included.
    ``keep_drafting`` must not sync the device (no ``.item()``), so drafting stays async.
    A ``keep_drafting`` with a ``rows`` keyword parameter also gets, for each row of
    ``probs``, its position among this step's active rows (the order of
    ``DraftContext.rows`` and ``StepStats.rows``), to keep per-row state.

    Optional, per-row draft lengths: a policy may define ``draft_lengths(ctx:
    DraftContext) -> Sequence[int]``, one length per active row (``0``: the row only
    decodes its next token this step). The engine then calls it instead of
    ``draft_length()`` and caps each length at ``ctx.max_draft``; an n-gram drafter
    proposes at most what it found (``ctx.available``). Policies with only
    ``draft_length()`` keep working: every row gets that length.
    """

    def draft_length(self) -> int: ...

    def update(self, stats: StepStats) -> None: ...


# --------------------------------------------------------------------------- options


def option(
    default: Any,
    help: str,
    *,
    kind: type = int,
    low: float | str | None = None,
    high: float | str | None = None,
    low_exclusive: bool = False,
    optional: bool = False,
) -> Any:
    """A policy option, declared once: a dataclass field with its default, its bound (a
    :class:`~bass.option_kinds.Range`, as the Generator's options declare theirs) and a
    one-line doc, which :func:`validate_options` checks and :func:`bass.policies.describe`
    lists.

    ``kind`` is ``int`` or ``float``; ``low``/``high`` are inclusive bounds (``low``
    exclusive with ``low_exclusive``), either numbers or the name of another option of the
    same policy (e.g. ``high="l_limit"``); ``optional`` allows ``None``.
    """
    noun = "an int" if kind is int else "a number"
    bound = Range(kind, low, high, low_open=low_exclusive, optional=optional, noun=noun)
    return dataclasses.field(default=default, metadata={"help": help, "kind": bound})


def validate_options(policy: Any) -> None:
    """Check every :func:`option` field of the dataclass instance ``policy`` (types first,
    then ranges, so a bound naming another option compares against a checked value).

    Raises :class:`bass.errors.OptionError` (a ``ValueError``) naming the option, the
    policy (its ``name`` class attribute), what is allowed and every option with its
    default. Float options given as ints are converted to float (numpy numbers to
    Python's).
    """
    name = getattr(type(policy), "name", type(policy).__name__)
    declared = [f for f in dataclasses.fields(policy) if "kind" in f.metadata]

    def fail(f: dataclasses.Field[Any], value: Any) -> None:
        values = {g.name: getattr(policy, g.name) for g in declared}
        default = f.default is not dataclasses.MISSING and value == f.default
        got = f"{value!r}, its default: set {f.name} too" if default else repr(value)
        listing = ", ".join(f"{g.name}={g.default!r}" for g in declared)
        raise OptionError(
            f"policy {name!r}: option {f.name!r} must be "
            f"{f.metadata['kind'].allowed({'values': values})}, got {got} (options: {listing})",
            option=f.name,
            value=value,
        )

    for f in declared:
        try:
            setattr(policy, f.name, f.metadata["kind"].convert(getattr(policy, f.name)))
        except Refused:
            fail(f, getattr(policy, f.name))
    values = {"values": {f.name: getattr(policy, f.name) for f in declared}}
    # Options bounded by another option (l0 <= l_limit) last, so a bad l_limit is
    # reported as itself rather than as an l0 out of range.
    for f in sorted(declared, key=lambda f: f.metadata["kind"].names_another()):
        if not f.metadata["kind"].within(getattr(policy, f.name), values):
            fail(f, getattr(policy, f.name))


class OptionsMixin:
    """Validates a dataclass policy's :func:`option` fields after ``__init__``."""

    name: ClassVar[str]

    def __post_init__(self) -> None:
        validate_options(self)


def running_mean(old: float | None, new: float, weight: float) -> float:
    """An exponential moving average: ``new`` weighted ``weight`` (the first value as is)."""
    return new if old is None else (1.0 - weight) * old + weight * new


# --------------------------------------------------------------------------- hooks


class Policy:
    """Base class of draft-length policies: every hook declared once, with its default.

    Override :meth:`draft_length` (one length for every row) or :meth:`draft_lengths`
    (per row), and :meth:`update`; for a per-row early stop inside a draft model's
    drafting, :meth:`keep_drafting` (the engine then calls it after every draft pass:
    :meth:`stops_early` says so, by default when the method is overridden). A policy
    need not subclass this: any object with ``draft_length()`` and ``update(stats)``
    (:class:`DraftLengthPolicy`) works, its optional hooks found when it is loaded
    (:func:`bind`).
    """

    name: ClassVar[str] = ""

    def draft_length(self) -> int:
        """The batch-wide draft length of the next step (``>= 0``)."""
        raise NotImplementedError(
            f"{type(self).__name__} must define draft_length() or draft_lengths(ctx)"
        )

    def draft_lengths(self, ctx: DraftContext) -> Sequence[int]:
        """One draft length per active row of ``ctx`` (default: :meth:`draft_length`
        for every row)."""
        return [self.draft_length()] * ctx.num_rows

    def update(self, stats: StepStats) -> None:
        """Learn from the step just finished."""

    def keep_drafting(self, probs: torch.Tensor, index: int, rows=None) -> torch.Tensor:
        """bool ``[R']``: which rows go on drafting after the token at 0-based position
        ``index``, drawn from ``probs`` ``[R', V]`` (``rows``: each probs row's position
        among the step's rows). Default: all of them."""
        return torch.ones(probs.shape[0], dtype=torch.bool, device=probs.device)

    def stops_early(self) -> bool:
        """Whether the engine calls :meth:`keep_drafting` (a host read per draft pass):
        by default when a subclass overrides it."""
        return type(self).keep_drafting is not Policy.keep_drafting


def capabilities(cls: type) -> list[str]:
    """What a policy class decides, for ``bass policies``: ``"per-row draft lengths"`` or
    ``"one length"``, and ``"per-row early stop"`` when it may stop rows (for a
    :class:`Policy`, where it overrides :meth:`Policy.keep_drafting`)."""
    if isinstance(cls, type) and issubclass(cls, Policy):
        per_row = cls.draft_lengths is not Policy.draft_lengths
        early = cls.keep_drafting is not Policy.keep_drafting
    else:
        per_row, early = hasattr(cls, "draft_lengths"), hasattr(cls, "keep_drafting")
    kinds = ["per-row draft lengths" if per_row else "one length"]
    return kinds + (["per-row early stop"] if early else [])


@dataclass(frozen=True)
class PolicyHooks:
    """A policy's hooks, resolved once when a generation starts (never per step):
    ``draft_lengths(ctx) -> list[int]`` (checked and capped: :func:`lengths_for`),
    ``update(stats)``, and ``keep_drafting(probs, index, rows) -> bool tensor`` or
    ``None`` when the policy stops no row early."""

    policy: Any
    draft_lengths: Any
    update: Any
    keep_drafting: Any = None


def bind(policy: Any) -> PolicyHooks:
    """The hooks of ``policy`` (a :class:`Policy` or any :class:`DraftLengthPolicy`).

    A ``keep_drafting(probs, index)`` without the ``rows`` parameter (the older
    contract) is wrapped to take it; anything else is an error naming the policy.
    """
    import inspect

    name = type(policy).__name__
    if not callable(getattr(policy, "update", None)) or not (
        callable(getattr(policy, "draft_length", None))
        or callable(getattr(policy, "draft_lengths", None))
    ):
        raise TypeError(
            f"policy {name} needs draft_length() or draft_lengths(ctx), and update(stats) "
            "(see bass.policies.Policy)"
        )
    keep = getattr(policy, "keep_drafting", None)
    if isinstance(policy, Policy):
        keep = keep if policy.stops_early() else None
    if keep is not None:
        if not callable(keep):
            raise TypeError(f"policy {name}: keep_drafting must be a method, got {keep!r}")
        params = inspect.signature(keep).parameters
        takes_rows = "rows" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())
        if not takes_rows:
            old = keep

            def keep(probs, index, rows, _old=old):  # the older two-argument contract
                return _old(probs, index)

    name, per_row, update = _policy_name(policy), _per_row(policy), policy.update
    single = None if per_row is not None else policy.draft_length
    if not plugins.is_builtin(policy):  # what another package's policy raises is its own
        who = plugins.describe("policy", policy, getattr(type(policy), "name", None) or None)
        if per_row is not None:
            per_row = plugins.guard(who, "draft_lengths", per_row)
        else:
            single = plugins.guard(who, "draft_length", single)
        update = plugins.guard(who, "update", update)
        if keep is not None:
            keep = plugins.guard(who, "keep_drafting", keep)

    def lengths(ctx: DraftContext) -> list[int]:
        return _checked_lengths(name, per_row, single, ctx)

    return PolicyHooks(policy, lengths, update, keep)
