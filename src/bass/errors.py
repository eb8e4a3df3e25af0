"""The exceptions bass raises for what a user or a plugin can fix (a core module: it
imports nothing of bass, so every layer can raise them)."""

from __future__ import annotations

from typing import Any

__all__ = [
    "ConfigError",
    "OptionError",
    "PluginError",
    "PluginLoadError",
    "PluginOutputError",
    "add_note",
]


class OptionError(TypeError, ValueError):
    """A value an option does not allow (a wrong type or a value out of range: both a
    ``TypeError`` and a ``ValueError``); the message names the option, the value and what
    is allowed. ``option``, ``value`` and ``allowed`` (what is, in words, where known)
    are kept on the exception."""

    def __init__(
        self, message: str, *, option: str | None = None, value: Any = None, allowed: str = ""
    ):
        super().__init__(message)
        self.option, self.value, self.allowed = option, value, allowed


class ConfigError(OptionError):
    """A configuration value that is not allowed; the message says where and what to do
    (a ``ValueError``; a wrong type is also a ``TypeError``, as :class:`OptionError`)."""


class PluginError(RuntimeError):
    """A plugin raised (``__cause__`` is its exception), named in the message with its
    package; ``plugin`` says which, ``hook`` where."""

    def __init__(self, message: str, *, plugin: str = "", hook: str = ""):
        super().__init__(message)
        self.plugin, self.hook = plugin, hook


class PluginOutputError(PluginError, ValueError, TypeError):
    """A plugin returned what its contract does not allow (the message says what)."""


class PluginLoadError(PluginError, ImportError):
    """A registered plugin could not be imported or built, or is not what its group
    needs (the original exception, if any, is chained)."""


class UnsupportedModelError(ValueError):
    """The model's attention cannot be routed through bass (also ``bass.hf``'s)."""


def add_note(exc: BaseException, note: str) -> None:
    """Attach ``note`` to ``exc`` as PEP 678's ``__notes__`` (Python 3.10 too): a
    traceback prints it after the message, and so does :func:`bass.cli.main`."""
    if hasattr(exc, "add_note"):  # Python >= 3.11
        exc.add_note(note)
    else:  # pragma: no cover - Python 3.10
        exc.__notes__ = [*getattr(exc, "__notes__", []), note]
