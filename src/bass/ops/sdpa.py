"""CPU implementations on ``F.scaled_dot_product_attention``: per row, and padded.

``impl="sdpa"``: ragged attention as one SDPA call per row, on that row's own slices.

Row ``b`` attends with its ``q_lens[b]`` real queries to its first ``kv_lens[b]`` keys, so
nothing past a row's length is ever read (NaN left in an uninitialised cache slot cannot
leak) and no padded work is done; the causal mask is bottom-right aligned (query ``i`` sees
keys ``0..kv_len - q_len + i``). The loop over rows reads the lengths on the host, which
costs nothing on CPU: this implementation is registered for CPU only.

``impl="sdpa_padded"``: one SDPA call over every row padded to the batch's longest
``kv_len``, with a mask built from the lengths: the CPU analogue of BASS-PAD, as
``sdpa`` is of BASS-SPLIT. It wins when the rows' lengths are close (one large call
instead of ``B`` small ones) and loses when they spread (it computes the padding).
Padding slots get zero weights, but a NaN or Inf there would still leak into the result,
and only as a non-finite output value (0 * NaN is NaN); to keep the contract (nothing past
``kv_len`` can change the result) a batch whose output is not finite is redone per row.

``auto`` chooses between them on CPU from measured data (bench/results/cpu_kernels.md,
the rule in ``bass/ops/auto_rules/cpu.json``). Both compute fp16/bf16 in float32 and
round once, as the reference does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def ragged_attention(q, k, v, q_lens, kv_lens, scale: float) -> torch.Tensor:
    Hq, Hkv = q.shape[1], k.shape[1]  # q: [B, Hq, T, D]; k, v: [B, Hkv, S, D]
    cdt = torch.float64 if q.dtype == torch.float64 else torch.float32
    out = q.new_zeros(q.shape)  # padding slots stay 0
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


def ragged_attention_padded(q, k, v, q_lens, kv_lens, scale: float) -> torch.Tensor:
    B, Hq, T, _ = q.shape
    Hkv = k.shape[1]
    S = max(kv_lens.tolist(), default=0)
    if B == 0 or T == 0 or S == 0:
        return q.new_zeros(q.shape)
    cdt = torch.float64 if q.dtype == torch.float64 else torch.float32
    t = torch.arange(T, device=q.device)
    live = t < q_lens[:, None]  # [B, T]: real (not padding) query slots
    pos = (kv_lens - q_lens)[:, None] + t  # [B, T]: each query's position
    mask = torch.arange(S, device=q.device) <= pos[:, :, None]  # [B, T, S]
    mask &= live[:, :, None]
    mask[:, :, 0] |= ~live  # padding slots attend to key 0 (zeroed below)
    out = F.scaled_dot_product_attention(
        q.to(cdt),
        k[:, :, :S].to(cdt),
        v[:, :, :S].to(cdt),
        attn_mask=mask[:, None],
        scale=scale,
        enable_gqa=Hq != Hkv,
    )
    out.masked_fill_(~live[:, None, :, None], 0.0)
    # Padding slots get zero weight, but NaN/Inf stored there would still reach the output
    # (0 * NaN = NaN), and only as a non-finite value: then redo the batch row by row,
    # which never reads past kv_len. One reduction over the small output.
    if not bool(out.isfinite().all()):
        return ragged_attention(q, k, v, q_lens, kv_lens, scale)
    return out.to(q.dtype)
