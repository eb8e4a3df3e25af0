"""The ``bass`` command (also ``python -m bass``).

Subcommands::

    bass generate [PROMPT ...]    batched speculative generation, with a summary of the run
    bass policies                 installed draft-length policies, their options and defaults
    bass eval humaneval           HumanEval Pass@First/Pass@All, regular vs speculative
    bass ops                      attention implementations here, and the auto rule in force
    bass bench                    where the latest benchmark results are (`nox -s bench`)

Settings come from, in increasing priority: the defaults, ``--config FILE`` (TOML, see
:mod:`bass.config`), then the command-line flags. Errors a user can act on print as
``bass: error: ...`` and exit with status 2, without a traceback.

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

# Besides what main needs: the names the single-module bass.cli had (the noqa ones).
from ..config import ConfigError
from .errors import UsageError
from .generate import cmd_generate, read_prompts  # noqa: F401
from .info import cmd_bench, cmd_ops, cmd_policies
from .loading import encode, load_models, make_generator, use_chat  # noqa: F401
from .parser import DTYPE_NAMES, build_parser, unescape  # noqa: F401
from .progress import Progress  # noqa: F401
from .report import merge_stats, plot_steps, short_trace, summary_text  # noqa: F401
from .settings import FLAG_KEYS, note_sampling, resolve_config  # noqa: F401

__all__ = ["UsageError", "main"]


def main(argv: list[str] | None = None) -> int:
    """Run the ``bass`` command; returns the exit status."""
    from ..humaneval import HumanEvalError
    from ..models import ModelNotFoundError
    from ..policies import PolicyLoadError

    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
        if extra and args.command == "generate" and not any(e.startswith("-") for e in extra):
            args.prompts += extra  # prompts after options: `bass generate a --n 2 b`
        elif extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as exc:  # --help (0) or a usage error argparse has printed (2)
        return exc.code if isinstance(exc.code, int) else 2
    commands = {
        "generate": cmd_generate,
        "policies": cmd_policies,
        "bench": cmd_bench,
        "ops": cmd_ops,
        "eval": lambda args: importlib.import_module(".humaneval", __name__).cmd_humaneval(args),
    }
    try:
        return commands[args.command](args)
    except (UsageError, ConfigError, ModelNotFoundError, PolicyLoadError, HumanEvalError) as exc:
        print(f"bass: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("bass: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `bass policies | head`: the reader left; not an error of ours
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
