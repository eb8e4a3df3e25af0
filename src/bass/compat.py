"""Every point where bass meets a transformers (or torch) API that differs across the
versions ``pyproject.toml`` admits, in one place.

Each shim detects the feature (a parameter in a signature, an attribute), never a version
string, and says which versions need it and when it can go. CI runs the suites on the
newest and the oldest transformers pyproject admits (``nox -s tests_floor``), and a
deprecation warning about a call bass made fails the tests (``tests/conftest.py``).

The shims:

1. **The forward's cache argument** (:func:`cache_argument`): ``past_key_values=`` up to
   transformers 5.23; 5.24 renamed it ``cache=`` and deprecates the old name (removed in
   5.40). Families migrate one by one, so it is read from each model class's signature.
   Remove when the floor is >= 5.24 and every family takes ``cache``.
2. **``Cache.update``'s trailing arguments** (:data:`CACHE_UPDATE_EXTRAS`): a positional
   ``cache_kwargs`` dict up to 5.23, ``kwargs=`` from 5.24;
   :class:`bass.cache.RaggedKVCache` takes ``*args, **kwargs`` and needs none of it.
3. **``Cache.get_mask_sizes``' argument**: ``cache_position`` (a tensor) up to 5.x,
   ``query_length`` (an int) later; bass's answer depends on neither.
4. **Tensor parallelism** (:func:`tensor_parallel_kwargs`, :func:`tp_group`): up to
   ~5.16 ``from_pretrained(tp_plan="auto", tp_size=, device_mesh=)`` shards a model (its
   parameters local shards); later releases take ``distributed_config=DistributedConfig(
   tp_size=, dp_replicate_size=)`` (parameters are DTensors; the standalone ``tp_plan``
   warns, then is removed), whose mesh spans the whole world, so several TP groups are
   replicas on its ``dp_replicate`` dimension (FSDP2-wrapped: see
   :func:`generation_mode`). Detected by ``DistributedConfig`` taking ``tp_size``.
   Remove the first branch when the floor takes ``distributed_config``.
5. **Generation's grad mode** (:func:`generation_mode`): ``torch.inference_mode`` except
   for models wrapped by FSDP2 (the replicated TP groups above), whose parameters need
   version counters: there ``torch.no_grad``.
6. **Inductor's first import** (:func:`import_inductor_quietly`, torch, not transformers):
   a process's first Inductor compile imports ``torch.utils.mkldnn``, which raises a
   ``DeprecationWarning`` at import (``torch.jit.script_method``, torch's own code, torch
   2.11 to 2.13) at whichever bass call compiled first; imported ahead with that warning
   silenced. Remove when torch's module no longer warns.
7. **Per-model compiled regions** (:data:`PER_MODEL_COMPILE`, torch): torch 2.13's
   ``torch.compile(isolate_recompiles=, recompile_limit=)`` and
   ``torch.compiler.skip_guard_on_all_nn_modules_unsafe`` give each model a compiled region
   of its own with its module guards dropped (:class:`bass.compiled.CompiledForward`); torch
   2.11-2.12 lack them: one region for every model, every guard kept. Detected by the
   parameters and the attribute. Remove the fallback when the floor is torch >= 2.13.
8. **Per-layer config attributes** (:func:`config_value`): heterogeneous configs (Gemma 4,
   transformers 5.2x) raise ``AmbiguousGlobalPerLayerAttributeError`` (a ``RuntimeError``)
   when an attribute that differs per layer (``head_dim``) is read globally; bass then reads
   ``per_layer_config`` and takes the largest. Detected by importing the error class.
9. **A multimodal model's text part** (:func:`attn_implementation`, :func:`text_decoder`):
   the attention implementation its decoder layers run is the text config's
   (``get_text_config()``; GOT-OCR2's top config keeps ``eager`` where its vision tower
   cannot switch), and its text decoder is ``get_decoder()`` (which earlier releases
   documented as raising for models without a rule, and which a family may override):
   where it raises or is missing, the model itself.
10. **transformers' progress bars while a model loads** (:func:`loading_bars`): its switch
   (``transformers.utils.logging.disable_progress_bar``) covers downloads and "Loading
   weights", but the GGUF de-quantization bar (``modeling_gguf_pytorch_utils``, 5.3 to
   5.24) calls ``tqdm.auto`` itself: that module's ``tqdm`` is swapped for a silent one
   where it has one. Remove that part when the module follows the switch.
11. **Dynamo's float inputs** (:func:`dynamo_config`, torch): with ``specialize_float``
   off (torch 2.11 to 2.13's default), a compiled pass takes every Python float it reads
   (a model's ``scaling``, ``variance_epsilon``, the rotary ``attention_scaling``) as a
   0-d float64 CPU tensor input: the only CPU tensors of a GPU model's region. On an H200
   (2026-11-29) a CUDA-graph compile of a tiny Llama ran Inductor's C++ (CPU) code
   generation, whose toolchain probe ran past the test's 40 s cap; CUDA graphs also skip
   regions with CPU work. bass's compiled passes turn it on: a model's floats become
   constants of the graph (not yet re-run on a GPU). Detected by the config attribute;
   without it, nothing is set.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys
import warnings

import torch

__all__ = [
    "CACHE_UPDATE_EXTRAS",
    "attn_implementation",
    "cache_argument",
    "config_value",
    "forward_cache_kwargs",
    "generation_mode",
    "head_dim",
    "import_inductor_quietly",
    "kv_heads",
    "loading_bars",
    "rope_switch",
    "tensor_parallel_kwargs",
    "text_decoder",
    "tp_group",
    "tp_size",
]

#: Shim 2: what the layers may pass to ``Cache.update`` after ``layer_idx`` (ignored).
CACHE_UPDATE_EXTRAS = "positional cache_kwargs (<= 5.23) or keyword kwargs= (>= 5.24)"

# model class -> the name of its forward's cache argument (filled outside compiled code:
# hf.prepare runs before any pass, so a compiled forward only reads the dict)
_CACHE_ARG: dict[type, str] = {}


try:  # transformers >= 5.2x: a per-layer attribute (Gemma 4's head_dim) read globally
    from transformers.integrations.heterogeneity.configuration_utils import (
        AmbiguousGlobalPerLayerAttributeError as _PerLayerError,
    )
except ImportError:
    _PerLayerError = AttributeError


def config_value(cfg, name: str, default=None):
    """Shim 8: ``cfg.name``, or, where layers differ (heterogeneous configs: Gemma 4), its
    largest value over the layers (``per_layer_config``)."""
    try:
        return getattr(cfg, name, default)
    except _PerLayerError:
        layers = cfg.per_layer_config
        return max(getattr(layers[i], name) for i in range(cfg.num_hidden_layers))


def kv_heads(cfg) -> int:
    """A text config's key/value heads: ``num_key_value_heads`` where its class takes that
    argument (one set on a family without grouped-query attention is not what its layers
    read), else its attention heads; the largest where layers differ."""
    declared = "num_key_value_heads" in inspect.signature(type(cfg).__init__).parameters
    return (declared and config_value(cfg, "num_key_value_heads")) or cfg.num_attention_heads


def head_dim(cfg) -> int:
    """A text config's attention head dim of queries and keys (``qk_head_dim`` for
    multi-head latent attention, or its two parts where older configs lack the sum, else
    ``head_dim``, else hidden size over heads); the largest where layers differ
    (:func:`config_value`)."""
    if found := config_value(cfg, "qk_head_dim"):
        return found
    parts = [config_value(cfg, f"qk_{p}_head_dim") for p in ("nope", "rope")]
    if all(parts):
        return sum(parts)
    if found := config_value(cfg, "head_dim"):
        return found
    return cfg.hidden_size // cfg.num_attention_heads


def rope_switch(cfg) -> int | None:
    """The positions past which a text config's rotary embedding (``longrope``, Phi-3's)
    takes its long factors (``original_max_position_embeddings``), or ``None`` where it
    has no such switch. transformers switches a whole forward pass by its largest position
    (and its own decoding re-prefills a sequence that crosses it); bass packs rows of
    different lengths into one pass, so it stays below the switch
    (:func:`bass.hf.prepare`). ``rope_parameters`` from transformers 5 (one dict, or one
    per layer type), ``rope_scaling`` before."""
    params = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None)
    if not isinstance(params, dict):
        return None
    single = "rope_type" in params or "type" in params
    limits = [
        p.get("original_max_position_embeddings")
        or getattr(cfg, "original_max_position_embeddings", None)
        for p in ([params] if single else params.values())
        if isinstance(p, dict) and (p.get("rope_type") or p.get("type")) == "longrope"
    ]
    limits = [int(n) for n in limits if n]
    return min(limits) if limits else None


def scales_queries_by_position(module: torch.nn.Module) -> bool:
    """Whether ``module`` is an attention layer that scales its queries by positions it
    computes itself from the cache's length (Llama 4's temperature tuning in its layers
    without rotary embeddings: ``get_seq_length(layer_idx)`` from transformers 5.x,
    ``cache_position`` before), which no packed pass can give per row."""
    tuning = bool(getattr(module, "attn_temperature_tuning", False))  # transformers': truthy
    return tuning and not getattr(module, "use_rope", True)


def attn_implementation(model: torch.nn.Module) -> str | None:
    """Shim 9: the attention implementation ``model``'s decoder layers run (its text
    config's)."""
    return model.config.get_text_config()._attn_implementation


def attn_implementations(model: torch.nn.Module) -> str | dict | None:
    """Shim 9: every config's attention implementation, as ``set_attn_implementation``
    takes them back: a model without sub-configs, its one name; a multimodal model, a dict
    (``""``: its own config, then each sub-config's, nested), so a vision tower that runs
    another implementation than the text model gets its own back."""

    def snapshot(config):
        subs = [k for k in getattr(config, "sub_configs", None) or {} if getattr(config, k, None)]
        if not subs:
            return config._attn_implementation
        return {"": config._attn_implementation} | {k: snapshot(getattr(config, k)) for k in subs}

    return snapshot(model.config)


def text_decoder(model: torch.nn.Module) -> torch.nn.Module:
    """Shim 9: the module holding ``model``'s text decoder (``get_decoder()``), else
    ``model`` itself."""
    try:
        decoder = model.get_decoder()
    except (AttributeError, NotImplementedError, ValueError):  # no rule for this model
        return model
    return decoder if isinstance(decoder, torch.nn.Module) else model


def cache_argument(model: torch.nn.Module) -> str:
    """Shim 1: the keyword under which ``model``'s forward takes its cache: ``"cache"``
    (transformers >= 5.24, the families that took the new name) or ``"past_key_values"``."""
    cls = type(model)
    name = _CACHE_ARG.get(cls)
    if name is None:
        params = inspect.signature(cls.forward).parameters
        name = "cache" if "cache" in params else "past_key_values"
        _CACHE_ARG[cls] = name
    return name


def forward_cache_kwargs(model: torch.nn.Module, cache) -> dict:
    """``{cache_argument(model): cache}``, for ``model``'s forward."""
    return {cache_argument(model): cache}


def _distributed_config():
    """Shim 4's detection: transformers' ``DistributedConfig`` if it takes ``tp_size``."""
    try:
        from transformers.distributed import DistributedConfig
    except ImportError:
        return None
    params = inspect.signature(DistributedConfig).parameters
    return DistributedConfig if "tp_size" in params else None


def tensor_parallel_kwargs(tp: int, dp: int = 1) -> dict:
    """Shim 4: the ``from_pretrained`` keyword arguments that shard a model over the
    ``tp`` consecutive ranks of each of ``dp`` groups (world ``dp * tp``, the default
    process group initialised) with transformers' own tensor-parallel plan."""
    config = _distributed_config()
    if config is not None:
        extra = {"dp_replicate_size": dp} if dp > 1 else {}
        return {"distributed_config": config(tp_size=tp, **extra)}
    import torch.distributed as dist

    device = "cuda" if torch.cuda.is_available() else "cpu"
    mesh = dist.init_device_mesh(device, (dp, tp), mesh_dim_names=("dp", "tp"))
    return {"tp_plan": "auto", "tp_size": tp, "device_mesh": mesh["tp"]}


def tp_size(model: torch.nn.Module) -> int:
    """Shim 4: how many ranks ``model``'s tensor parallelism spans (1: not sharded); each
    rank holds ``1/tp_size`` of the attention heads (``_tp_size``, as :func:`tp_group`)."""
    size = getattr(model, "_tp_size", None)
    return size if isinstance(size, int) and size > 1 else 1


def tp_group(model: torch.nn.Module):
    """Shim 4: the process group ``model``'s tensor parallelism spans, or ``None`` for a
    model that is not sharded (``_tp_size`` and ``_device_mesh`` are set by every
    supported release; the mesh is 1-D, or has a ``"tp"`` dimension)."""
    size = getattr(model, "_tp_size", None)
    mesh = getattr(model, "_device_mesh", None)
    if not size or size == 1 or mesh is None:
        return None
    names = getattr(mesh, "mesh_dim_names", None) or ()
    return mesh.get_group("tp") if "tp" in names else mesh.get_group()


def generation_mode(models) -> object:
    """Shim 5: the grad mode a generation runs in (a context manager)."""
    for model in models:
        for module in model.modules():
            if any(c.__name__.startswith("FSDP") for c in type(module).__mro__):
                return torch.no_grad()
    return torch.inference_mode()


#: Shim 7: torch.compile takes ``isolate_recompiles=`` and ``recompile_limit=``, and the
#: module-guard filter exists (torch >= 2.13).
PER_MODEL_COMPILE = {"isolate_recompiles", "recompile_limit"} <= set(
    inspect.signature(torch.compile).parameters
) and hasattr(torch.compiler, "skip_guard_on_all_nn_modules_unsafe")


def dynamo_config(recompile_limit: int | None = None) -> dict:
    """Shim 11: the Dynamo settings a compiled pass runs under (``torch._dynamo.config.
    patch(**dynamo_config())``): floats specialised where the setting exists, and
    ``recompile_limit`` when given (torch < 2.13 sets it here, not in ``torch.compile``)."""
    config = torch._dynamo.config
    out = {"specialize_float": True} if hasattr(config, "specialize_float") else {}
    if recompile_limit is not None:
        out["recompile_limit"] = recompile_limit
    return out


def import_inductor_quietly() -> None:
    """Shim 6: import ``torch.utils.mkldnn`` (what Inductor's first compile imports) with
    its import-time ``DeprecationWarning`` silenced, before bass compiles anything."""
    if "torch.utils.mkldnn" in sys.modules:
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import torch.utils.mkldnn  # noqa: F401


@contextlib.contextmanager
def loading_bars(show: bool):
    """Shim 10: transformers' progress bars off while the block loads models, unless
    ``show``; its switch and the GGUF module's ``tqdm`` restored afterwards."""
    from transformers.utils import logging as hf_logging

    hide = not show and hf_logging.is_progress_bar_enabled()
    gguf = bar = None
    if not show:
        with contextlib.suppress(ImportError):  # the module moved: nothing to silence
            from transformers import modeling_gguf_pytorch_utils as gguf
        bar = getattr(gguf, "tqdm", None)
        if callable(bar):
            gguf.tqdm = functools.partial(bar, disable=True)
    if hide:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if hide:
            hf_logging.enable_progress_bar()
        if callable(bar):
            gguf.tqdm = bar
