"""Scoring: each sample's check, Pass@First and Pass@All per problem and per method, the
JSON lines and the table."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from .execution import DEFAULT_TIMEOUT, CheckResult, run_check
from .problems import HumanEvalError
from .samples import Sample, SampleFn

__all__ = [
    "MethodReport",
    "ProblemScore",
    "evaluate",
    "first_finished",
    "format_table",
    "score_problem",
]


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

    def row(self) -> dict:
        return {
            "method": self.name,
            "problems": len(self.scores),
            "pass_first": round(self.pass_first, 4),
            "pass_all": round(self.pass_all, 4),
            "tokens_per_second": round(self.tokens_per_second, 2),
            "mean_accepted": round(self.mean_accepted, 4),
        }


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
) -> list[MethodReport]:
    """Generate and score ``n`` samples per problem with every method.

    The problems go in chunks of ``chunk`` (default: all at once): each method generates
    the ``n`` samples of every problem of a chunk in one call (continuously batched: rows
    of other problems take the slots of finished ones), the methods in turn, chunk by
    chunk, so a drift in machine speed hits all methods alike. ``output`` gets one JSON
    line per problem once every method has generated and scored its chunk; ``progress``
    a line as each problem's samples are done (generation) and as each is scored."""
    if n < 1:
        raise HumanEvalError(f"--n must be >= 1 samples per problem, got {n}")
    if chunk is not None and chunk < 1:
        raise HumanEvalError(f"chunk must be >= 1 problems per call, got {chunk}")
    reports = {name: MethodReport(name) for name in methods}
    step = chunk or max(len(problems), 1)
    for start in range(0, len(problems), step):
        part = problems[start : start + step]
        lines: list[dict[str, Any]] = [{"task_id": p["task_id"], "methods": {}} for p in part]
        for name, fn in methods.items():

            def generated(i: int, samples, name=name, start=start, part=part) -> None:
                if progress is not None:
                    k = start + i + 1
                    progress(f"[{k}/{len(problems)}] {part[i]['task_id']} {name}: "
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
    lines = []
    for k, row in enumerate(rows):
        cells = [row[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)
        ]
        lines.append("  ".join(cells))
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)
