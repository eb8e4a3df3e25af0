"""Collect the ``bench_*.py`` files as test modules (pytest's default is ``test_*.py``)."""

from __future__ import annotations

import pytest


def pytest_collect_file(file_path, parent):
    if (
        file_path.suffix == ".py"
        and file_path.name.startswith("bench_")
        and not parent.session.isinitpath(file_path)  # named on the command line: pytest's own
    ):
        return pytest.Module.from_parent(parent, path=file_path)
    return None
