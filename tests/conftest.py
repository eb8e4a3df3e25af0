import os
import sys
from pathlib import Path

import pytest
from hypothesis import settings

sys.path.insert(0, str(Path(__file__).parent))  # tests/models.py as `models`

import deprecation_guard

# Hypothesis profiles: "ci" (default; derandomized, the examples each test sets) and
# "thorough" (`nox -s slow`: random draws, ten times the examples; see `examples`).
settings.register_profile("ci", deadline=None, derandomize=True, print_blob=True)
settings.register_profile("dev", deadline=None)
settings.register_profile("thorough", deadline=None, print_blob=True)
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
settings.load_profile(PROFILE)


def examples(n: int) -> int:
    """A test's example count under the active profile (x10 when thorough)."""
    return n * 10 if PROFILE == "thorough" else n


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """A deprecation that transformers (or torch) raises about a call bass made fails the
    test (see tests/deprecation_guard.py); third-party noise is left to filterwarnings."""
    with deprecation_guard.watch() as seen:
        result = yield
    if seen:
        pytest.fail(deprecation_guard.report(seen), pytrace=False)
    return result


@pytest.fixture
def no_model_load(monkeypatch):
    """The CLI tests' guard: loading a model fails the test (the command must refuse
    before it)."""
    from cli_support import refuse_model_loads

    refuse_model_loads(monkeypatch)
