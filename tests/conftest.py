import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

# A fresh Inductor cache per test session: a compiled graph cached by an earlier version
# of bass (whose ops decomposed into ops since removed) must not be replayed here (set
# before torch is imported; subprocesses inherit it). The session that made it removes it
# (each session left its own behind in /tmp, ~1 GB a day of runs).
if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    _inductor_dir = tempfile.mkdtemp(prefix="bass-inductor-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = _inductor_dir
    atexit.register(shutil.rmtree, _inductor_dir, ignore_errors=True)
# Each model's CPU linear layouts measured anew (tests/engine/test_cpu_linear.py tests the
# cache on disk that would otherwise hand one test's measurement to the next)
os.environ.setdefault("BASS_CPU_LINEAR_CACHE", "0")

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests/models.py as `models`, in every folder

import deprecation_guard
import profiles  # noqa: F401  (loads the hypothesis profile)

from bass import compat

# Inductor's first compile in a process imports torch.utils.mkldnn, which warns at import
# (torch's own code). bass imports it ahead, silenced (compat shim 6), but the guard sees
# every warning whatever the filters, and would pin this one on whichever bass call (or
# a test's own torch.compile over bass's ops) compiled first: imported here, before any.
compat.import_inductor_quietly()


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


def pytest_runtest_logreport(report):
    """With ``$BASS_TEST_FAILURES`` set, each failure's reason is appended to that file as
    it happens (the GPU suite's stages run under a time cap: pytest's own summary, printed
    at the end, is lost when the cap cuts the run)."""
    path = os.environ.get("BASS_TEST_FAILURES")
    if path and report.failed:
        with open(path, "a") as f:
            f.write(f"=== {report.nodeid} ({report.when})\n{report.longreprtext[-4000:]}\n\n")
