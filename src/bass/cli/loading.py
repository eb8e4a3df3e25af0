"""What a subcommand runs on: the models, tokenizer and generator a :class:`Config` names.

torch, transformers and the engine load here, on first use, not on ``import bass.cli``.
"""

from __future__ import annotations

import time
from typing import Any

from ..config import Config
from .errors import UsageError

__all__ = ["encode", "is_drafter_name", "load_models", "make_generator", "use_chat"]


def is_drafter_name(draft: str) -> bool:
    """Whether ``--draft`` / ``[model].draft`` names an installed drafter (``ngram``, or a
    plugin registered under the entry-point group ``bass.drafters``) rather than a model.
    A name wins over a directory of the same name (write ``./NAME`` for the directory)."""
    from .. import drafters

    return draft in drafters.available()


def load_models(config: Config, *, log=None, tp: int = 1):
    """``(main, tokenizer, draft)`` for ``config``; ``draft`` is a model, an installed
    drafter's name (``"ngram"``, a plugin's: :func:`is_drafter_name`) or ``None``.
    ``tp > 1``: the main model sharded over this rank's tensor-parallel group (after
    :func:`bass.distributed.init`; a size that does not divide its heads is refused before
    loading), the draft replicated. Failures a user can fix become
    :class:`UsageError`."""
    import torch

    from .. import models

    log = log or (lambda msg: None)
    dtype = getattr(torch, config.model.dtype)
    source = config.model.main or models.default_model_file()  # ModelNotFoundError
    t0 = time.perf_counter()
    log(
        f"loading main model {source} ..."
        + (f" (tensor-parallel over {tp} ranks)" if tp > 1 else "")
    )
    main = _load_lm(source, dtype, "main", tp)
    try:
        tokenizer = models.load_tokenizer(source)
    except models.ModelNotFoundError:
        raise
    except Exception as exc:  # named with its source; --debug shows it
        raise UsageError(f"cannot load a tokenizer from {source}: {_short(exc)}") from exc
    draft: Any = config.model.draft
    if draft == "none":
        draft = None
    elif not is_drafter_name(draft):
        log(f"loading draft model {draft} ...")
        draft = _load_lm(draft, dtype, "draft")
    log(f"models loaded in {time.perf_counter() - t0:.1f} s")
    return main, tokenizer, draft


def _short(exc: BaseException, limit: int = 300) -> str:
    """An exception's message on one line, cut to about ``limit`` characters."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _load_lm(source, dtype, which: str, tp: int = 1):
    from .. import distributed, models

    try:
        if tp > 1:
            return models.load_tensor_parallel(source, tp, dtype=dtype)
        return models.load_causal_lm(source, dtype=dtype)
    except models.ModelNotFoundError:
        raise
    except distributed.DistributedError as exc:
        raise UsageError(str(exc)) from exc
    except ImportError as exc:  # gguf / accelerate missing for a .gguf file
        raise UsageError(
            f"loading {source} needs a package that is missing ({exc}); "
            f"install it with: {models.INSTALL_HINT}"
        ) from exc
    except Exception as exc:  # named with its source; --debug shows it
        # not a model directory, an unknown architecture, a corrupt or truncated file
        flag = "--main" if which == "main" else "--draft"
        also = ""
        if which == "draft":
            from .. import drafters

            also = f", an installed drafter ({', '.join(drafters.available())}) or 'none'"
        raise UsageError(
            f"cannot load the {which} model from {source}: {_short(exc)} ({flag} takes a "
            "Hugging Face model name, a transformers model directory with its config.json "
            f"and weights, or a .gguf file{also})"
        ) from exc


def make_generator(main, draft, config: Config):
    import torch

    from .. import models
    from ..engine import Generator

    kwargs = config.generator_kwargs()
    if isinstance(draft, torch.nn.Module):  # one tokenizer, padded embeddings: reconcile
        source = config.model.main or models.default_model_file()
        kwargs["shared_vocab"] = models.padded_vocab(source, config.model.draft, main, draft)
    from ..drafters import DrafterLoadError

    try:
        return Generator(main, draft, **kwargs)
    except (ValueError, DrafterLoadError) as exc:  # vocabularies, policy options, a plugin
        raise UsageError(str(exc)) from exc


def encode(tokenizer, text: str, chat: bool) -> list[int]:
    """Token ids of ``text``, wrapped in the chat template as a user turn when ``chat``."""
    from ..models import encode_prompt

    return encode_prompt(tokenizer, text, chat)


def use_chat(tokenizer, config: Config, source: str) -> bool:
    has_template = getattr(tokenizer, "chat_template", None) is not None
    if config.model.chat is None:
        return has_template
    if config.model.chat and not has_template:
        raise UsageError(
            f"the tokenizer of {source} has no chat template; "
            "drop --chat (or set chat = false in [model])"
        )
    return config.model.chat
