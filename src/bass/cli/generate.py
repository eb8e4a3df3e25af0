"""``bass generate``: batched speculative generation for prompts, with a summary of the
run. What it reads, checks, prints and writes: docs/guides/config-and-cli.md."""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import stat
import sys
from pathlib import Path

from ..errors import UnsupportedModelError
from ..options import OPTIONS, OptionError, check, check_config_eos, check_stops_shown
from ..scheduler import MAX_ROWS_N
from ..stats import GenerationStats
from . import scaleout
from .errors import UsageError, add_note, flag_error, say
from .filelock import lock_outputs
from .loading import check_kv_budget, check_sources, load_models, make_generator, use_chat
from .progress import Progress
from .progress import shown as progress_shown
from .report import comparison_text, plot_steps, summary_text
from .results import (
    LineWriter,
    Prompt,
    check_chat,
    check_not_inputs,
    check_output_flags,
    check_writable,
    read_done,
)
from .rows import kept_note, line, print_merged, print_rows, row_error, stdout_closed
from .settings import note_sampling, resolve_config

__all__ = [
    "MAX_JOB_ROWS",
    "check_batch_flags",
    "check_stop_flag",
    "cmd_generate",
    "read_prompts",
    "row_settings",
]

#: The most rows (prompts x ``--n``) one run takes: the library's bound on one call's.
MAX_JOB_ROWS = MAX_ROWS_N
NO_LOGPROBS = {"logprobs": False, "prompt_logprobs": False}  # --compare's drafting off


def _a_compile_mode(text: str) -> bool:
    """Whether ``--compile`` accepts ``text`` (the option's own check)."""
    try:
        check("compile", text)
    except OptionError:
        return False
    return True


def read_prompts(args) -> list[Prompt]:
    """The PROMPT arguments, then the lines of ``--prompts-file``: strings that know where
    they came from (``Prompt.where``)."""
    prompts = [Prompt(p, f"PROMPT argument {k}") for k, p in enumerate(args.prompts, 1)]
    if args.prompts_file is not None and not args.prompts_file.strip():
        raise UsageError(f"--prompts-file {args.prompts_file!r}: pass a file path (or - for stdin)")
    if args.prompts_file:
        prompts += _read_prompts_file(args.prompts_file)
    if not prompts and args.prompts_file:
        raise UsageError(
            f"{args.prompts_file} holds no prompt (no line with text); put one prompt per "
            "line, or pass PROMPT arguments"
        )
    if not prompts:
        took = getattr(args, "compile", None)
        hint = (
            f" (--compile took {took!r} as its MODE: put prompts before --compile, or write "
            "--compile=MODE)"
            if isinstance(took, str) and not _a_compile_mode(took)
            else ""
        )
        raise UsageError(f"no prompt given; pass PROMPT arguments or --prompts-file FILE{hint}")
    for p in prompts:
        if not p.strip():
            raise UsageError(f"{p.where}: the prompt is empty; every prompt needs some text")
        # a lone surrogate (a byte the shell's locale could not decode, or "\ud800" in a
        # JSON line): the tokenizer cannot encode it
        try:
            p.encode("utf-8")
        except UnicodeEncodeError as exc:
            bad = ord(p[exc.start])
            byte = f"the byte 0x{bad - 0xDC00:02x}, which is not UTF-8"
            cause = byte if 0xDC80 <= bad <= 0xDCFF else "a lone surrogate"
            raise UsageError(
                f"{p.where}: not valid Unicode text (U+{bad:04X} at character {exc.start + 1}: "
                f"{cause}); pass UTF-8 text"
            ) from None
    n = n_of(args)
    if len(prompts) * n > MAX_JOB_ROWS:
        flag = getattr(args, "n_flag", "--n")  # as typed: --n or --samples
        some = f"{len(prompts)} prompt{'s' if len(prompts) != 1 else ''}"
        raise UsageError(
            f"{some} x {flag} {n} = {len(prompts) * n} rows; bass generate takes "
            f"at most {MAX_JOB_ROWS:,} rows (prompts x {flag}) per run: split the prompts over "
            "several runs (each with its own --output)"
        )
    return prompts


#: Where a line ends in a prompts file: ``\r\n`` (Windows), ``\n`` or a lone ``\r`` (old
#: Mac OS); not the other characters ``str.splitlines`` takes (a form feed is text).
_LINE_END = re.compile(r"\r\n|\r|\n")


def _read_prompts_file(name: str) -> list[Prompt]:
    """A .jsonl file's ``"prompt"`` fields (``.JSONL`` too), or the non-blank lines of any
    other file but a ``.json`` one, or of standard input (``-``)."""
    mode = 0  # the input's file type: on a terminal, say how to end the prompts
    if name == "-":
        path, stream = Path("stdin"), getattr(sys.stdin, "buffer", None)  # lines: stdin:3
        if stream is None:
            raise UsageError("--prompts-file -: there is no standard input to read; pass a file")
        with contextlib.suppress(OSError, ValueError):
            mode = os.fstat(stream.fileno()).st_mode
        read, failed = stream.read, "--prompts-file -: cannot read standard input"
    else:
        path = Path(name)
        if path.suffix.lower() == ".json":
            raise UsageError(
                f"--prompts-file {path}: a .json file is not read; --prompts-file takes a "
                '.jsonl file (one JSON object with a "prompt" field per line) or text (one '
                "prompt per line, e.g. .txt): rename it to .jsonl if it holds one object per line"
            )
        if path.is_dir():
            raise UsageError(f"--prompts-file {path} is a directory; pass a .txt or .jsonl file")
        if not path.exists():  # a pipe (/dev/stdin) or a FIFO is read as a file is
            fd = name.startswith("/dev/fd/") or name.startswith("/proc/self/fd/")
            raise UsageError(
                f"--prompts-file {path} does not exist; check the path"
                + (
                    " (a shell's <(...) under torchrun: its workers do not get the shell's "
                    "open files; write the prompts to a file, or pipe them: --prompts-file -)"
                    if fd and os.environ.get("WORLD_SIZE")
                    else ""
                )
            )
        if not path.is_file():
            mode = os.stat(path).st_mode
        read, failed = path.read_bytes, f"--prompts-file {path}: cannot read it"
    if stat.S_ISCHR(mode) and sys.stdin.isatty():
        say("reading prompts from the terminal, one per line; end them with Ctrl-D")
    try:
        data = read()
    except OSError as exc:
        raise UsageError(f"{failed}: {exc.strerror}") from None
    try:
        text = data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        line = len(_LINE_END.findall(data[: exc.start].decode("utf-8"))) + 1
        raise UsageError(
            f"{path}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
            f"{exc.start}); --prompts-file takes UTF-8 text: convert the file (e.g. with "
            "iconv -t utf-8)"
        ) from None
    jsonl = name != "-" and path.suffix.lower() == ".jsonl"
    out = []
    for number, line in enumerate(_LINE_END.split(text), 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        if jsonl:
            try:
                record = json.loads(line)
            except ValueError:
                record = None
            prompt = record.get("prompt") if isinstance(record, dict) else None
            if not isinstance(prompt, str):
                raise UsageError(f'{where}: expected a JSON object with a "prompt" string field')
            out.append(Prompt(prompt, where))
        else:
            out.append(Prompt(line, where))
    return out


def _check_paths(args, config) -> Path | None:
    """Every path the command will write, checked before any model loads; returns the
    ``--output`` path."""
    check_output_flags(args)
    out = check_writable(args.output, "--output", resume=args.resume) if args.output else None
    if args.resume and args.overwrite:
        raise UsageError(
            "--resume continues the rows --output holds and --overwrite replaces them: "
            "pass one of them"
        )
    if args.plot is not None and not args.plot.strip():
        raise UsageError(f"--plot {args.plot!r}: pass a file path such as steps.png")
    if args.plot:
        try:
            import matplotlib  # noqa: F401
            from matplotlib.backend_bases import FigureCanvasBase
        except ImportError:
            raise UsageError(
                "--plot needs matplotlib; install it with: pip install matplotlib"
            ) from None
        plot = check_writable(args.plot, "--plot")
        kinds = FigureCanvasBase.get_supported_filetypes()
        if plot.suffix and plot.suffix[1:].lower() not in kinds:
            raise UsageError(
                f"--plot {args.plot}: matplotlib cannot write {plot.suffix} files; use one of "
                + ", ".join(f".{k}" for k in sorted(kinds))
            )
    check_not_inputs({"--output": args.output, "--plot": args.plot}, args, config)
    return out


def n_of(args) -> int:
    """``--n``, checked: samples per prompt (1 when not given)."""
    n = 1 if args.n is None else args.n
    if n < 1:
        flag = getattr(args, "n_flag", "--n")
        raise flag_error(flag, n, "an integer >= 1", "1 sample per prompt")
    return n


def row_settings(config) -> dict:
    """The settings that change what a results row should be, as every row stores them
    (``--resume`` refuses a file made with others; which: docs/guides/config-and-cli.md)."""
    from ..models import ModelNotFoundError, default_model_file

    m, g = config.model, config.generation
    main = m.main
    if main is not None and Path(main).exists():
        main = str(Path(main).resolve())
        with contextlib.suppress(ModelNotFoundError):  # the embedded default, named: as null
            if main == str(default_model_file().resolve()):
                main = None
    sampling = ("temperature", "top_k", "top_p", "min_p", "seed")  # none of them when greedy
    settings = {
        "main": main,
        "dtype": m.dtype,
        "chat": m.chat,
        "max_new_tokens": g.max_new_tokens,
        "do_sample": bool(g.do_sample),
        **{k: getattr(g, k) if g.do_sample else None for k in sampling},
        "eos_token_id": g.eos_token_id,
        "stop_strings": g.stop_strings,
        "logprobs": g.logprobs,  # what a row holds
        "prompt_logprobs": g.prompt_logprobs or None,
        "repetition_penalty": None if g.repetition_penalty == 1 else g.repetition_penalty,
        **{k: getattr(g, k) or None for k in ("frequency_penalty", "presence_penalty")},
    }
    return json.loads(json.dumps(settings))  # as a results file holds them


def check_stop_flag(stops, tokenizer) -> None:
    """Refuse, before the first row, a ``--stop`` that could never match (special tokens)."""
    try:
        check_stops_shown(stops, tokenizer, "--stop (or [generation] stop_strings)", "the stop")
    except OptionError as exc:
        raise UsageError(str(exc)) from None


def check_batch_flags(args) -> None:
    """``--batch-size`` and ``--kv-budget-gib`` (``bass generate``, ``bass eval
    humaneval``), checked before anything loads."""
    if args.batch_size is not None and args.batch_size < 1:
        raise flag_error(
            "--batch-size", args.batch_size, "an integer >= 1", OPTIONS["max_rows"].absent
        )
    if args.kv_budget_gib is not None:  # a bad value: OptionError, one line and status 2
        check("kv_budget_gib", args.kv_budget_gib, where="command line", label="--kv-budget-gib")


def cmd_generate(args) -> int:
    from ..batch_state import PromptError, check_prompts
    from ..models import default_eos, encode_prompt
    from ..sampling import row_key
    from ..stopping import cut_at_stop, decode_after

    n = n_of(args)
    check_batch_flags(args)
    scale = scaleout.start(args)  # one process, or torchrun's ranks (bass.distributed)
    prompts = scale.read_once(lambda: read_prompts(args), args.prompts_file)
    config = resolve_config(args)
    if args.compare and config.model.draft == "none":
        raise UsageError(
            "--compare compares drafting on with drafting off, but the draft is 'none' "
            "(drafting off): choose a drafter (--draft ngram or a draft model) or drop --compare"
        )
    out_path = _check_paths(args, config)
    device = None  # --output a character device (/dev/null) of a data-parallel run
    if scale.sharded and out_path is not None and out_path.exists() and not out_path.is_file():
        # no shards beside it (nor a merge, making it a file): rank 0 writes the rows there
        device, out_path = out_path, None
    # one writer per file: rank 0's
    scale.first(lambda: lock_outputs(args, {"--output": args.output, "--plot": args.plot}))
    if out_path is not None:
        scale.check_shared(out_path)  # ranks on several machines: one directory for all
        scale.first(lambda: scaleout.check_files(out_path))
        if not (args.resume or args.overwrite):  # finished rows kept
            scale.first(lambda: scaleout.check_unused(out_path))
    if config.generation.do_sample and config.generation.seed is None:
        # one seed for the run, every row's, so --resume draws what the run would have
        # (rank 0's reading: a rank that read the shards as rank 0 merged them would
        # disagree, and take part in one collective less)
        found, seed = scale.shared(scaleout.seed_in(out_path)) if args.resume else (False, None)
        if not found:
            seed = scale.shared(secrets.randbelow(2**31))
            if scale.prints:
                say(f"note: sampling without --seed: this run's seed is {seed} (--seed {seed} "
                    "draws the same samples; every row in --output records it)")  # fmt: skip
        config.generation.seed = seed
    settings = row_settings(config)
    # (the main model's path as each machine resolves it may differ: not compared)
    scale.agree("generation settings", {k: v for k, v in settings.items() if k != "main"})
    if scale.prints:
        note_sampling(args, config, n)
    rows = [(i, s) for i in range(len(prompts)) for s in range(n)]
    done, unchecked, chats = set(), 0, {}
    if args.resume:  # the shards of a stopped data-parallel run join --output first

        def merge() -> None:  # every file checked before any is changed
            parts = scaleout.shards(out_path)
            if not parts:
                return  # nothing to join: --output is checked once, below
            for part in [out_path, *parts]:
                read_done(part, prompts, n, settings, truncate=False)
            scaleout.merge(out_path)

        scale.first(merge)
        done, unchecked = read_done(out_path, prompts, n, settings, chats=chats)
    if unchecked and scale.prints:
        say(
            f"note: --resume: {unchecked} rows in {out_path} carry no settings (written by an "
            "older bass): their generation settings are not checked"
        )
    # this rank's group's rows still to generate, in order: samples are keyed by (prompt,
    # sample) alone (bass.sampling.row_key), whatever the batch, --resume, ranks or --n
    todo = scale.rows(rows, done)
    if done and scale.prints:
        say(
            f"--resume: {len(done)} of {len(rows)} rows are already in {out_path}; "
            f"generating the other {len(rows) - len(done)}"
        )
    if args.compare and scale.active:
        raise UsageError("--compare runs in one process; run it without torchrun")
    if not any(scale.every(len(todo)) if scale.sharded else [todo]):  # no group has work
        if scale.prints:
            say(f"nothing to generate: all {len(rows)} rows are in {out_path}")
        return 0

    log = say if scale.prints else None
    enabled = progress_shown(args.progress) and scale.prints
    check_sources(config)  # the main model's and the draft's, before either loads
    check_kv_budget(config, args.kv_budget_gib, scale.topo.tp)  # from their configs
    main, tokenizer, draft = load_models(
        config, log=log, tp=scale.topo.tp, bars=enabled, owner=args.owner
    )
    chat = use_chat(tokenizer, config)
    check_chat(chats, chat, tokenizer)  # --resume: as the rows were made
    settings["chat"] = chat  # the rows say whether the template applied
    gen = make_generator(main, draft, config, tokenizer)
    plain = make_generator(main, None, config) if args.compare else None
    needed = dict.fromkeys(i for i, _ in todo)
    # every prompt of the job checked before the first batch, on every rank (one group's
    # bad prompt would otherwise stop it mid-job while the others wait for it)
    checked = dict.fromkeys(i for i, s in rows if (i, s) not in done) if scale.sharded else needed
    encoded = {i: encode_prompt(tokenizer, prompts[i], chat) for i in checked}
    if encoded:  # (none: the job is done)
        try:
            check_prompts(list(encoded.values()), config.generation.max_new_tokens, gen.models)
        except PromptError as exc:
            where = prompts[list(encoded)[exc.prompt]].where
            raise UsageError(exc.naming(f"the prompt at {where}")) from exc
    kwargs = {**config.generate_kwargs(), "do_sample": bool(config.generation.do_sample)}
    check_config_eos(kwargs, main, args.config or "config")  # against the loaded model
    kwargs.setdefault("eos_token_id", default_eos(tokenizer, main))
    stops = kwargs.get("stop_strings")
    if stops:
        kwargs["tokenizer"] = tokenizer
        check_stop_flag(stops, tokenizer)
    progress = Progress(len(todo), enabled)
    results = None
    if out_path is not None and scale.writes:
        # as one process: --output replaced (with the shards of an earlier run), or resumed
        if scale.topo.is_main and not args.resume:
            scale.replace(out_path)
        target = scale.shard_path(out_path) if scale.sharded else out_path
        results = LineWriter(target, "--output", append=args.resume)
    ids = [row_key(i, s) for i, s in todo]
    job = dict(row_ids=ids, max_rows=args.batch_size, kv_budget_gib=args.kv_budget_gib, **kwargs)
    kept, reasons, written, closed = [], [""] * len(todo), 0, False
    off = None  # --compare: drafting off's result, and bass's tokens of the same rows
    tokens = [None] * len(todo) if plain is not None else None
    if plain is not None:  # first-use costs (allocations, layouts) land on neither run
        for g in (plain, gen):
            g.generate([next(iter(encoded.values()))], max_new_tokens=2)
    try:
        if todo:
            if plain is not None:  # drafting off first: the same rows and settings
                off = plain.generate([encoded[i] for i, _ in todo], **job | NO_LOGPROBS)
            # each row printed and appended to --output the moment it finishes, then released
            stream = gen.stream([encoded[i] for i, _ in todo], on_step=progress.on_step, **job)
            with contextlib.closing(stream):  # a failed write ends the generation
                for row in stream:
                    i, s = todo[row.prompt]
                    text = decode_after(tokenizer, encoded[i], row.tokens)
                    if stops and row.finish_reason == "stop":  # as generate_text: no stop string
                        text = cut_at_stop(text, stops)
                    record = {
                        "prompt": str(prompts[i]),
                        "prompt_index": i,
                        "sample": s,
                        "completion": text,
                        "prompt_tokens": len(encoded[i]),
                        "completion_tokens": len(row.tokens),
                        "finish_reason": row.finish_reason,
                        "rank": scale.topo.rank,
                        "stats": progress.row_stats(row.prompt),
                        "settings": settings,
                    }
                    if row.logprobs is not None:  # each new token's (a stop string's too)
                        record |= {"token_ids": row.tokens, "logprobs": row.logprobs}
                    if (plp := row.prompt_logprobs) is not None:  # the first token's: null
                        record |= {"prompt_token_ids": encoded[i], "prompt_logprobs": plp}
                    progress.row_done(len(row.tokens))
                    if scale.sharded:  # rank 0 prints every group's rows at the end
                        if out_path is None:  # (with --output: from the merged file)
                            kept.append(record)
                    elif scale.prints and not closed:  # first: on screen even if the write fails
                        try:
                            with progress.paused():
                                print_rows([record], n)
                        except OSError as exc:  # `| head` (the reader left), a full disk:
                            if results is None:  # the file goes on
                                raise
                            with progress.paused():  # the note on a line of its own
                                closed = stdout_closed(out_path, exc)
                    if results is not None:  # unbuffered: kept whatever happens next
                        results.write(line(record))
                    written += 1
                    reasons[row.prompt] = row.finish_reason
                    if tokens is not None:  # --compare: both runs' rows side by side
                        tokens[row.prompt] = row.tokens
    except BaseException as exc:  # an error or Ctrl-C: say what is kept, then report it
        error = row_error(exc, todo, prompts, n)
        # the file's count: a Ctrl-C held back while a row was written lands after it
        kept_rows = written if results is None else results.lines
        if not isinstance(error, UnsupportedModelError):  # no rerun makes it generate
            add_note(error, kept_note(kept_rows, len(rows), done, out_path, scale))
        if error is exc:
            raise
        raise error from exc
    finally:
        progress.close()
        if results is not None:
            results.close()

    run_stats = [gen.stats] if todo else []
    if scale.sharded:  # every group's statistics (and rows, without --output) to rank 0
        parts = scale.gather((kept, run_stats, reasons, written))
        if parts is None:
            return 0
        if out_path is not None:  # the rows stay on disk: merged, then printed from the file
            scaleout.merge(out_path)
            print_merged(out_path, done, n, sum(p[3] for p in parts))
        else:
            every = sorted(
                (r for p in parts for r in p[0]), key=lambda r: (r["prompt_index"], r["sample"])
            )
            print_rows(every, n)
            if device is not None:
                with contextlib.closing(LineWriter(device, "--output")) as dest:
                    dest.write("".join(map(line, every)))
        run_stats = [st for p in parts for st in p[1]]
        reasons = [why for p in parts for why in p[2]]
    if not scale.prints:  # progress, completions and the summary: rank 0's
        return 0
    merged = GenerationStats.merge(run_stats)
    side = ""
    if scale.sharded:  # the groups ran side by side: the job took its slowest group's time
        walls = [sum(st.wall_seconds for st in p[1]) for p in parts]
        merged.wall_seconds = max(walls)
        merged.prefill_seconds = max(sum(st.prefill_seconds for st in p[1]) for p in parts)
        side = "; times: the slowest group's, of " + ", ".join(f"{w:.2f} s" for w in walls)
    print(summary_text(merged, rows=len(reasons), finish_reasons=reasons))
    if off is not None:
        print(comparison_text(off, tokens, gen, config.generation.do_sample))
    if scale.active:
        t = scale.topo
        print(
            f"  ranks               {t.world} ({t.dp} data-parallel x {t.tp} tensor-parallel{side})"
        )
    if done:
        print(f"  resumed             {len(done)} rows were already in {out_path}")
    if out_path is not None or device is not None:
        print(f"  results             {out_path or device}")
    if args.plot:
        try:
            plot_steps(args.plot, run_stats)
        except (OSError, ValueError) as exc:
            raise UsageError(f"--plot {args.plot}: cannot write the plot: {exc}") from exc
        print(f"  plot                {args.plot}")
    return 0
