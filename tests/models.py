"""Tiny random transformers models for tests (no weights are ever downloaded)."""

from __future__ import annotations

import copy

import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

FAMILIES = {
    "llama": (LlamaConfig, LlamaForCausalLM, {}),
    "mistral": (MistralConfig, MistralForCausalLM, {"sliding_window": None}),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, {}),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM, {"head_dim": 8}),
}


def tiny_lm(
    family: str = "llama",
    *,
    seed: int = 0,
    vocab: int = 64,
    layers: int = 2,
    hidden: int = 32,
    heads: int = 4,
    kv_heads: int = 2,
    dtype=torch.float64,
    max_positions: int = 256,
    sharpen: float = 25.0,
):
    """A random causal LM of ``family`` small enough to run many generations on a CPU."""
    config_cls, model_cls, extra = FAMILIES[family]
    torch.manual_seed(seed)
    config = config_cls(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=False,
        **extra,
    )
    model = model_cls(config).eval().to(dtype)
    # Random init with std 0.02 gives near-uniform logits; sharpen the output head so
    # greedy choices are decisive and drafts agree often enough to exercise acceptance.
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(sharpen)
    return model


def perturbed(model, scale: float = 0.3, seed: int = 1):
    """A copy of ``model`` with noise on its weights: a draft that agrees only sometimes."""
    out = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in out.parameters():
            noise = torch.randn(p.shape, generator=g, dtype=p.dtype).to(p.device)
            p.add_(noise * scale * p.std().nan_to_num())
    return out


def reference_greedy(model, prompt: list[int], max_new_tokens: int, eos=None) -> list[int]:
    """The main model's own greedy ``generate`` on one prompt, with sdpa attention."""
    ref = copy.deepcopy(model)
    ref.set_attn_implementation("sdpa")
    ids = torch.tensor([prompt])
    out = ref.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=eos,
        pad_token_id=0,
    )
    seq = out[0, len(prompt) :].tolist()
    if eos is not None and eos in seq:  # generate pads finished rows; keep up to eos
        seq = seq[: seq.index(eos) + 1]
    return seq


def forward_padded(model, cache, input_ids, q_lens, impl: str = "auto"):
    """One padded forward pass (``input_ids`` int64 ``[B, T]``, row ``b``'s first
    ``q_lens[b]`` tokens real) through a model :func:`bass.hf.prepare` routed to bass's
    attention: the padded op's path (``bass_q_lens``), which the engine's packed passes do
    not take. Appends the tokens to ``cache`` (uncommitted); returns the logits
    ``[B, T, V]``."""
    from bass import compat

    kv_lens = cache.begin(q_lens)
    T = input_ids.shape[1]
    positions = cache.lens.to(torch.long)[:, None] + torch.arange(T, device=input_ids.device)
    out = model(
        input_ids=input_ids,
        position_ids=positions,
        **compat.forward_cache_kwargs(model, cache),
        use_cache=True,
        bass_q_lens=cache.q_lens,
        bass_kv_lens=kv_lens,
        bass_impl=impl,
    )
    return out.logits
