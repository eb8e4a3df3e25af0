"""The ``bass`` command (also ``python -m bass``).

Subcommands::

    bass generate [PROMPT ...]    batched speculative generation, with a summary of the run
    bass policies                 installed draft-length policies, their options and defaults
    bass eval humaneval           HumanEval Pass@First/Pass@All, regular vs speculative
    bass ops                      attention implementations here, and the auto rule in force
    bass bench                    where the latest benchmark results are (`nox -s bench`)

Settings come from, in increasing priority: the defaults, ``--config FILE`` (TOML, see
:mod:`bass.config`), then the command-line flags. Errors a user can act on print as one
``bass: error: ...`` line and exit with status 2, without a traceback (``--debug`` or
``BASS_DEBUG=1`` prints it); Ctrl-C exits with 130; a bug in bass prints its type and
message and exits with 1.

The package: :mod:`~bass.cli.parser` (the flags), :mod:`~bass.cli.settings` (defaults <
``--config`` < flags), :mod:`~bass.cli.loading` (models and generator), the subcommands
(:mod:`~bass.cli.generate`, with :mod:`~bass.cli.progress` and :mod:`~bass.cli.report`;
:mod:`~bass.cli.humaneval`; :mod:`~bass.cli.info` for ``policies`` and ``bench``), and
here :func:`main`, which dispatches and turns errors into exit statuses. The names the
single-module ``bass.cli`` had are importable from here as before.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import traceback

# Besides what main needs: the names the single-module bass.cli had (the noqa ones).
from ..config import ConfigError
from .errors import UsageError, notes
from .filelock import command_line
from .generate import cmd_generate, read_prompts  # noqa: F401
from .info import cmd_bench, cmd_ops, cmd_policies
from .loading import encode, load_models, make_generator, use_chat  # noqa: F401
from .parser import DTYPE_NAMES, Parser, build_parser, unescape  # noqa: F401
from .progress import Progress  # noqa: F401
from .report import merge_stats, plot_steps, short_trace, summary_text  # noqa: F401
from .settings import FLAG_KEYS, note_sampling, resolve_config  # noqa: F401

__all__ = ["UsageError", "main"]


def debugging(args=None) -> bool:
    """``--debug``, or ``BASS_DEBUG`` set (to anything but 0/false/no): errors show their
    Python traceback (for bug reports)."""
    env = os.environ.get("BASS_DEBUG", "").strip().lower() not in ("", "0", "false", "no")
    return env or bool(getattr(args, "debug", False))


def _report(line: str, exc: BaseException, debug: bool) -> None:
    """``line`` on stderr, after the traceback with ``debug``, before ``exc``'s notes (what
    a stopped run kept: the last line)."""
    if debug:
        traceback.print_exception(exc)
    print(line, file=sys.stderr)
    for note in notes(exc):
        print(f"bass: {note}", file=sys.stderr)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def main(argv: list[str] | None = None) -> int:
    """Run the ``bass`` command; returns the exit status: 0, 2 for an error the user can
    fix (one ``bass: error:`` line), 130 when interrupted, 1 for a bug in bass (its type
    and message; the traceback with ``--debug`` or ``BASS_DEBUG=1``)."""
    from ..batch_state import NonFiniteLogitsError
    from ..errors import OptionError, PluginError
    from ..humaneval import HumanEvalError
    from ..models import ModelNotFoundError

    parser = build_parser()
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
    commands = {
        "generate": cmd_generate,
        "policies": cmd_policies,
        "bench": cmd_bench,
        "ops": cmd_ops,
        "eval": lambda args: importlib.import_module(".humaneval", __name__).cmd_humaneval(args),
    }
    debug = debugging(args)
    user_errors = (
        UsageError,
        ConfigError,
        OptionError,
        ModelNotFoundError,
        PluginError,  # a policy's or a drafter's of another package, named with it
        HumanEvalError,
        NonFiniteLogitsError,
    )
    try:
        return commands[args.command](args)
    except user_errors as exc:
        _report(f"bass: error: {_one_line(exc)}", exc, debug)
        return 2
    except KeyboardInterrupt as exc:
        _report("bass: interrupted", exc, debug)
        return 130
    except BrokenPipeError:  # `bass policies | head`: the reader left; not an error of ours
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except Exception as exc:  # a bug in bass: one line, the traceback on request
        hint = "" if debug else "; rerun with --debug (or BASS_DEBUG=1) for the traceback"
        _report(
            f"bass: error: internal error: {type(exc).__name__}: {_one_line(exc)} (a bug in "
            f"bass: please report it{hint})",
            exc,
            debug,
        )
        return 1
