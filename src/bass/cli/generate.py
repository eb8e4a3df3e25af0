"""``bass generate``: batched speculative generation for prompts, with a summary of the run.

Nothing finished is lost: every path the command writes is checked before any model
loads; each batch's rows are appended to ``--output`` (flushed) and printed as soon as the
batch finishes, so a failure in a later batch or Ctrl-C keeps every finished row, and the
last line says how many were written. ``--resume`` skips the rows ``--output`` already
holds (a rerun of the same command continues where it stopped). Errors name a prompt by
where it came from: its line in ``--prompts-file`` or its position among the PROMPTs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from .errors import UsageError, add_note
from .loading import encode, load_models, make_generator, use_chat
from .progress import Progress
from .report import merge_stats, plot_steps, summary_text
from .results import Prompt, ResultsFile, check_writable, read_done
from .settings import note_sampling, resolve_config

__all__ = ["cmd_generate", "read_prompts"]


def read_prompts(args) -> list[Prompt]:
    """The PROMPT arguments, then the lines of ``--prompts-file``: strings that know where
    they came from (``Prompt.where``)."""
    prompts = [Prompt(p, f"PROMPT argument {k}") for k, p in enumerate(args.prompts, 1)]
    if args.prompts_file:
        prompts += _read_prompts_file(Path(args.prompts_file))
    if not prompts:
        raise UsageError("no prompt given; pass PROMPT arguments or --prompts-file FILE")
    for p in prompts:
        if not p.strip():
            raise UsageError(f"{p.where}: the prompt is empty; every prompt needs some text")
    return prompts


def _read_prompts_file(path: Path) -> list[Prompt]:
    """A .txt file's non-blank lines, or a .jsonl file's ``"prompt"`` fields (UTF-8)."""
    if path.is_dir():
        raise UsageError(f"--prompts-file {path} is a directory; pass a .txt or .jsonl file")
    if not path.is_file():
        raise UsageError(f"--prompts-file {path} does not exist; check the path")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UsageError(f"--prompts-file {path}: cannot read it: {exc.strerror}") from None
    try:
        text = data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise UsageError(
            f"{path}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
            f"{exc.start}); --prompts-file takes UTF-8 text: convert the file (e.g. with "
            "iconv -t utf-8)"
        ) from None
    out = []
    for number, line in enumerate(text.split("\n"), 1):
        line = line.removesuffix("\r")
        if not line.strip():
            continue
        where = f"{path}:{number}"
        if path.suffix == ".jsonl":
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


def _check_paths(args) -> Path | None:
    """Every path the command will write, checked before any model loads; returns the
    ``--output`` path."""
    out = check_writable(args.output, "--output") if args.output else None
    if args.resume and out is None:
        raise UsageError("--resume needs --output FILE: the results file of the run to continue")
    sources = [Path(args.prompts_file).resolve()] if args.prompts_file else []
    if out is not None and out.resolve() in sources:
        raise UsageError(
            f"--output {args.output} is the --prompts-file: the results would overwrite the "
            "prompts; choose another path"
        )
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
        if plot.resolve() in [*sources, *([out.resolve()] if out is not None else [])]:
            raise UsageError(f"--plot {args.plot} is also an input or --output; choose another")
    return out


def cmd_generate(args) -> int:
    from ..stopping import cut_at_stop

    prompts = read_prompts(args)
    n = 1 if args.n is None else args.n
    if n < 1:
        raise UsageError(f"--n must be >= 1 samples per prompt, got {n}")
    if args.batch_size is not None and args.batch_size < 1:
        raise UsageError(f"--batch-size must be >= 1 rows, got {args.batch_size}")
    out_path = _check_paths(args)
    config = resolve_config(args)
    note_sampling(args, config, n)
    rows = [(i, s) for i in range(len(prompts)) for s in range(n)]
    size = args.batch_size or len(rows)
    batches = [rows[i : i + size] for i in range(0, len(rows), size)]
    done = read_done(out_path, prompts, n) if args.resume else set()
    # (batch number, its rows still to generate): a resumed batch keeps its number, so its
    # seed (--seed + number) and rows are the uninterrupted run's
    todo = [(b, [r for r in batch if r not in done]) for b, batch in enumerate(batches)]
    todo = [(b, batch) for b, batch in todo if batch]
    if done and todo:
        print(
            f"bass: --resume: {len(done)} of {len(rows)} rows are already in {out_path}; "
            f"generating the other {len(rows) - len(done)}",
            file=sys.stderr,
        )
    if not todo:
        print(f"bass: nothing to generate: all {len(rows)} rows are in {out_path}")
        return 0

    main, tokenizer, draft = load_models(config, log=lambda m: print("bass: " + m, file=sys.stderr))
    chat = use_chat(tokenizer, config, config.model.main or "the default model")
    gen = make_generator(main, draft, config)
    needed = dict.fromkeys(i for _, batch in todo for i, _ in batch)
    encoded = {i: encode(tokenizer, prompts[i], chat) for i in needed}
    kwargs = config.generate_kwargs()
    kwargs.setdefault("eos_token_id", tokenizer.eos_token_id)
    stops = kwargs.get("stop_strings")
    if stops:
        kwargs["tokenizer"] = tokenizer
    max_new = kwargs["max_new_tokens"]
    enabled = sys.stderr.isatty() if args.progress is None else args.progress
    todo_rows = sum(len(batch) for _, batch in todo)
    progress = Progress(todo_rows * max_new, enabled)
    results = ResultsFile(out_path, args.resume) if out_path is not None else None
    batch_stats, reasons, written = [], [], 0
    try:
        for b, batch in todo:
            kw = dict(kwargs)
            if "seed" in kw:
                kw["seed"] = (kw["seed"] + b) % 2**63  # distinct batches draw distinct samples
            try:
                res = gen.generate([encoded[i] for i, _ in batch], on_step=progress.on_step, **kw)
            except Exception as exc:
                error = _batch_error(exc, batch, prompts, n)
                if error is exc:
                    raise
                raise error from exc
            progress.end_batch(len(batch) * max_new)
            records = []
            for (i, s), seq, why in zip(batch, res.sequences, res.finish_reasons, strict=True):
                text = tokenizer.decode(seq, skip_special_tokens=True)
                if stops and why == "stop":
                    text = cut_at_stop(text, stops)  # as generate_text: without the stop string
                records.append(
                    {
                        "prompt": str(prompts[i]),
                        "prompt_index": i,
                        "sample": s,
                        "completion": text,
                        "prompt_tokens": len(encoded[i]),
                        "completion_tokens": len(seq),
                        "finish_reason": why,
                        "batch": b,
                        "stats": res.stats.summary(),
                    }
                )
            if results is not None:
                results.write(records)  # appended and flushed: kept whatever happens next
            with progress.paused():
                for r in records:
                    tag = f" (sample {r['sample'] + 1}/{n})" if n > 1 else ""
                    print(f">>> {r['prompt']}{tag}\n{r['completion']}\n", flush=True)
            written += len(batch)
            batch_stats.append(res.stats)
            reasons += res.finish_reasons
    except BaseException as exc:  # an error or Ctrl-C: say what is kept, then report it
        add_note(exc, _kept(written, len(rows), done, out_path))
        raise
    finally:
        progress.close()
        if results is not None:
            results.close()

    summary = summary_text(
        merge_stats(batch_stats), rows=todo_rows, batches=len(todo), finish_reasons=reasons
    )
    print(summary)
    if done:
        print(f"  resumed             {len(done)} rows were already in {out_path}")
    if out_path is not None:
        print(f"  results             {out_path}")
    if args.plot:
        try:
            plot_steps(args.plot, batch_stats)
        except (OSError, ValueError) as exc:
            raise UsageError(f"--plot {args.plot}: cannot write the plot: {exc}") from exc
        print(f"  plot                {args.plot}")
    return 0


def _kept(written: int, total: int, done: set, out_path: Path | None) -> str:
    """The last line of a run that stopped early: how many rows were kept, and how to go on."""
    if out_path is None:
        return (
            f"{written} of {total} rows were generated and printed above; pass --output FILE to "
            "keep rows in a file (and --resume to continue a stopped run)"
        )
    before = f" ({len(done)} of them before this run)" if done else ""
    return (
        f"{written + len(done)} of {total} rows are in {out_path}{before}; rerun the same "
        "command with --resume to generate the rest"
    )


def _batch_error(exc: Exception, batch: list, prompts: list[Prompt], n: int) -> BaseException:
    """The error a failed batch reports: one that names its prompt by its line in the
    prompts file (or its PROMPT argument), for what a user can fix; the error as is
    otherwise (a bug: reported with its type, and its traceback with --debug)."""
    import torch

    from ..batch_state import NonFiniteLogitsError, PromptError

    k = getattr(exc, "prompt", None)
    if isinstance(exc, (PromptError, NonFiniteLogitsError)) and k is not None:
        i, s = batch[k]
        sample = f" (sample {s + 1} of {n})" if n > 1 else ""
        return UsageError(exc.naming(f"the prompt at {prompts[i].where}{sample}"))
    if isinstance(exc, torch.OutOfMemoryError):
        first = str(exc).split("\n")[0]
        return UsageError(f"out of memory: {first}; lower --batch-size or --max-new-tokens")
    if isinstance(exc, (ValueError, NonFiniteLogitsError)):
        return UsageError(str(exc))
    return exc
