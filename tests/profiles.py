"""Hypothesis profiles ($HYPOTHESIS_PROFILE): "ci" (default; derandomized, the examples each
test sets), "thorough" (`nox -s slow`: random draws, ten times the examples) and "gpu"
(bench/gpu_suite.sh's test stage, where each new shape can cost a Triton compile: at most
:data:`GPU_EXAMPLES`). Loaded by tests/conftest.py; property tests write
``max_examples=examples(n)`` (a profile cannot lower a count a test sets itself)."""

import os

from hypothesis import settings

settings.register_profile("ci", deadline=None, derandomize=True, print_blob=True)
settings.register_profile("gpu", deadline=None, derandomize=True, print_blob=True)
settings.register_profile("dev", deadline=None)
settings.register_profile("thorough", deadline=None, print_blob=True)
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
settings.load_profile(PROFILE)
GPU_EXAMPLES = 6


def examples(n: int) -> int:
    """A test's example count under the active profile."""
    if PROFILE == "thorough":
        return n * 10
    return min(n, GPU_EXAMPLES) if PROFILE == "gpu" else n
