"""``bass eval humaneval``: HumanEval code completion, regular vs speculative decoding,
scored as Pass@First and Pass@All: the workload, the metrics and the sandboxing are in
``docs/guides/config-and-cli.md`` ("bass eval humaneval").

The package: :mod:`~bass.humaneval.problems` (loading, selecting, stop sequences),
:mod:`~bass.humaneval.execution` (running the check programs),
:mod:`~bass.humaneval.samples` (generating them) and :mod:`~bass.humaneval.scoring`
(Pass@First/Pass@All, the table); their names are importable from here. The command line
is :mod:`bass.cli.humaneval`.
"""

# Re-exports: names the command line and the tests use, not all of them in __all__.
# ruff: noqa: F401

from __future__ import annotations

from .execution import CheckResult, package_check, run_check
from .problems import (
    STOP_SEQUENCES,
    HumanEvalError,
    load_problems,
    select_problems,
    truncate,
)
from .samples import Sample, SampleFn, _to_sample, make_sampler, row_id
from .scoring import (
    MethodReport,
    ProblemScore,
    evaluate,
    first_finished,
    format_table,
    score_problem,
)

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
