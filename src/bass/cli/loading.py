"""What a subcommand runs on: the models, tokenizer and generator a :class:`Config` names
(torch, transformers and the engine load on first use, not on ``import bass.cli``)."""

from __future__ import annotations

import time
from typing import Any

from ..config import Config
from .errors import UsageError, flag_error, one_line, say

__all__ = [
    "check_kv_budget",
    "check_sources",
    "has_chat_template",
    "load_models",
    "make_generator",
    "use_chat",
]


def load_models(config: Config, *, log=None, tp: int = 1, bars: bool = True, owner=False):
    """``(main, tokenizer, draft)`` for ``config``; ``draft`` is a model, an installed
    drafter's name or ``None``. ``tp > 1``: the main model sharded over this rank's
    tensor-parallel group, the draft replicated. ``bars``: transformers' own progress
    bars while loading (off with the command's progress: ``--no-progress``, stderr not a
    terminal, a rank other than the first). ``owner``: the command owns its process (run
    as ``bass``, not :func:`bass.cli.main` called from Python). Failures a user can fix
    become :class:`UsageError`."""
    import gc

    from .. import compat

    with compat.loading_bars(bars):
        loaded = _load_models(config, log, tp)
    if owner:  # the objects alive now (torch's, transformers', the models': ~370k) live
        # until the process exits: the cyclic collector stops walking them, in every
        # collection of the run and in the ~1 s of collections at exit (vLLM's server
        # collects, then freezes, its start-up state the same way). Objects made later
        # (the drafters', policies', files') are collected as usual. Not in a caller's
        # process: what it drops later would never be collected. Collected first:
        # loading's garbage cycles (and the tensors they hold) would be frozen too.
        gc.collect()
        gc.freeze()
    return loaded


def check_sources(config: Config) -> None:
    """The main model's and the draft's sources, checked before either loads: a local path
    that does not exist or is no model, a drafter's name mistyped
    (:func:`bass.models.check_source`)."""
    from .. import drafters, models

    if config.model.main is not None:
        models.check_source(config.model.main)
    if config.model.draft not in ("none", *drafters.available()):
        models.check_source(config.model.draft, tuple(drafters.available()))


def check_kv_budget(config: Config, gib: float | None, tp: int = 1) -> None:
    """A ``--kv-budget-gib`` too small for one row of the shortest prompt (one token plus
    ``max_new_tokens``), refused before the weights load, from the models' configs alone
    (those that are local or in the Hugging Face cache; the others are checked after they
    load, with the longest prompt, as every budget is)."""
    if gib is None:
        return
    import torch

    from .. import drafters, models
    from ..cache import kv_bytes_per_token
    from ..scheduler import budget_refusal

    itemsize = getattr(torch, config.model.dtype).itemsize
    sources = [config.model.main or models.default_model_file()]
    if config.model.draft not in ("none", *drafters.available()):
        sources.append(config.model.draft)
    per_token, windowed = 0, False
    for i, source in enumerate(sources):
        cfg = _config_if_local(source, config.model.dtype)
        # a quantized checkpoint: the real check sizes by its parameters' width, not --dtype
        if cfg is not None and not getattr(cfg, "quantization_config", None):
            per_token += kv_bytes_per_token(cfg, itemsize, tp if i == 0 else 1)
            windowed |= bool(getattr(cfg.get_text_config(), "sliding_window", None))
    # a row's cache: its prompt plus max_new_tokens, one position less with a sliding
    # window the generation stays within (the last token is never fed back;
    # bass.scheduler.Job): a lower bound, as this check must be
    new = config.generation.max_new_tokens
    positions, counted = (new, "max_new_tokens") if windowed else (new + 1, "1 + max_new_tokens")
    if per_token and positions * per_token > gib * 2**30:
        one = (
            f"even a one-token prompt's row ({positions} positions: {counted}; each prompt "
            f"token, the chat template's included, adds {per_token / 1024:.3g} KiB)"
        )
        exc = budget_refusal(gib, positions * per_token, one, "command line")
        raise flag_error("--kv-budget-gib", gib, exc.allowed)


def _config_if_local(source, dtype: str):
    """``source``'s model config where reading it is quick and needs no network (a local
    directory, a hub name in the local cache, a .gguf file's de-quantized cache), else
    ``None`` (parsing a .gguf file itself takes seconds)."""
    from pathlib import Path

    import torch
    from transformers import AutoConfig

    from .. import models

    path = Path(source)
    try:
        if path.suffix == ".gguf":
            entry = models.gguf_cache_entry(path, models.gguf_model_key(getattr(torch, dtype)))
            return AutoConfig.from_pretrained(str(entry)) if entry and entry.is_dir() else None
        if models.check_source(source):
            return models.load_config(source)
        return AutoConfig.from_pretrained(str(source), local_files_only=True)
    except Exception:  # not readable here: the load itself reports what is wrong
        return None


def _load_models(config: Config, log, tp: int):
    import torch

    from .. import drafters, models

    log = log or (lambda msg: None)
    dtype = getattr(torch, config.model.dtype)
    source = config.model.main or models.default_model_file()  # ModelNotFoundError
    check_sources(config)  # both before either loads
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
        raise UsageError(f"cannot load a tokenizer from {source}: {one_line(exc, 300)}") from exc
    draft: Any = config.model.draft
    if draft == "none":
        draft = None
    elif draft not in drafters.available():
        log(f"loading draft model {draft} ...")
        draft = _load_lm(draft, dtype, "draft")
    log(f"models loaded in {time.perf_counter() - t0:.1f} s")
    if config.model.compile:  # the first passes wait for Inductor: said, not a silent wait
        log("compiling the passes as they first run (minutes on a CPU with a cold Inductor "
            "cache, seconds once it is warm)")  # fmt: skip
    return main, tokenizer, draft


def _load_lm(source, dtype, which: str, tp: int = 1):
    from .. import distributed, models

    try:
        if tp > 1:
            return models.load_tensor_parallel(source, tp, dtype=dtype)
        if which == "draft":  # a name found nowhere: a drafter's mistyped?
            return models.load_draft(source, "--draft", "'none'", dtype=dtype)
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
        also = ""
        if which == "draft":
            from .. import drafters

            also = f", an installed drafter ({', '.join(drafters.available())}) or 'none'"
        raise UsageError(
            f"cannot load the {which} model from {source}: {one_line(exc, 300)} (--{which} "
            f"takes {models.SOURCES}{also})"
        ) from exc


def make_generator(main, draft, config: Config, tokenizer=None):
    import torch

    from .. import models
    from ..drafters import DrafterLoadError
    from ..engine import Generator

    kwargs = config.generator_kwargs()
    try:
        if isinstance(draft, torch.nn.Module):  # one tokenizer, padded embeddings: reconcile
            source = config.model.main or models.default_model_file()
            note = lambda message: say(f"note: {message}")  # noqa: E731
            kwargs["shared_vocab"] = models.padded_vocab(
                source, config.model.draft, main, draft, warn=note, main_tokenizer=tokenizer
            )
        return Generator(main, draft, **kwargs)
    except (ValueError, DrafterLoadError) as exc:  # vocabularies, policy options, a plugin
        raise UsageError(str(exc)) from exc


def use_chat(tokenizer, config: Config) -> bool:
    """Whether prompts go through the chat template: ``[model].chat`` (``--chat``), or,
    left out, whether the tokenizer has one."""
    has_template = has_chat_template(tokenizer)
    if config.model.chat is None:
        return has_template
    if config.model.chat and not has_template:
        raise UsageError(
            f"the tokenizer of {config.model.main or 'the default model'} has no chat template; "
            "drop --chat (or set chat = false in [model])"
        )
    return config.model.chat


def has_chat_template(tokenizer) -> bool:
    """Whether ``tokenizer`` has a chat template (what ``[model].chat`` left out means)."""
    return getattr(tokenizer, "chat_template", None) is not None
