"""Finding and loading policies: entry points of group ``bass.policies`` naming a class or
factory that takes the options as keywords (:func:`entry_points`: the test seam).
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.metadata
import inspect
import numbers
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

import numpy as np

from .. import plugins
from ..errors import OptionError, PluginLoadError
from ..hooks import Policy
from .base import is_policy

__all__ = [
    "GROUP",
    "REQUIRED",
    "OptionInfo",
    "PolicyLoadError",
    "available",
    "describe",
    "entry_points",
    "load",
    "make",
    "maker",
    "parse_options",
]

GROUP = "bass.policies"


class _Required:
    def __repr__(self) -> str:
        return "<required>"


#: The ``default`` of an option that has none (a required factory argument).
REQUIRED: Any = _Required()


class PolicyLoadError(PluginLoadError):
    """A registered policy's entry point could not be imported, built or used (the
    original exception, if any, chained as ``__cause__``)."""


class OptionInfo(NamedTuple):
    """One option of a policy, as listed by ``bass policies``."""

    name: str
    default: Any
    help: str


def entry_points() -> Iterable[importlib.metadata.EntryPoint]:
    """The installed entry points of group ``bass.policies`` (the test seam)."""
    return plugins.entry_points(GROUP)


def available() -> dict[str, importlib.metadata.EntryPoint]:
    """Installed policies, name -> entry point, sorted by name (bass's own names are
    bass's; a name two other packages register is ambiguous: :func:`bass.plugins.available`)."""
    return plugins.available(GROUP, entry_points())


def _target(name: str) -> tuple[Callable[..., Any], importlib.metadata.EntryPoint]:
    """Policy ``name``'s class or factory, imported, and its entry point."""
    installed = available()
    if name not in installed:
        names = ", ".join(installed) or "(none)"
        raise ValueError(f"unknown policy {name!r}; installed: {names}")
    ep = installed[name]
    return plugins.load_target("policy", name, ep, PolicyLoadError), ep


def _options(target: Callable[..., Any]) -> tuple[list[OptionInfo], bool]:
    """The options ``target`` accepts, and whether it also takes ``**kwargs``."""
    if isinstance(target, type) and dataclasses.is_dataclass(target):
        infos = []
        for f in dataclasses.fields(target):
            if not f.init:
                continue
            if f.default is not dataclasses.MISSING:
                default = f.default
            elif f.default_factory is not dataclasses.MISSING:
                default = f.default_factory()
            else:
                default = REQUIRED
            infos.append(OptionInfo(f.name, default, f.metadata.get("help", "")))
        return infos, False
    try:
        sig = inspect.signature(target)
    except (TypeError, ValueError):  # some builtins and C callables have no signature
        return [], True
    helps = getattr(target, "option_help", {})
    infos, var_kw = [], False
    for p in sig.parameters.values():
        if p.kind is p.VAR_KEYWORD:
            var_kw = True
        elif p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            default = REQUIRED if p.default is p.empty else p.default
            infos.append(OptionInfo(p.name, default, helps.get(p.name, "")))
    return infos, var_kw


def _options_text(infos: list[OptionInfo]) -> str:
    return ", ".join(f"{i.name}={i.default!r}" for i in infos) or "(none)"


def describe(name: str) -> list[OptionInfo]:
    """The options of policy ``name``, ``(option, default, help)`` in declaration order:
    its dataclass fields, or its signature (help from an optional ``option_help`` dict
    attribute). Loads the plugin, so it raises like :func:`load`."""
    return _options(_target(name)[0])[0]


def load(name: str, **options: Any) -> Policy:
    """A new instance of the installed policy ``name``, built with ``options``.

    Raises:
        ValueError: unknown ``name`` (the message lists the installed ones), or bad
            options: an unknown option name (checked here against the signature), a wrong
            type or an out-of-range value (checked by the policy); messages name the
            option and the policy and list its options with their defaults.
        PolicyLoadError: the plugin failed to import, or what it built is not a
            :class:`~bass.hooks.Policy` (its hooks).
        bass.errors.PluginError: another package's policy raised while being built (its
            exception chained).
    """
    return _loader(name, options)()


def _loader(name: str, options: Mapping[str, Any]) -> Callable[[], Policy]:
    """:func:`load` in two halves: the entry point found, imported and its option names
    checked now; each call of what it returns builds and checks a new instance."""
    target, ep = _target(name)
    infos, var_kw = _options(target)
    known = {i.name for i in infos}
    unknown = [] if var_kw else sorted(set(options) - known)
    missing = [i.name for i in infos if i.default is REQUIRED and i.name not in options]
    if unknown or missing:
        what = f"has no option {unknown[0]!r}" if unknown else f"needs option {missing[0]!r}"
        lower = {k.lower(): k for k in sorted(known)}
        close = difflib.get_close_matches(unknown[0].lower(), lower, n=1) if unknown else []
        what += f" (did you mean {lower[close[0]]!r}?)" if close else ""
        raise OptionError(
            f"policy {name!r} {what}; options: {_options_text(infos)}",
            option="policy_options",
            value=dict(options),
        )
    own = plugins.is_own(ep, GROUP)  # bass's policies check their options themselves
    for info in infos:  # a value its default's type refuses: said now, naming the option
        if own or info.name not in options:
            continue
        if wrong := _wrong_type(options[info.name], info.default):
            raise OptionError(
                f"policy {name!r} option {info.name!r} = {options[info.name]!r}: expected "
                f"{wrong} (its default: {info.default!r})",
                option="policy_options",
                value=dict(options),
            )
    options = dict(options)

    def build() -> Policy:
        policy = plugins.build("policy", target, name, ep, **options)
        if not is_policy(policy):
            raise PolicyLoadError(
                f"{plugins.describe('policy', policy, name, ep)} lacks draft_length() "
                "(or draft_lengths(ctx)) or update(record) (see bass.hooks.Policy)",
                plugin=name,
            )
        return policy

    return build


def make(spec: str | Policy, options: Mapping[str, Any] | None = None) -> Policy:
    """A fresh policy from a :class:`bass.Generator`'s ``policy`` (a name: :func:`load`
    with ``options``) or the instance itself (its hooks checked; no options)."""
    return maker(spec, options)()


def maker(spec: str | Policy, options: Mapping[str, Any] | None = None) -> Callable[[], Policy]:
    """:func:`make` resolved once: a name's entry point is looked up, imported and its
    options checked now (a scan of the installed packages' metadata, ~10 ms); each call of
    what it returns is a fresh policy, as :func:`make`'s (a Generator makes one per
    generation)."""
    if isinstance(spec, str):
        return _loader(spec, options or {})
    if options:
        raise ValueError("policy_options apply to a policy name, not a policy instance")
    if not is_policy(spec):
        raise TypeError(
            "policy must be a name or have draft_length() (or draft_lengths(ctx)) and "
            f"update(record) (see bass.hooks.Policy), got {spec!r}"
        )
    return lambda: spec


def _wrong_type(value: Any, default: Any) -> str | None:
    """What a boolean or numeric option takes, when ``value`` (text a flag or a file gave
    that did not convert: ``enabled=flase``, ``k=abc``) is not that; ``None`` (no default:
    none) is taken, and an option of any other default is the policy's to check."""
    if value is None:
        return None
    boolean = isinstance(value, (bool, np.bool_))
    if isinstance(default, bool):
        return None if boolean else "true or false"
    if isinstance(default, (int, float)):  # numpy's numbers are numbers.Real too
        return None if isinstance(value, numbers.Real) and not boolean else "a number"
    return None


def _parse_value(text: str, default: Any) -> Any:
    if isinstance(default, bool):
        if text.lower() in ("1", "true", "yes", "on"):
            return True
        if text.lower() in ("0", "false", "no", "off"):
            return False
        return text
    if isinstance(default, str):  # text as is, "none" too (as a config file's "none")
        return text
    if text.lower() == "none":
        return None
    for kind in (float,) if isinstance(default, float) else (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse_options(name: str, pairs: Iterable[str] | Mapping[str, str]) -> dict[str, Any]:
    """Options for :func:`load` from command-line text (``"l0=5"`` pairs or a mapping),
    converted after each option's default: ints, floats (an int default also accepts a
    float, which the policy then rejects with a clear message), ``none`` (but for a
    string option: its text), booleans.
    Unconvertible text is passed through as a string, for :func:`load` to report.

    >>> from bass.policies.registry import _parse_value
    >>> _parse_value("5", 7), _parse_value("0.5", None), _parse_value("none", 0.4)
    (5, 0.5, None)
    >>> _parse_value("none", "fast")
    'none'
    """
    if isinstance(pairs, Mapping):
        raw = dict(pairs)
    else:
        raw = {}
        for pair in pairs:
            key, sep, value = pair.partition("=")
            if not sep or not key.strip():
                raise ValueError(f"policy option {pair!r} is not of the form name=value")
            if key.strip() in raw and raw[key.strip()] != value.strip():
                raise ValueError(
                    f"policy option {key.strip()!r} given twice ({raw[key.strip()]!r} and "
                    f"{value.strip()!r}): give it once"
                )
            raw[key.strip()] = value.strip()
    defaults = {i.name: i.default for i in describe(name)}
    return {key: _parse_value(value, defaults.get(key)) for key, value in raw.items()}
