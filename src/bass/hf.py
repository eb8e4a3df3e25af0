"""transformers integration: ``attn_implementation="bass"``.

Importing this module registers, under the name ``"bass"``:

* an attention function (``transformers.AttentionInterface``) that routes every layer's
  attention to ``torch.ops.bass.ragged_attention``, with the per-row lengths that reach it
  as the keyword arguments ``bass_q_lens`` / ``bass_kv_lens`` of the model's forward;
* a mask function (``transformers.AttentionMaskInterface``) that builds no mask: the op
  masks by lengths. Without this registration transformers would silently build none
  either, for the wrong reason, and a model could run unmasked.

:func:`prepare` checks that a model can be routed through bass and switches it over.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface, PreTrainedModel
from transformers.masking_utils import AttentionMaskInterface

from .ops import length_hint

ATTN_NAME = "bass"


class UnsupportedModelError(ValueError):
    """The model's attention cannot be routed through bass."""


def bass_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,  # [B, Hq, T, D]
    key: torch.Tensor,  # [B, Hkv, S, D]: the whole RaggedKVCache buffer of this layer
    value: torch.Tensor,  # [B, Hkv, S, D]
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    bass_q_lens: torch.Tensor | None = None,  # int32 [B]
    bass_kv_lens: torch.Tensor | None = None,  # int32 [B]
    bass_impl: str = "auto",
    sliding_window: int | None = None,
    softcap: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """The ``"bass"`` attention function: returns ``([B, T, Hq, D], None)`` as HF expects."""
    name = type(module).__name__
    if bass_q_lens is None or bass_kv_lens is None:
        raise UnsupportedModelError(
            f"{name} was called with attn_implementation='bass' but without bass's per-row "
            "lengths; run the model through bass.Generator (or pass bass_q_lens and "
            "bass_kv_lens to its forward)"
        )
    if sliding_window is not None and sliding_window < key.shape[2]:
        raise UnsupportedModelError(
            f"{name} uses sliding-window attention (window {sliding_window}) but the cache "
            f"holds {key.shape[2]} positions; bass's ragged attention is full causal. "
            "Keep prompt + max_new_tokens within the window or use a full-attention model"
        )
    if softcap is not None or kwargs.get("s_aux") is not None:
        raise UnsupportedModelError(
            f"{name} needs logit soft-capping or attention sinks, which bass's ragged "
            "attention does not implement"
        )
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    out = torch.ops.bass.ragged_attention(
        query, key, value, bass_q_lens, bass_kv_lens, float(scaling), bass_impl
    )
    return out.transpose(1, 2).contiguous(), None


def bass_mask(*args, **kwargs) -> None:
    """The ``"bass"`` mask function: no mask; ``ragged_attention`` masks by lengths."""
    return None


AttentionInterface.register(ATTN_NAME, bass_attention_forward)
AttentionMaskInterface.register(ATTN_NAME, bass_mask)


def model_name(model: torch.nn.Module) -> str:
    path = getattr(getattr(model, "config", None), "_name_or_path", "") or ""
    return f"{type(model).__name__}" + (f" ({path})" if path else "")


def prepare(model: PreTrainedModel, max_len: int | None = None) -> PreTrainedModel:
    """Check ``model`` can be routed through bass and set ``attn_implementation="bass"``.

    Raises :class:`UnsupportedModelError` naming the model when its attention does not go
    through transformers' attention interface, it is not a decoder-only causal LM, or its
    sliding window is shorter than ``max_len``.
    """
    name = model_name(model)
    if not isinstance(model, PreTrainedModel):
        raise UnsupportedModelError(f"{name} is not a transformers PreTrainedModel")
    config = model.config
    if getattr(config, "is_encoder_decoder", False):
        raise UnsupportedModelError(
            f"{name} is an encoder-decoder model; bass needs a decoder-only LM"
        )
    if not type(model).is_backend_compatible():
        raise UnsupportedModelError(
            f"{name} does not route attention through transformers' AttentionInterface "
            "(_supports_attention_backend is False), so bass cannot replace it"
        )
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    layer_types = getattr(text, "layer_types", None) or []
    if any(t not in ("full_attention", "sliding_attention") for t in layer_types):
        raise UnsupportedModelError(
            f"{name} has layers of types {sorted(set(layer_types))}; bass supports attention "
            "layers only (no linear-attention or state-space layers)"
        )
    window = getattr(text, "sliding_window", None)
    uses_window = "sliding_attention" in layer_types or (
        window is not None and getattr(text, "use_sliding_window", True)
    )
    if uses_window and window is not None and max_len is not None and window < max_len:
        raise UnsupportedModelError(
            f"{name} uses a sliding window of {window} tokens but this generation needs "
            f"{max_len}; bass's ragged attention is full causal"
        )
    model.set_attn_implementation(ATTN_NAME)
    return model


def forward_logits(
    model: PreTrainedModel,
    cache,  # RaggedKVCache
    input_ids: torch.Tensor,  # int64 [B, T] (padded)
    q_lens: torch.Tensor,  # int32 [B]: real tokens per row
    impl: str = "auto",
    logits_to_keep: int | torch.Tensor = 0,
) -> torch.Tensor:  # [B, T, V] (or [B, kept, V])
    """One forward pass over ragged new tokens; appends them to ``cache`` (uncommitted).

    ``logits_to_keep`` is transformers' argument: ``0`` all positions, an int ``n`` the
    last ``n``, a 1-D index tensor those positions (the lm head is the largest matmul of
    a prefill; most positions' logits are never read).
    """
    if model.config._attn_implementation != ATTN_NAME:
        # With any other attention the whole (unmasked) cache buffer would be attended to.
        raise RuntimeError(
            f"{model_name(model)} is set to attn_implementation="
            f"{model.config._attn_implementation!r}, not 'bass'; call bass.hf.prepare(model) "
            "(models sharing a config object with another model change together)"
        )
    kv_lens = cache.begin(q_lens)
    T = input_ids.shape[1]
    positions = cache.lens.to(torch.long)[:, None] + torch.arange(T, device=input_ids.device)
    out = model(
        input_ids=input_ids,
        position_ids=positions,
        past_key_values=cache,
        use_cache=True,
        bass_q_lens=cache.q_lens,
        bass_kv_lens=kv_lens,
        bass_impl=impl,
        logits_to_keep=logits_to_keep,
    )
    return out.logits


def prefill(model, cache, prompts: list[list[int]], impl: str = "auto", waste: float = 0.25):
    """Prefill ``cache`` with ragged ``prompts``; return each row's last logits ``[B, V]``.

    Rows are sorted by length and prefilled in groups whose padded size stays within
    ``(1 + waste)`` of their real tokens, so one long prompt does not make every row pay
    for its length in the MLPs and projections (the op itself skips padding anyway).
    Groups go through small caches that are then copied into their rows of ``cache``;
    a batch that is already even runs as one pass. Returns ``(logits, passes)``.
    """
    from .drafters import pad_rows

    device = cache.lens.device
    lens = [len(p) for p in prompts]
    groups, cur, cur_tokens = [], [], 0
    for b in sorted(range(len(prompts)), key=lens.__getitem__):
        # ascending lengths: the newest row is the group's longest
        if cur and lens[b] * (len(cur) + 1) > (1 + waste) * (cur_tokens + lens[b]):
            groups.append(cur)
            cur, cur_tokens = [], 0
        cur.append(b)
        cur_tokens += lens[b]
    groups.append(cur)
    if len(groups) == 1:  # one pass straight into ``cache``: its rows in the batch's order
        groups = [list(range(len(prompts)))]
    out = None
    for rows in groups:
        sub = cache if len(groups) == 1 else cache.empty_like(len(rows))
        group = [prompts[b] for b in rows]  # logits row i belongs to prompt rows[i]
        q_lens = torch.tensor([len(p) for p in group], dtype=torch.int32, device=device)
        width = int(max(len(p) for p in group))
        # only the distinct last positions go through the lm head
        last = q_lens.long() - 1
        keep, where = torch.unique(last, return_inverse=True)
        with length_hint([len(p) for p in group]):  # the host knows them: no device read
            logits = forward_logits(model, sub, pad_rows(group, width, device), q_lens, impl, keep)
        logits = logits[torch.arange(len(group), device=device), where]  # [b, V]
        sub.commit(q_lens)
        if out is None:
            out = logits.new_empty(len(prompts), logits.shape[-1])
        index = torch.tensor(rows, dtype=torch.long, device=device)
        out[index] = logits
        if sub is not cache:
            cache.copy_rows_from(index, sub)
    return out, len(groups)
