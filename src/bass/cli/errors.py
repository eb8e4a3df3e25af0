"""The error a ``bass`` subcommand raises for something the user can fix, and its lines
on stderr."""

from __future__ import annotations

import contextlib
import os
import sys

from ..errors import add_note  # re-exported (bass.cli.main prints notes)
from ..options import OptionError, fail

__all__ = ["UsageError", "add_note", "flag_error", "one_line", "say"]


class UsageError(Exception):
    """Something the user can fix; printed as ``bass: error: ...`` (exit status 2)."""


def stdout_to_devnull() -> None:
    """Standard output's reader left (a pipe into ``head``): what is printed from now on
    goes nowhere (not another ``BrokenPipeError``, nor one when Python flushes at exit)."""
    with contextlib.suppress(OSError, ValueError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def say(message: str) -> None:
    """``bass: MESSAGE`` on stderr."""
    err_line("bass: " + message)


def err_line(line: str) -> None:
    """``line`` on stderr in one write (``print`` writes the newline apart: the ranks of a
    torchrun job, sharing one stderr, glued each other's lines together)."""
    sys.stderr.write(line + "\n")


def one_line(exc: BaseException, limit: int | None = None) -> str:
    """``exc``'s message on one line (its type's name when it has none), cut to about
    ``limit`` characters."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if limit is None or len(text) <= limit else text[: limit - 3] + "..."


def flag_error(flag: str, value, allowed: str, absent: str | None = None):
    """A command-line-only flag's bad value as an :class:`~bass.options.OptionError`, in
    the words the flags that set a config key use (``command line: --n = 0 is not allowed;
    expected ...``); ``absent``: what leaving the flag out means."""
    err = fail(flag.lstrip("-"), value, allowed, where="command line", label=flag)
    if absent is not None:
        err = OptionError(f"{err} (leave it out: {absent})", option=err.option, value=value)
    return err
