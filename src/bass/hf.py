"""transformers integration: ``attn_implementation="bass"`` (docs/concepts/design.md,
"transformers integration").

Importing this module registers, under the name ``"bass"``, an attention function that
routes every layer to bass's ragged attention, with per-row lengths passed as keyword
arguments of the model's forward (``bass_cu_q_lens``, ``bass_kv_lens`` and the pass's
``bass_plan`` for packed passes; ``bass_q_lens``, ``bass_kv_lens`` for padded ones), and
a mask function that builds no mask (the op masks by lengths). :func:`prepare` checks
that a model can be routed through bass and switches it over.
"""

from __future__ import annotations

import contextlib
import os
import weakref
from collections.abc import Sequence
from typing import NamedTuple

import torch
from transformers import AttentionInterface, PreTrainedModel
from transformers.masking_utils import AttentionMaskInterface

from . import compat
from .errors import UnsupportedModelError
from .ops import flex, reference
from .ops.plan import AUTO_OVERRIDE, Plan

ATTN_NAME = "bass"


# attention arguments of some transformers models (sparse indices, other sinks, biases)
# that bass's attention would silently ignore: refused by name
_NOT_COMPUTED = ("indices", "block_indices", "sinks", "position_bias", "alibi", "head_mask")


def bass_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,  # [B, Hq, T, D]
    key: torch.Tensor,  # [B, Hkv, S, D]: the whole RaggedKVCache buffer of this layer
    value: torch.Tensor,  # [B, Hkv, S, D]
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    bass_q_lens: torch.Tensor | None = None,  # int32 [B] (padded passes)
    bass_kv_lens: torch.Tensor | None = None,  # int32 [B]
    bass_impl: str = "auto",
    bass_cu_q_lens: torch.Tensor | None = None,  # int32 [B+1] (packed passes)
    bass_plan: Plan | None = None,  # the pass's attention plan (packed passes)
    sliding_window: int | None = None,
    softcap: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """The ``"bass"`` attention function: returns ``([B, T, Hq, D], None)`` as HF expects.

    A packed pass (``bass_cu_q_lens`` given; ``query`` is ``[1, Hq, N, D]``) runs its
    plan when it has one, else ``ragged_attention_packed``; a padded one ``ragged_attention``.
    """
    name = type(module).__name__
    if (bass_q_lens is None and bass_cu_q_lens is None) or bass_kv_lens is None:
        raise LengthsDropped(
            name,
            f"{name} was called with attn_implementation='bass' but without bass's per-row "
            "lengths; run the model through bass.Generator (or pass bass_q_lens and "
            "bass_kv_lens to its forward)",
        )
    ignored = [k for k in _NOT_COMPUTED if kwargs.get(k) is not None]
    if attention_mask is not None:  # bass's mask function returns None: the model's own
        ignored.insert(0, "attention_mask")
    if ignored:
        raise UnsupportedModelError(
            f"{name} passes {', '.join(ignored)} to its attention function, which bass's "
            "ragged attention does not compute (it masks by the rows' lengths alone, full "
            "causal): this model cannot run through bass"
        )
    scale = float(query.shape[-1] ** -0.5 if scaling is None else scaling)
    softcap, sinks = softcap or None, kwargs.get("s_aux")  # a cap of 0: none, as flash-attn
    latent = value.shape[-1] != key.shape[-1]  # MLA: values narrower than keys
    # a window that hides keys the cache holds (one as long as the cache hides none)
    window = (
        sliding_window if sliding_window is not None and sliding_window < key.shape[2] else None
    )
    if window is not None and bass_plan is not None and not torch.compiler.is_compiling():
        bass_plan.windowed = True  # a layer brought it (Passes.run checks one did)
    beyond = softcap is not None or sinks is not None or latent or window is not None
    if beyond:  # beyond the contract (pass_impl)
        if bass_cu_q_lens is None:
            raise UnsupportedModelError(
                f"{name} needs logit soft-capping, attention sinks, values narrower than "
                "keys or a sliding window shorter than the cache, which bass computes in its "
                "packed passes only (bass.Generator), not through ragged_attention"
            )
        flexed = bass_plan is not None and bass_plan.impl.name == "flex"
        if flexed and sinks is None and window in (None, bass_plan.window):  # as planned
            out = flex.run(bass_plan.state, query, key, value, scale, softcap, window=window)
            return out.transpose(1, 2), None  # the cap and the window: a score_mod
        if bass_plan is not None:  # the pass's, made once for every layer
            starts, q_lens = bass_plan.starts, bass_plan.q_lens
        else:
            starts, q_lens = bass_cu_q_lens[:-1], bass_cu_q_lens.diff()
        out = reference.attention(
            query, key, value, starts, q_lens, bass_kv_lens, scale, softcap, sinks, window
        )
        return out.transpose(1, 2), None
    if bass_plan is not None:  # packed: token-major output, the transpose back is free
        return bass_plan.attend(query, key, value, scale).transpose(1, 2), None
    if bass_cu_q_lens is not None:
        out = torch.ops.bass.ragged_attention_packed(
            query, key, value, bass_cu_q_lens, bass_kv_lens, scale, bass_impl
        )
        return out.transpose(1, 2), None
    out = torch.ops.bass.ragged_attention(
        query, key, value, bass_q_lens, bass_kv_lens, scale, bass_impl
    )
    return out.transpose(1, 2).contiguous(), None


class LengthsDropped(UnsupportedModelError):
    """An attention module called without bass's lengths (:func:`prefill` tells a model
    whose layers drop them from a caller who did not pass them)."""

    def __init__(self, module: str, message: str):
        super().__init__(message)
        self.module = module


def bass_mask(*args, **kwargs) -> None:
    """The ``"bass"`` mask function: no mask; ``ragged_attention`` masks by lengths."""
    return None


AttentionInterface.register(ATTN_NAME, bass_attention_forward)
AttentionMaskInterface.register(ATTN_NAME, bass_mask)


@contextlib.contextmanager
def handed_back(models: Sequence[torch.nn.Module], attns: list):
    """Inside, ``models`` run the attention they came with (``attns``, as
    :func:`bass.compat.attn_implementations` read them): the caller's own code between a
    generation's rows (a stream's loop body, ``on_finish``) may run them, to score or train
    on a finished row; bass's again after."""
    for model, attn in zip(models, attns):
        model.set_attn_implementation(attn)
    try:
        yield
    finally:
        for model in models:
            model.set_attn_implementation(ATTN_NAME)


@contextlib.contextmanager
def attention_restored(models: Sequence[torch.nn.Module]):
    """Hands ``models`` back with the attention implementations they came with (each one
    switched back where it changed inside the block), however the block ends; ``as``:
    those implementations (:func:`handed_back` takes them)."""
    previous = [compat.attn_implementations(m) for m in models]
    try:
        yield previous
    finally:
        for model, attn in zip(models, previous):
            if compat.attn_implementations(model) != attn:
                model.set_attn_implementation(attn)


def model_name(model: torch.nn.Module) -> str:
    path = getattr(getattr(model, "config", None), "_name_or_path", "") or ""
    return f"{type(model).__name__}" + (f" ({path})" if path else "")


def sliding_window(model) -> int | None:
    """The sliding window (tokens) of ``model``'s attention, or ``None`` when it attends
    to every earlier position."""
    config = model.config
    text = config.get_text_config()
    window = getattr(text, "sliding_window", None)
    layer_types = getattr(text, "layer_types", None)
    if layer_types:  # per layer: a window only where a layer slides (Qwen2 with every
        return window if "sliding_attention" in layer_types else None  # layer full: none)
    if getattr(text, "use_sliding_window", True):
        return window
    return None


def check_loaded(model, role: str) -> None:
    """Refuse a model bass cannot generate with, when a Generator is built: one that
    ``torch.compile`` wrapped (bass compiles its own passes), or one with weights on the
    meta device (never loaded). ``role``: ``"main"`` or ``"draft"``, for the message."""
    if isinstance(model, torch._dynamo.eval_frame.OptimizedModule):
        raise TypeError(
            f"the {role} model is a torch.compile'd module ({type(model._orig_mod).__name__}): "
            "pass the model itself (compiled._orig_mod); bass compiles its own passes: "
            "Generator(..., compile=True)"
        )
    if model.get_output_embeddings() is None:
        raise ValueError(
            f"the {role} model {model_name(model)} has no language-model head "
            "(get_output_embeddings() is None): bass needs a causal LM; load it with "
            "AutoModelForCausalLM (not AutoModel)"
        )
    meta = next((n for n, p in model.named_parameters() if p.device.type == "meta"), None)
    if meta is not None:
        raise ValueError(
            f"the {role} model {model_name(model)} has weights on the meta device ({meta}, "
            "...): they were never loaded; load the model with its weights (from_pretrained "
            "without init_empty_weights or a 'meta' device map), or offload with accelerate "
            "to a real device"
        )


SOFTCAP, SINKS, LATENT = "logit soft-capping", "attention sinks", "values narrower than keys"
WINDOW = "sliding-window attention"


class Beyond(NamedTuple):
    """What a model's attention needs beyond the ops' contract (:func:`needs`), as its
    passes plan for it (:func:`pass_impl`)."""

    need: str  # SOFTCAP, SINKS, LATENT or WINDOW, or one of the first three "and" WINDOW
    cap: float | None  # the one soft-cap every attention layer holds (and passes), else None
    flex: bool  # flex takes the model's dtype and head dim on its device (flex.takes)
    window: int | None = None  # the sliding window, where the generation outgrows it


# model -> needs(model), set by prepare (each generation), read by every pass
_BEYOND: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def planned(model) -> Beyond | None:
    """What :func:`prepare` planned ``model``'s passes for (:func:`needs` with the tokens
    the generation feeds); :func:`needs` of a model not prepared."""
    return _BEYOND[model] if model in _BEYOND else needs(model)


def needs(model, fed: int | None = None) -> Beyond | None:
    """What ``model``'s attention needs that the ops' contract lacks, which
    :func:`bass_attention_forward` computes itself (:func:`pass_impl`), with what planning
    needs (``None``: nothing): ``need`` is ``"logit soft-capping"`` (Gemma 2), ``"attention
    sinks"`` (gpt-oss), ``"values narrower than keys"`` (DeepSeek V2/V3), ``"sliding-window
    attention"`` where ``fed`` (the positions a generation feeds; ``None``: no window
    counted) outgrows the window, or two joined by "and"; the layers' one cap (0: none),
    whether flex takes the model, its window."""
    cfg, p = model.config.get_text_config(), next(model.parameters())
    # the cap each attention layer stores and hands its attention function (Gemma 2)
    caps = {float(c) for m in model.modules() if (c := getattr(m, "attn_logit_softcapping", 0))}
    if getattr(cfg, "attn_logit_softcapping", 0) or caps:
        need = SOFTCAP
    elif any(name.endswith(".sinks") for name, _ in model.named_parameters()):
        need, caps = SINKS, set()
    elif getattr(cfg, "v_head_dim", None) not in (None, compat.head_dim(cfg)):
        need = LATENT  # multi-head latent attention (DeepSeek V2/V3, MiniCPM3)
    else:
        need = None
    window = sliding_window(model)
    if window is not None and fed is not None and window < fed:
        need = WINDOW if need is None else f"{need} and {WINDOW}"
    else:
        window = None
    if need is None:
        return None
    cap = caps.pop() if len(caps) == 1 else None
    return Beyond(need, cap, flex.takes(p.dtype, compat.head_dim(cfg), p.device.type), window)


def pass_impl(impl: str, beyond: Beyond | None, device_type: str) -> tuple[str, str]:
    """The implementation a pass plans for a model that needs ``beyond`` (:func:`needs`)
    when ``impl`` is asked for on ``device_type``, and why: ``flex`` computes a soft-cap and
    a sliding window (a ``score_mod``) where asked for, and is ``auto``'s pick on a CPU
    (``$BASS_AUTO_ATTENTION`` forces ``auto``'s); the ``reference`` computes every need,
    and runs in every other case."""
    if beyond is None:
        return impl, ""
    if impl == "auto":
        impl = os.environ.get(AUTO_OVERRIDE) or ("flex" if device_type == "cpu" else "")
        if not impl:
            return (
                "reference",
                "flex's score_mod passed on a GPU for a soft-cap only (attention='flex' asks)",
            )
    if SINKS in beyond.need or LATENT in beyond.need:
        return "reference", f"only the reference computes {beyond.need}"
    if impl != "flex":
        return "reference", f"attention={impl!r} computes none of it"
    if not beyond.flex:
        return "reference", "flex takes no float64, nor head dims under 32 on a CPU (16 on CUDA)"
    return "flex", "as a score_mod"


def prepare(
    model: PreTrainedModel, max_len: int | None = None, role: str | None = None
) -> PreTrainedModel:
    """Check ``model`` can be routed through bass and set ``attn_implementation="bass"``.

    Raises :class:`UnsupportedModelError` naming the model when its attention does not go
    through transformers' attention interface, it is not a decoder-only causal LM, or its
    rotary embedding's switch (:func:`bass.compat.rope_switch`) is shorter than the
    positions a generation feeds: ``max_len`` (the longest prompt plus ``max_new_tokens``)
    less one (a sliding window shorter than that is planned for: :func:`needs`). ``role``
    (``"main"``, ``"draft"``) names the model's part in the errors.
    """
    name = model_name(model) if role is None else f"the {role} model {model_name(model)}"
    if not isinstance(model, PreTrainedModel):
        raise UnsupportedModelError(f"{name} is not a transformers PreTrainedModel")
    config = model.config
    if getattr(config, "is_encoder_decoder", False):
        raise UnsupportedModelError(
            f"{name} is an encoder-decoder model; bass needs a decoder-only LM"
        )
    text = config.get_text_config()  # layer types first: hybrids are named by them
    layer_types = getattr(text, "layer_types", None) or []
    if any(t not in ("full_attention", "sliding_attention") for t in layer_types):
        raise UnsupportedModelError(
            f"{name} has layers of types {sorted(set(layer_types))}; bass runs full and "
            "sliding-window attention layers only (not chunked attention, linear-attention "
            "or state-space layers)"
        )
    if getattr(type(model), "_is_stateful", False):  # transformers' mark: no layer types
        raise UnsupportedModelError(  # to name (RWKV, older configs of Mamba-likes)
            f"{name} keeps a recurrent state (state-space or linear-attention layers) that "
            "cannot be rolled back to the tokens a verify pass accepts; bass runs full and "
            "sliding-window attention layers only"
        )
    if not type(model).is_backend_compatible():
        raise UnsupportedModelError(
            f"{name} does not route attention through transformers' AttentionInterface "
            "(_supports_attention_backend is False), so bass cannot replace it"
        )
    decoder = compat.text_decoder(model)  # the text decoder's layers
    tuned = [m for m in decoder.modules() if compat.scales_queries_by_position(m)]
    if tuned:
        raise UnsupportedModelError(
            f"{name}'s {type(tuned[0]).__name__} scales its queries by their positions, which "
            "it reads from the cache (Llama 4's attention temperature tuning in its layers "
            "without rotary embeddings); bass packs rows of different lengths into one pass, "
            "so there is no one length to give: load it with attn_temperature_tuning=False (a "
            "model that differs past floor_scale positions) or run it without bass"
        )
    # attention that sees later tokens (an encoder's, BERT-likes built without is_decoder):
    # bass's ragged attention is causal, it would silently give other tokens
    # (the text decoder's: a multimodal model's vision tower does not see the text)
    bidirectional = sorted(
        {type(m).__name__ for m in decoder.modules() if getattr(m, "is_causal", None) is False}
    )
    if bidirectional:
        raise UnsupportedModelError(
            f"{name}'s attention is not causal ({', '.join(bidirectional)}.is_causal is False: "
            "each token also sees later ones); bass's ragged attention is causal: build it "
            "as a decoder (config is_decoder=True, where the family has one) or use a causal LM"
        )
    # the positions a generation feeds: the longest prompt plus max_new_tokens, less one
    # (a row's last new token is never fed back)
    fed = None if max_len is None else max_len - 1
    switch = compat.rope_switch(text)
    if switch is not None and fed is not None and switch < fed:
        raise UnsupportedModelError(
            f"{name}'s rotary embedding (longrope) takes its long factors past {switch} "
            f"positions (original_max_position_embeddings) for every token of a forward pass "
            f"at once, but this generation feeds {fed} (the longest prompt plus "
            "max_new_tokens, less the last new token); bass packs rows of different lengths "
            "into one pass and would mix the two: keep the longest prompt plus "
            f"max_new_tokens within {switch + 1} tokens"
        )
    compat.cache_argument(model)  # read the signature here, not inside a compiled pass
    _BEYOND[model] = needs(model, fed)
    previous = compat.attn_implementations(model)
    model.set_attn_implementation(ATTN_NAME)
    if (now := compat.attn_implementation(model)) != ATTN_NAME:
        model.set_attn_implementation(previous)  # handed back as it came
        raise UnsupportedModelError(
            f"{name} did not switch to attn_implementation='bass' (it stays {now!r}), so "
            "bass cannot replace its attention"
        )
    return model
