"""Hypothesis profiles: "ci" (default; derandomized, the examples each test sets) and
"thorough" (`nox -s slow`: random draws, ten times the examples; see :func:`examples`).
Loaded by tests/conftest.py; tests import :func:`examples` from here."""

import os

from hypothesis import settings

settings.register_profile("ci", deadline=None, derandomize=True, print_blob=True)
settings.register_profile("dev", deadline=None)
settings.register_profile("thorough", deadline=None, print_blob=True)
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
settings.load_profile(PROFILE)


def examples(n: int) -> int:
    """A test's example count under the active profile (x10 when thorough)."""
    return n * 10 if PROFILE == "thorough" else n
