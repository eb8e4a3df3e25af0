"""``bass generate``: batched speculative generation for prompts, with a summary of the run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from .errors import UsageError
from .loading import encode, load_models, make_generator, use_chat
from .progress import Progress
from .report import merge_stats, plot_steps, summary_text
from .settings import note_sampling, resolve_config

__all__ = ["cmd_generate", "read_prompts"]


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


def cmd_generate(args) -> int:
    from ..stopping import cut_at_stop

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
