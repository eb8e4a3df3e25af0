"""The policy contract's engine side: :func:`bind` (a policy's hooks, resolved once per
generation and checked) and :func:`option` (how the built-ins declare their options).
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from .. import plugins
from ..errors import OptionError, PluginOutputError
from ..hooks import DraftContext, EarlyStop, Policy, StepRecord
from ..option_kinds import Range, Refused

__all__ = [
    "PolicyHooks",
    "bind",
    "capabilities",
    "is_policy",
    "option",
    "running_mean",
]


def _checked_lengths(name: str, who, per_row, single, ctx: DraftContext) -> list[int]:
    """One draft length per row from ``per_row(ctx)``, else ``single()`` for every row,
    capped at ``ctx.caps``; a bad one is a :class:`~bass.errors.PluginOutputError` (``name``
    in its message, ``who()`` its ``plugin``: looked up on failure only)."""
    caps = tuple(ctx.caps)  # the engine's, whatever the policy does to ctx
    if per_row is None:
        k = single()
        if type(k) is not int or k < 0:
            k = _length(k, f"{name}.draft_length() returned", who, "draft_length")
        return [min(k, c) for c in caps]
    got = per_row(ctx)
    if isinstance(got, (str, bytes, Mapping, AbstractSet)) or not hasattr(got, "__len__"):
        raise PluginOutputError(
            f"policy {name}.draft_lengths returned {got!r}; expected a sequence of "
            f"{ctx.num_rows} draft lengths (integers >= 0), one per active row",
            plugin=who(),
            hook="draft_lengths",
        )
    ks = list(got)
    if len(ks) != ctx.num_rows:
        raise PluginOutputError(
            f"policy {name}.draft_lengths returned {len(ks)} lengths for {ctx.num_rows} "
            "active rows",
            plugin=who(),
            hook="draft_lengths",
        )
    for r, k in enumerate(ks):
        if type(k) is not int or k < 0:
            said = f"{name}.draft_lengths returned, for row {r} (prompt {ctx.prompts[r]}),"
            ks[r] = _length(k, said, who, "draft_lengths")
    return [min(k, c) for k, c in zip(ks, caps)]


def _on_copy(update, record: StepRecord) -> None:
    """Another package's ``update(record)`` gets a copy of the step's record: what it
    changes in it (``record.accepted[:] = ...``) stays out of the run's statistics."""
    lists = {
        k: [list(c) for c in v] if k == "confidence" else list(v)
        for k in ("accepted", "drafted", "prompts", "draft_pass_tokens", "confidence")
        if (v := getattr(record, k)) is not None
    }
    update(dataclasses.replace(record, **lists))


def _length(k: Any, said: str, who, hook: str) -> int:
    """``k`` as an int (Python's, numpy's or a one-element integer tensor), ``>= 0``."""
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
            "this step); lengths above what a row may still draft are capped",
            plugin=who(),
            hook=hook,
        )
    return n


def option(
    default: Any, help: str, *, kind: type | None = None, low_exclusive: bool = False, **bound: Any
) -> Any:
    """A policy option, declared once: a dataclass field with its default, a one-line doc
    and its bound, a :class:`~bass.option_kinds.Range` of ``kind`` (``int`` or ``float``;
    default: ``float`` for a float default, else ``int``) with ``low``, ``high``,
    ``optional`` (``bound``; ``high="l_limit"`` names another option), ``low`` excluded
    with ``low_exclusive``. :class:`OptionsMixin` checks it."""
    kind = kind or (float if isinstance(default, float) else int)
    noun = "an int" if kind is int else "a number"
    bound = Range(kind, low_open=low_exclusive, noun=noun, **bound)
    return dataclasses.field(default=default, metadata={"help": help, "kind": bound})


class OptionsMixin:
    """Checks a dataclass policy's :func:`option` fields after ``__init__``, types first,
    then ranges: a refused value is a :class:`bass.errors.OptionError` naming the option,
    the policy, what is allowed and every option with its default."""

    name: ClassVar[str]

    def __post_init__(self) -> None:
        name = getattr(type(self), "name", type(self).__name__)
        declared = [f for f in dataclasses.fields(self) if "kind" in f.metadata]

        def fail(f: dataclasses.Field[Any], value: Any) -> None:
            values = {g.name: getattr(self, g.name) for g in declared}
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
                setattr(self, f.name, f.metadata["kind"].convert(getattr(self, f.name)))
            except Refused:
                fail(f, getattr(self, f.name))
        values = {"values": {f.name: getattr(self, f.name) for f in declared}}
        # options bounded by another (l0 <= l_limit) last: a bad l_limit is named as itself
        for f in sorted(declared, key=lambda f: f.metadata["kind"].names_another()):
            if not f.metadata["kind"].within(getattr(self, f.name), values):
                fail(f, getattr(self, f.name))


def running_mean(old: float | None, new: float, weight: float) -> float:
    """An exponential moving average: ``new`` weighted ``weight`` (the first value as is)."""
    return new if old is None else (1.0 - weight) * old + weight * new


def capabilities(cls: type) -> list[str]:
    """What a policy class decides, for ``bass policies``: ``"per-row draft lengths"`` or
    ``"one length"``, and ``"per-row early stop"`` where it has ``early_stop``."""
    per_row = getattr(cls, "draft_lengths", None) not in (None, Policy.draft_lengths)
    early = getattr(cls, "early_stop", None) not in (None, Policy.early_stop)
    kinds = ["per-row draft lengths" if per_row else "one length"]
    return kinds + (["per-row early stop"] if early else [])


@dataclass(frozen=True)
class PolicyHooks:
    """A policy's hooks, resolved once when a generation starts (never per step):
    ``draft_lengths(ctx) -> list[int]`` (checked, and capped at ``ctx.caps``),
    ``early_stop(ctx) -> EarlyStop | None`` and ``update(record)``."""

    policy: Any
    draft_lengths: Any
    early_stop: Any
    update: Any


def is_policy(obj: Any) -> bool:
    """Whether ``obj`` (not a class) has a policy's required hooks: ``update(record)``,
    and ``draft_length()`` or ``draft_lengths(ctx)``."""
    return (
        not isinstance(obj, type)
        and callable(getattr(obj, "update", None))
        and any(callable(getattr(obj, h, None)) for h in ("draft_length", "draft_lengths"))
    )


def bind(policy: Any) -> PolicyHooks:
    """The hooks of ``policy`` (a :class:`bass.hooks.Policy`, or any object with
    ``draft_length()`` or ``draft_lengths(ctx)``, and ``update(record)``); another
    package's hooks report their failures as its own (:func:`bass.plugins.guard`)."""
    if not is_policy(policy):
        raise TypeError(
            f"policy {type(policy).__name__} needs draft_length() or draft_lengths(ctx), and "
            "update(record) (see bass.hooks.Policy)"
        )
    cls, registered = type(policy).__name__, getattr(type(policy), "name", None)
    registered = registered if isinstance(registered, str) and registered else None  # "": unset
    name = f"{registered!r} ({cls})" if registered else cls
    per_row, update = getattr(policy, "draft_lengths", None), policy.update
    if isinstance(policy, Policy) and type(policy).draft_lengths is Policy.draft_lengths:
        per_row = None  # Policy's default: draft_length() for every row
    single = None if per_row is not None else policy.draft_length
    stop = getattr(policy, "early_stop", None)
    if not callable(stop):
        stop = None
    # its name with its package, for errors: looked up (importlib.metadata, tens of ms)
    # when one is raised, not once per generation
    who = functools.cache(functools.partial(plugins.describe, "policy", policy, registered or None))
    if not plugins.is_builtin(policy):  # what another package's policy raises is its own
        if per_row is not None:
            per_row = plugins.guard(who, "draft_lengths", per_row)
        else:
            single = plugins.guard(who, "draft_length", single)
        update = functools.partial(_on_copy, plugins.guard(who, "update", update))
        if stop is not None:
            stop = plugins.guard(who, "early_stop", stop)

    def early_stop(ctx: DraftContext) -> EarlyStop | None:
        got = stop(ctx) if stop is not None else None
        if got is not None and not isinstance(got, EarlyStop):
            raise PluginOutputError(
                f"policy {name}.early_stop returned {got!r}; expected a bass.hooks.EarlyStop "
                "or None",
                plugin=who(),
                hook="early_stop",
            )
        if got is not None and got.floors is not None and len(got.floors) != ctx.num_rows:
            raise PluginOutputError(
                f"policy {name}.early_stop returned {len(got.floors)} floors for "
                f"{ctx.num_rows} active rows",
                plugin=who(),
                hook="early_stop",
            )
        return got

    lengths = functools.partial(_checked_lengths, name, who, per_row, single)
    return PolicyHooks(policy, lengths, early_stop, update)
