"""Fixtures the engine's invariance and scheduler suites share."""

from __future__ import annotations

import pytest
from models import perturbed, tiny_lm


@pytest.fixture(scope="module")
def llama():
    """A tiny random Llama (vocabulary 64)."""
    return tiny_lm("llama")


@pytest.fixture(scope="module")
def drafts(llama):
    """Each drafter kind by name: none, n-grams, a draft that always agrees (the main model
    itself), one that sometimes does (the main model perturbed)."""
    return {"none": None, "ngram": "ngram", "same": llama, "perturbed": perturbed(llama)}
