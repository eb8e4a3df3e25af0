"""What ``bass generate`` says beside its rows: the note that compiled passes are compiling,
and --compare's report."""

from __future__ import annotations

import pytest
from cli_support import save_model_dir


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_model_dir(tmp_path_factory.mktemp("tiny"))


def test_compiled_passes_are_announced_before_their_first_wait(model_dir):
    """``--compile``: the first passes wait minutes for Inductor on a CPU; stderr says
    that it is compiling (not a silent wait after "models loaded")."""
    from bass.cli.loading import load_models
    from bass.config import Config

    config = Config()
    config.model.main, config.model.draft = model_dir, "ngram"
    said = []
    load_models(config, log=said.append, bars=False)
    assert not any("compiling" in line for line in said)
    config.model.compile = True
    said.clear()
    load_models(config, log=said.append, bars=False)
    assert said[-1].startswith("compiling the passes as they first run")


def test_compare_says_why_rejection_sampled_rows_differ():
    """--compare with a draft model and --draft-sampling rejection: sampled rows differ
    from drafting off's by design; the report says so (a newcomer read "identical rows 0
    of 2" as a bug), and says nothing for coupled draws, greedy rows or n-grams (whose
    draws are keyed: a difference there has another cause)."""
    from types import SimpleNamespace

    from bass.cli.report import comparison_text
    from bass.stats import GenerationStats

    stats = GenerationStats(rows=2)
    plain = SimpleNamespace(stats=stats, sequences=[[1, 2], [3, 4]])
    cases = [("model", "rejection", True, True), ("model", "coupled", True, False),
             ("model", "rejection", False, False), ("ngram", "rejection", True, False)]  # fmt: skip
    for name, mode, sampled, said in cases:
        gen = SimpleNamespace(stats=stats, drafter=SimpleNamespace(name=name),
                              policy_spec=("adaptive",), draft_sampling=mode)  # fmt: skip
        text = comparison_text(plain, [[1, 5], [3, 6]], gen, sampled)
        assert "identical rows            0 of 2" in text
        assert ("each exact in distribution" in text) == said, (name, mode, sampled)
