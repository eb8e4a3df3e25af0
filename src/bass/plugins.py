"""Plugins (policies, drafters) from entry-point groups ``bass.policies`` and
``bass.drafters``: finding and naming them, and reporting another package's exceptions,
at build or in any hook, as a :class:`bass.errors.PluginError` naming it and the hook.
"""

from __future__ import annotations

import functools
import importlib.metadata
from collections.abc import Callable, Iterable
from typing import Any

from .errors import OptionError, PluginError, PluginLoadError

__all__ = [
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


def available(group: str, found: Iterable) -> dict[str, Any]:
    """The plugins of ``group``, ``found`` (its installed entry points, from the group's own
    seam) and bass's own (:data:`BUILTIN`), name -> entry point, sorted by name (of two
    packages registering one name, the first on ``sys.path`` wins)."""
    out: dict[str, Any] = {}
    for ep in found:
        out.setdefault(ep.name, ep)
    values = {ep.value for ep in out.values()}
    for name, value in BUILTIN.get(group, {}).items():  # bass's own, metadata or not
        if value not in values:
            out.setdefault(name, importlib.metadata.EntryPoint(name, value, group))
    return dict(sorted(out.items()))


def _from(ep, module: str | None) -> str:
    """``", from NAME VERSION"``: the distribution that installed ``ep`` (or owns
    ``module``); ``", from module X"`` for a module no distribution owns; ``""`` when
    nothing is known."""
    dist = getattr(ep, "dist", None)
    if dist is not None:
        return f", from {dist.metadata['Name']} {dist.version}"
    top = (module or "").partition(".")[0]
    names = importlib.metadata.packages_distributions().get(top, []) if top else []
    if names:
        try:
            return f", from {names[0]} {importlib.metadata.version(names[0])}"
        except importlib.metadata.PackageNotFoundError:
            return f", from {names[0]}"
    return f", from module {module}" if module else ""


def describe(kind: str, obj: Any, name: str | None = None, ep=None) -> str:
    """How errors name a plugin: ``policy 'mine' (MyPolicy, from my-pkg 1.0)``."""
    cls = obj if isinstance(obj, type) else type(obj)
    label = f"{kind} {name!r}" if name else kind
    return f"{label} ({cls.__qualname__}{_from(ep, getattr(cls, '__module__', None))})"


def is_builtin(obj: Any) -> bool:
    """Whether ``obj`` (a class or an instance) is one of bass's own."""
    cls = obj if isinstance(obj, type) else type(obj)
    return getattr(cls, "__module__", "").partition(".")[0] == "bass"


def load_target(kind: str, name: str, ep, error: type[PluginLoadError]) -> Callable[..., Any]:
    """What entry point ``ep`` (registered as ``name``) names, imported; a failure is
    ``error`` (the kind's :class:`~bass.errors.PluginLoadError`) naming it and its package."""
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


def guard(who: str, hook: str, fn: Callable) -> Callable:
    """``fn`` (a plugin's hook), raising :class:`~bass.errors.PluginError` naming ``who``
    and ``hook`` for anything it raises. Resolved once when a generation starts, never per step."""

    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            # already reported as what they are: a plugin's own (re-raised by a nested
            # hook) and a bad option value
            if isinstance(exc, (PluginError, OptionError)):
                raise
            raise PluginError(
                f"{who} raised in {hook}(): {type(exc).__name__}: {exc}", plugin=who, hook=hook
            ) from exc

    return call


def build(kind: str, target: Callable, name: str, ep, **options) -> Any:
    """``target(**options)`` (a plugin's class or factory, registered as ``name`` by entry
    point ``ep``): bass's own as is, another package's with its failures named as its own."""
    if is_builtin(target):
        return target(**options)
    return guard(describe(kind, target, name, ep), "__init__", target)(**options)
