"""``impl="sdpa"`` (CPU): ragged attention as one ``F.scaled_dot_product_attention`` call
per row, on that row's own slices.

Row ``b`` attends with its ``q_lens[b]`` real queries to its first ``kv_lens[b]`` keys, so
nothing past a row's length is ever read (NaN left in an uninitialised cache slot cannot
leak) and no padded work is done; the causal mask is bottom-right aligned (query ``i`` sees
keys ``0..kv_len - q_len + i``). The loop over rows reads the lengths on the host, which
costs nothing on CPU: this implementation is registered for CPU only, where ``auto``
prefers it (bench/results/cpu_kernels.md compares it with the reference and with SDPA
over the padded cache). fp16/bf16 compute in float32 and round once, as the reference.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def ragged_attention(q, k, v, q_lens, kv_lens, scale: float) -> torch.Tensor:
    Hq, Hkv = q.shape[1], k.shape[1]  # q: [B, Hq, T, D]; k, v: [B, Hkv, S, D]
    cdt = torch.float64 if q.dtype == torch.float64 else torch.float32
    out = torch.zeros_like(q)  # padding slots stay 0
    for b, (ql, kl) in enumerate(zip(q_lens.tolist(), kv_lens.tolist())):
        if ql == 0:
            continue
        qb = q[b : b + 1, :, :ql].to(cdt)  # [1, Hq, ql, D]
        kb, vb = k[b : b + 1, :, :kl].to(cdt), v[b : b + 1, :, :kl].to(cdt)  # [1, Hkv, kl, D]
        mask = None
        if ql > 1:  # query i sits at position kl - ql + i
            i = torch.arange(ql, device=q.device)[:, None]
            mask = torch.arange(kl, device=q.device)[None] <= i + (kl - ql)  # [ql, kl]
        ob = F.scaled_dot_product_attention(
            qb, kb, vb, attn_mask=mask, scale=scale, enable_gqa=Hq != Hkv
        )
        out[b : b + 1, :, :ql] = ob.to(q.dtype)
    return out
