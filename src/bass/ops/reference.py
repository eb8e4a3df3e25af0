"""Pure-PyTorch implementations of the bass ops: the oracle every fast path is tested against.

Everything here is vectorised over rows and heads (no Python loop over either), runs on
any device torch supports, and computes in float32 (float64 stays float64).
"""

from __future__ import annotations

import torch


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def ragged_attention(
    q: torch.Tensor,  # [B, Hq, T, D]
    k: torch.Tensor,  # [B, Hkv, S, D]
    v: torch.Tensor,  # [B, Hkv, S, D]
    q_lens: torch.Tensor,  # int32 [B]
    kv_lens: torch.Tensor,  # int32 [B]
    scale: float,
) -> torch.Tensor:  # [B, Hq, T, D]
    """Masked dense attention over the whole cache; see ``bass.ops.ragged_attention``."""
    B, Hq, T, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    G = Hq // Hkv  # query heads per KV head (HF's repeat_kv order: head h uses h // G)
    cdt = _compute_dtype(q.dtype)

    qg = q.reshape(B, Hkv, G * T, D).to(cdt)  # [B, Hkv, G*T, D]
    scores = torch.matmul(qg, k.to(cdt).transpose(-1, -2)) * scale  # [B, Hkv, G*T, S]
    scores = scores.view(B, Hkv, G, T, S)

    # Row b's query t sits at absolute position kv_lens[b] - q_lens[b] + t (causal).
    t_idx = torch.arange(T, device=q.device)
    s_idx = torch.arange(S, device=q.device)
    ql = q_lens.to(torch.long)[:, None]  # [B, 1]
    pos = kv_lens.to(torch.long)[:, None] - ql + t_idx  # [B, T]
    valid_q = t_idx[None, :] < ql  # [B, T]
    allowed = (s_idx[None, None, :] <= pos[:, :, None]) & valid_q[:, :, None]  # [B, T, S]
    allowed = allowed[:, None, None]  # [B, 1, 1, T, S]

    scores = scores.masked_fill(~allowed, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    # Padding query slots have every key masked: softmax gives NaN there; the contract says 0.
    probs = torch.where(allowed, probs, torch.zeros((), dtype=cdt, device=q.device))
    # Slots past kv_len are never read, whatever they hold: a zero probability times a NaN
    # left in an uninitialised cache slot would still be NaN, so zero those values.
    live = (s_idx[None, :] < kv_lens.to(torch.long)[:, None])[:, None, :, None]  # [B,1,S,1]
    v_live = torch.where(live, v.to(cdt), torch.zeros((), dtype=cdt, device=q.device))
    out = torch.matmul(probs.view(B, Hkv, G * T, S), v_live)  # [B, Hkv, G*T, D]
    return out.view(B, Hq, T, D).to(q.dtype)


def kv_append(
    k_cache: torch.Tensor,  # [B, Hkv, S, D] (mutated)
    v_cache: torch.Tensor,  # [B, Hkv, S, D] (mutated)
    k_new: torch.Tensor,  # [B, Hkv, T, D]
    v_new: torch.Tensor,  # [B, Hkv, T, D]
    cache_lens: torch.Tensor,  # int32 [B]
    new_lens: torch.Tensor,  # int32 [B]
) -> None:
    """Write row b's first ``new_lens[b]`` new tokens at slots ``cache_lens[b] + i``.

    One gather and one scatter of T slots per row. Slot indices are taken modulo S, which
    keeps them distinct within a row (T <= S); the padding positions (i >= new_lens[b])
    write back the value they read, so they change nothing and never collide with a real
    write.
    """
    B, H, T, D = k_new.shape
    S = k_cache.shape[2]
    i = torch.arange(T, device=k_cache.device)
    slots = (cache_lens.to(torch.long)[:, None] + i) % S  # [B, T]
    keep_new = (i[None, :] < new_lens.to(torch.long)[:, None])[:, None, :, None]  # [B,1,T,1]
    index = slots[:, None, :, None].expand(B, H, T, D)
    for cache, new in ((k_cache, k_new), (v_cache, v_new)):
        old = cache.gather(2, index)
        cache.scatter_(2, index, torch.where(keep_new, new.to(cache.dtype), old))
