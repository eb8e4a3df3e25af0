"""The error a ``bass`` subcommand raises for something the user can fix, and the notes a
command adds to an error on its way out (what was kept, how to go on)."""

from __future__ import annotations

__all__ = ["UsageError", "add_note", "notes"]


class UsageError(Exception):
    """Something the user can fix; printed as ``bass: error: ...`` (exit status 2)."""


def add_note(exc: BaseException, note: str) -> None:
    """Attach ``note`` to ``exc`` (PEP 678's ``__notes__``, so a traceback shows it too);
    :func:`bass.cli.main` prints it after the error line."""
    if hasattr(exc, "add_note"):  # Python >= 3.11
        exc.add_note(note)
    else:  # pragma: no cover - Python 3.10
        exc.__notes__ = [*getattr(exc, "__notes__", []), note]


def notes(exc: BaseException) -> list[str]:
    return list(getattr(exc, "__notes__", None) or [])
