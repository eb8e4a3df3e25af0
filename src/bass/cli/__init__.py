"""The ``bass`` command (also ``python -m bass``): its subcommands, flags, config file
and exit statuses are in docs/guides/config-and-cli.md."""

from __future__ import annotations

import contextlib
import errno
import importlib
import os
import re
import sys
import traceback
import warnings
from pathlib import Path

from ..config import ConfigError
from ..errors import UnsupportedModelError
from .errors import UsageError, err_line, one_line, stdout_to_devnull
from .filelock import command_line
from .generate import cmd_generate
from .info import cmd_bench, cmd_ops, cmd_policies
from .parser import Parser, build_parser
from .results import Terminated, terminated_as_interrupt

__all__ = ["UsageError", "build_parser", "main"]


def _report(line: str, exc: BaseException, debug: bool) -> None:
    """``line`` on stderr, after the traceback with ``debug``, before ``exc``'s notes."""
    if debug:
        traceback.print_exception(exc)
    err_line(line)
    for note in getattr(exc, "__notes__", None) or []:
        err_line(f"bass: {note}")


def _slices_as_values(argv: list[str]) -> list[str]:
    """``--problems -3:`` as ``--problems=-3:``: argparse reads a value that starts with
    ``-`` (a slice from the end) as another flag."""
    out = list(argv)
    for i in range(len(out) - 2, -1, -1):
        if out[i] == "--problems" and re.match(r"-\d*:|-\d+$", out[i + 1]):
            out[i : i + 2] = [f"--problems={out[i + 1]}"]
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the ``bass`` command; returns the exit status: 0, 2 for an error the user can
    fix (one ``bass: error:`` line), 130 when interrupted, 1 for a bug in bass (its type
    and message; the traceback with ``--debug`` or ``BASS_DEBUG=1``). Run as a command
    (no ``argv``), each warning is one ``bass: warning:`` line."""
    if argv is not None:  # called from Python: the caller's warnings, as it shows them
        return _main(argv)
    shown = warnings.showwarning
    warnings.showwarning = _warning_line
    # a terminal or pipe that is not UTF-8 (PYTHONIOENCODING=ascii, a Latin-1 locale): a
    # row's text it cannot encode is printed escaped (as stderr does), never an error that
    # ends the run before the row is written to --output
    errors = getattr(sys.stdout, "errors", None)
    with contextlib.suppress(AttributeError, ValueError):
        sys.stdout.reconfigure(errors="backslashreplace")
    try:
        return _main(None)
    except KeyboardInterrupt:  # Ctrl-C in the first seconds: while the modules import
        err_line("bass: interrupted")
        return 130
    finally:
        warnings.showwarning = shown
        with contextlib.suppress(AttributeError, ValueError, OSError):
            sys.stdout.reconfigure(errors=errors)


def _warning_line(message, category, filename, lineno, file=None, line=None) -> None:
    """A warning as one line on stderr (not the script's source line under it), naming the
    package it came from when that is not bass."""
    parts = Path(filename).parts
    origin = parts[parts.index("site-packages") + 1] if "site-packages" in parts else None
    origin = origin.split(".")[0] if origin else None
    said = f" ({category.__name__} from {origin})" if origin not in (None, "bass") else ""
    (file or sys.stderr).write(f"bass: warning: {message}{said}\n")  # one write: err_line


def _main(argv: list[str] | None) -> int:
    from ..batch_state import NonFiniteLogitsError
    from ..errors import OptionError, PluginError
    from ..humaneval import HumanEvalError
    from ..models import ModelNotFoundError

    parser = build_parser()
    owner = argv is None  # run as `bass` / `python -m bass`, not called from Python
    argv = _slices_as_values(sys.argv[1:] if argv is None else argv)
    try:
        args, extra = parser.parse_known_args(argv)
        if extra and args.command == "generate" and not any(e.startswith("-") for e in extra):
            args.prompts += extra  # prompts after options: `bass generate a --n 2 b`
        elif extra:  # named by the subcommand's help, in one line as argparse's own
            words = ["bass", args.command, getattr(args, "benchmark", None)]
            Parser(prog=" ".join(w for w in words if w)).error(
                f"unrecognized arguments: {' '.join(extra)}"
            )
    except SystemExit as exc:  # --help (0) or a usage error argparse has printed (2)
        return exc.code if isinstance(exc.code, int) else 2
    args.command_line = command_line(argv)  # for the lock files: who writes an output
    args.owner = owner  # the command owns its process (cli.loading.load_models)
    commands = {
        "generate": cmd_generate,
        "policies": cmd_policies,
        "bench": cmd_bench,
        "ops": cmd_ops,
        "eval": lambda args: importlib.import_module(".humaneval", __name__).cmd_humaneval(args),
    }
    # --debug, or BASS_DEBUG set to anything but 0/false/no: errors show their traceback
    env = os.environ.get("BASS_DEBUG", "").strip().lower() not in ("", "0", "false", "no")
    debug = env or args.debug
    user_errors = (
        UsageError,
        ConfigError,
        OptionError,
        ModelNotFoundError,
        PluginError,  # a policy's or a drafter's of another package, named with it
        HumanEvalError,
        NonFiniteLogitsError,
        UnsupportedModelError,  # a model bass refuses, saying why
    )
    try:
        with contextlib.ExitStack() as args.held:  # the outputs' locks, until the command ends
            args.held.enter_context(terminated_as_interrupt())
            return commands[args.command](args)
    except user_errors as exc:
        _report(f"bass: error: {one_line(exc)}", exc, debug)
        return 2
    except Terminated as exc:  # SIGTERM (a scheduler's, torchrun's): as Ctrl-C, status 143
        _report("bass: terminated", exc, debug)
        return 143
    except KeyboardInterrupt as exc:
        _report("bass: interrupted", exc, debug)
        return 130
    except BrokenPipeError:  # `bass policies | head`: the reader left; not an error of ours
        stdout_to_devnull()
        return 1
    except OSError as exc:
        if exc.errno not in _MACHINE_ERRNOS:
            return _unexpected(exc, debug)
        # a full disk or a failing device: the machine's. A write to standard output (`bass
        # policies > /dev/full`) or to an open file names no file: said as either
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.flush()  # what stdout holds, out now (a healthy one)
        if exc.filename:
            said = f"{exc.filename}: {exc.strerror}"
        else:
            said = f"{exc.strerror} (writing standard output or an open file)"
        stdout_to_devnull()  # not the same error again when Python flushes at exit
        _report(f"bass: error: {said}", exc, debug)
        return 2
    except Exception as exc:  # a bug in bass: one line, the traceback on request
        return _unexpected(exc, debug)


def _unexpected(exc: BaseException, debug: bool) -> int:
    """An error bass did not foresee: another torchrun rank gone, or a bug in bass (one
    line naming it, its traceback on request); exit status 1."""
    if _peer_stopped(exc):  # torchrun: this rank's collective lost another rank
        _report(
            "bass: error: another rank of this torchrun job stopped or did not answer "
            f"(its own error is in its output): {one_line(exc)}",
            exc,
            debug,
        )
        return 1
    hint = "" if debug else "; rerun with --debug (or BASS_DEBUG=1) for the traceback"
    _report(
        f"bass: error: internal error: {type(exc).__name__}: {one_line(exc)} (a bug in "
        f"bass: please report it{hint})",
        exc,
        debug,
    )
    return 1


#: A write's errors that say the machine's state (a full disk or quota, a read-only or
#: failing device), never a bug in bass.
_MACHINE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO)


def _peer_stopped(exc: BaseException) -> bool:
    """Whether ``exc`` is a collective that failed because another rank of a ``torchrun``
    job went away (gloo's and NCCL's errors are plain ``RuntimeError``s)."""
    from ..distributed import launched

    if not launched():
        return False
    import torch.distributed as dist

    if isinstance(exc, getattr(dist, "DistError", ())):
        return True
    # gloo's errors name its sources ("[gloo/pair.cc:553]", or a build path ".../gloo/...":
    # "Gloo connectFullMesh failed" when a restarted rank cannot rejoin), NCCL's
    # themselves; "Timed out waiting": a collective another rank never joined
    text = str(exc)
    peer = ("Connection closed by peer", "Connection reset by peer", "Timed out waiting")
    return isinstance(exc, RuntimeError) and (
        any(s in text for s in peer) or "gloo" in text.lower() or "NCCL" in text
    )
