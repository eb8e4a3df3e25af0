"""Plugins (policies, drafters) from entry-point groups ``bass.policies`` and
``bass.drafters``: finding and naming them, and reporting another package's exceptions,
at build or in any hook, as a :class:`bass.errors.PluginError` naming it and the hook.

A name means one plugin, whatever else is installed (:func:`available`): bass's own
always win (another package's entry point with one of their names is ignored, with a
warning), and a name two other packages register selects neither (an error naming both).
"""

from __future__ import annotations

import functools
import importlib.metadata
import re
import sys
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .errors import OptionError, PluginError, PluginLoadError

__all__ = [
    "AmbiguousEntryPoint",
    "available",
    "build",
    "describe",
    "entry_points",
    "guard",
    "is_builtin",
    "load_target",
]


# bass's own plugins as pyproject.toml registers them, also for a source tree (PYTHONPATH=src)
BUILTIN = {
    "bass.policies": {
        "adaptive": "bass.policies.adaptive:AdaptivePolicy",
        "bass": "bass.policies.builtin:BassPolicy",
        "confidence": "bass.policies.builtin:ConfidencePolicy",
        "constant": "bass.policies.builtin:ConstantPolicy",
        "goodput": "bass.policies.goodput:GoodputPolicy",
        "hf-heuristic": "bass.policies.builtin:HFHeuristicPolicy",
    },
    "bass.drafters": {"ngram": "bass.drafters:NGramDrafter"},
}


def entry_points(group: str) -> Iterable[importlib.metadata.EntryPoint]:
    """The installed entry points of ``group`` (the test seam)."""
    return importlib.metadata.entry_points(group=group)


#: The distribution that registers bass's own plugins (pyproject.toml's ``name``).
DISTRIBUTION = "bass-decoding"

#: What each group's plugins are called in messages.
KINDS = {"bass.policies": "policy", "bass.drafters": "drafter"}

_warned: set[tuple[str, str, str]] = set()  # (group, name, value): each shadow warned once


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()  # PEP 503, as pip compares names


def is_own(ep, group: str) -> bool:
    """Whether entry point ``ep`` is bass's own: registered by bass's distribution, or
    (an entry point that knows no distribution: a source tree, a test's) one of
    :data:`BUILTIN` as it is."""
    dist = getattr(ep, "dist", None)
    if dist is not None:
        return _canonical(dist.metadata["Name"] or "") == DISTRIBUTION
    return BUILTIN.get(group, {}).get(ep.name) == ep.value


def origin(ep) -> str:
    """The package that registered ``ep``, in words: ``my-pkg 1.0`` (``module X`` when
    no distribution owns it)."""
    return _from(ep, ep.value.partition(":")[0].strip()).removeprefix(", from ") or (
        "an unknown package"
    )


class AmbiguousEntryPoint:
    """What :func:`available` lists for a name that two or more other packages register
    (different objects): bass cannot tell which one is meant, so selecting the name
    (:meth:`load`, :func:`load_target`) raises a :class:`~bass.errors.PluginLoadError`
    naming every package; ``entry_points`` holds theirs."""

    dist = None

    def __init__(self, kind: str, name: str, group: str, eps: list) -> None:
        self.kind, self.name, self.group, self.entry_points = kind, name, group, tuple(eps)
        self.value = " or ".join(ep.value for ep in eps)  # as listings show an entry point

    def message(self) -> str:
        """Why the name cannot be selected, and what to do."""
        who = [f"{origin(ep)} ({ep.value!r})" for ep in self.entry_points]
        listed = ", ".join(who[:-1]) + f" and {who[-1]}"
        return (
            f"{self.kind} {self.name!r} is registered by {len(who)} packages: {listed}; bass "
            "cannot tell which one is meant: uninstall all but one of them, or ask their "
            "authors to register distinct names"
        )

    def load(self):
        raise PluginLoadError(self.message(), plugin=self.name)

    def __repr__(self) -> str:
        return f"AmbiguousEntryPoint({self.name!r}, {self.value!r}, {self.group!r})"


def is_bass_module(name: str) -> bool:
    """Whether module ``name`` is bass or one of its submodules."""
    return name == "bass" or name.startswith("bass.")


def _warn_shadow(kind: str, name: str, ep) -> None:
    """Another package's entry point ``ep`` named as bass's own ``kind`` ``name``: ignored,
    with a warning (once per process)."""
    key = (ep.group, name, ep.value)
    if key in _warned:
        return
    _warned.add(key)
    level, frame = 2, sys._getframe(1)  # point at the first caller outside bass
    while frame.f_back is not None and is_bass_module(frame.f_globals.get("__name__", "")):
        frame, level = frame.f_back, level + 1
    warnings.warn(
        f"bass ignores the {kind} {name!r} that {origin(ep)} registers (entry point "
        f"{ep.value!r}): {name!r} is bass's own {kind}, and bass's own always win; that "
        f"{kind} cannot be selected under this name (ask its authors to rename it)",
        UserWarning,
        stacklevel=level,
    )


def available(group: str, found: Iterable) -> dict[str, Any]:
    """The plugins of ``group``, ``found`` (its installed entry points, from the group's own
    seam) and bass's own (:data:`BUILTIN`), name -> entry point, sorted by name.

    Names are resolved so that installing a package never silently changes what a name
    means: bass's own always win (another package's entry point with one of their names is
    ignored, with a :class:`UserWarning` naming it, once); a name that two or more other
    packages register (for different objects) is listed as an :class:`AmbiguousEntryPoint`,
    which refuses to load, naming them all."""
    kind = KINDS.get(group, group)
    builtin = BUILTIN.get(group, {})
    own: dict[str, Any] = {}
    others: dict[str, dict[str, Any]] = {}  # name -> value -> entry point (first of each)
    for ep in found:
        if is_own(ep, group):
            own.setdefault(ep.name, ep)
        else:
            others.setdefault(ep.name, {}).setdefault(ep.value, ep)
    for name, value in builtin.items():  # bass's own, metadata or not
        if name not in own or own[name].value != value:  # stale metadata: the code's own
            own[name] = importlib.metadata.EntryPoint(name, value, group)
    out = dict(own)
    for name, by_value in others.items():
        if name in own:
            for ep in by_value.values():
                if ep.value != own[name].value:  # the very same object is no shadow
                    _warn_shadow(kind, name, ep)
            continue
        eps = list(by_value.values())
        out[name] = eps[0] if len(eps) == 1 else AmbiguousEntryPoint(kind, name, group, eps)
    return dict(sorted(out.items()))


@functools.cache
def _distributions() -> Mapping[str, list[str]]:  # reads every installed package: ~0.1 s
    return importlib.metadata.packages_distributions()


def _from(ep, module: str | None) -> str:
    """``", from NAME VERSION"``: the distribution that installed ``ep`` (or owns
    ``module``); ``", from module X"`` for a module no distribution owns; ``""`` when
    nothing is known."""
    dist = getattr(ep, "dist", None)
    if dist is not None:
        return f", from {dist.metadata['Name']} {dist.version}"
    top = (module or "").partition(".")[0]
    names = _distributions().get(top, []) if top else []
    if names:
        try:
            return f", from {names[0]} {importlib.metadata.version(names[0])}"
        except importlib.metadata.PackageNotFoundError:
            return f", from {names[0]}"
    return f", from module {module}" if module else ""


def from_package(ep) -> str:
    """``", from NAME VERSION"``: the distribution that installed entry point ``ep``."""
    return _from(ep, None)


def describe(kind: str, obj: Any, name: str | None = None, ep=None) -> str:
    """How errors name a plugin: ``policy 'mine' (MyPolicy, from my-pkg 1.0)``."""
    cls = obj if isinstance(obj, type) else type(obj)
    label = f"{kind} {name!r}" if name else kind
    return f"{label} ({cls.__qualname__}{_from(ep, getattr(cls, '__module__', None))})"


def is_builtin(obj: Any) -> bool:
    """Whether ``obj`` (a class or an instance) is one of bass's own."""
    cls = obj if isinstance(obj, type) else type(obj)
    return is_bass_module(getattr(cls, "__module__", None) or "")


def load_target(kind: str, name: str, ep, error: type[PluginLoadError]) -> Callable[..., Any]:
    """What entry point ``ep`` (registered as ``name``) names, imported; a failure is
    ``error`` (the kind's :class:`~bass.errors.PluginLoadError`) naming it and its package,
    or, for an :class:`AmbiguousEntryPoint`, every package that registers the name."""
    if isinstance(ep, AmbiguousEntryPoint):  # two packages' name: neither is chosen
        raise error(ep.message(), plugin=name)
    try:
        target = ep.load()
    except Exception as exc:  # any import-time failure of a plugin, SyntaxError included
        raise error(
            f"{kind} {name!r} (entry point {ep.value!r}{_from(ep, None)}) failed to load: "
            f"{type(exc).__name__}: {exc}",
            plugin=name,
        ) from exc
    if not callable(target):
        raise error(
            f"{kind} {name!r} (entry point {ep.value!r}{_from(ep, None)}) is "
            f"{type(target).__name__}, not a {kind} class or factory",
            plugin=name,
        )
    return target


def guard(who: str | Callable[[], str], hook: str, fn: Callable) -> Callable:
    """``fn`` (a plugin's hook), raising :class:`~bass.errors.PluginError` naming ``who``
    (or what it returns, called only then: naming a package reads its metadata) and
    ``hook`` for anything it raises. Resolved once when a generation starts, never per step."""

    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            # already reported as what they are: a plugin's own (re-raised by a nested
            # hook) and a bad option value
            if isinstance(exc, (PluginError, OptionError)):
                raise
            name = who() if callable(who) else who
            raise PluginError(
                f"{name} raised in {hook}(): {type(exc).__name__}: {exc}", plugin=name, hook=hook
            ) from exc

    return call


def build(kind: str, target: Callable, name: str, ep, **options) -> Any:
    """``target(**options)`` (a plugin's class or factory, registered as ``name`` by entry
    point ``ep``): bass's own as is, another package's with its failures named as its own."""
    if is_builtin(target):
        return target(**options)
    return guard(lambda: describe(kind, target, name, ep), "__init__", target)(**options)
