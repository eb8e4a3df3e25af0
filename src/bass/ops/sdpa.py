"""``impl="sdpa"``: ragged attention through ``F.scaled_dot_product_attention``.

The ragged lengths become a boolean mask ``[B, 1, T, S]`` and PyTorch's fused SDPA kernels
do the rest (GQA through ``enable_gqa``). It computes over the whole cache like the
reference, but with PyTorch's optimised kernels: on CPU it is several times faster than
the reference (bench/results/cpu_kernels.md), so ``auto`` prefers it there. Two details
keep the contract exact:

* a padding query slot has no key to attend to, and SDPA would return NaN for it; it is
  given key 0 and its output is then replaced by 0;
* cache slots at or past ``kv_len`` are never read by the contract, but a masked score or
  value still enters SDPA's arithmetic (``0 * NaN`` is NaN), so K and V are zeroed there.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def ragged_attention(q, k, v, q_lens, kv_lens, scale: float) -> torch.Tensor:
    Hq, T = q.shape[1], q.shape[2]  # q: [B, Hq, T, D]
    Hkv, S = k.shape[1], k.shape[2]  # k, v: [B, Hkv, S, D]
    t = torch.arange(T, device=q.device)
    s = torch.arange(S, device=q.device)
    ql = q_lens.to(torch.long)[:, None]  # [B, 1]
    kl = kv_lens.to(torch.long)[:, None]  # [B, 1]
    valid = t[None] < ql  # [B, T] real query slots
    pos = kl - ql + t  # [B, T] absolute position of each query
    allowed = (s[None, None] <= pos[:, :, None]) & valid[:, :, None]  # [B, T, S]
    allowed = allowed | ((~valid)[:, :, None] & (s == 0))  # padding slots: key 0, then 0
    live = (s[None] < kl)[:, None, :, None]  # [B, 1, S, 1]
    # fp16/bf16 go through float32 (one rounding at the end, as the reference): CPU SDPA
    # in bf16 rounds the probabilities too, an error the contract's tolerances do not allow
    cdt = torch.float64 if q.dtype == torch.float64 else torch.float32
    zero = torch.zeros((), dtype=cdt, device=k.device)
    k, v = torch.where(live, k.to(cdt), zero), torch.where(live, v.to(cdt), zero)
    out = F.scaled_dot_product_attention(
        q.to(cdt), k, v, attn_mask=allowed[:, None], scale=scale, enable_gqa=Hq != Hkv
    )
    return torch.where(valid[:, None, :, None], out, zero).to(q.dtype)
