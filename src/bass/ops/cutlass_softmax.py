"""The masked softmax between the two GEMMs of the ``pad`` and ``split`` implementations.

Layout (see ``cutlass_kernels/generate.py``): for every (batch row ``b``, KV head ``h``)
problem ``p = b * Hkv + h`` the first GEMM wrote float32 ``scores^T[p, s, r]`` (key ``s``,
query row ``r = g * T + t`` of the ``G`` query heads sharing KV head ``h``), and this
kernel writes ``P^T[p, s, r]`` in the input dtype for the second GEMM:

* query ``t`` of row ``b`` is valid when ``t < q_lens[b]``; it sits at absolute position
  ``kv_lens[b] - q_lens[b] + t`` and sees keys ``s <= `` that position;
* ``P = softmax(scale * scores)`` over the keys it sees, computed in float32; every other
  entry (padding query rows, future keys, keys past ``kv_lens[b]``) is written as 0 and
  its score is never used (NaN or garbage there is harmless).

Keys ``s < n_keys`` are written, where ``n_keys`` is the padded length for ``pad`` and
``kv_lens[b]`` for ``split`` (``per_row_keys=True``); columns ``r < ld`` are written.

``bass`` imports this module only when a CUTLASS op runs; it imports without Triton
(then :func:`masked_softmax` raises). Its torch twin is in ``tests/ops/test_cutlass.py``.
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # importable without Triton (doctest collection, CPU-only installs)
    triton = tl = None


def _jit(fn):
    return fn if triton is None else triton.jit(fn)


@_jit
def _masked_softmax_kernel(
    scores_ptr,  # float32 [P, rows, ld]
    probs_ptr,  # fp16/bf16 [P, rows, ld]
    q_lens_ptr,  # int32 [B]
    kv_lens_ptr,  # int32 [B]
    n_keys,  # keys written per problem when not PER_ROW_KEYS
    slab,  # elements between problems (rows * ld)
    ld,  # elements between keys (row stride)
    n_rows,  # G * T query rows per problem
    heads_kv,
    T,
    scale,
    PER_ROW_KEYS: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    p = tl.program_id(0)
    b = p // heads_kv
    ql = tl.load(q_lens_ptr + b)
    kl = tl.load(kv_lens_ptr + b)
    r = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    t = r % T
    valid = (r < n_rows) & (t < ql)
    pos = kl - ql + t  # last key each query row sees
    if PER_ROW_KEYS:
        limit = tl.minimum(kl, n_keys)
    else:
        limit = n_keys
    base = p.to(tl.int64) * slab
    in_cols = r < ld

    # pass 1: running max and normaliser per query row (online softmax)
    m = tl.full([BLOCK_R], float("-inf"), tl.float32)
    den = tl.zeros([BLOCK_R], tl.float32)
    for s0 in range(0, limit, BLOCK_S):
        s = s0 + tl.arange(0, BLOCK_S)
        seen = valid[None, :] & (s[:, None] <= pos[None, :]) & (s[:, None] < limit)
        offs = base + s[:, None].to(tl.int64) * ld + r[None, :]
        x = tl.load(scores_ptr + offs, mask=seen, other=0.0)
        x = tl.where(seen, x * scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(x, axis=0))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        e = tl.where(seen, tl.exp(x - m_safe[None, :]), 0.0)
        den = den * tl.exp(m - m_safe) + tl.sum(e, axis=0)
        m = m_new

    # pass 2: write P (0 wherever a key is not seen)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    inv = tl.where(den > 0.0, 1.0 / tl.where(den > 0.0, den, 1.0), 0.0)
    for s0 in range(0, limit, BLOCK_S):
        s = s0 + tl.arange(0, BLOCK_S)
        inside = (s[:, None] < limit) & in_cols[None, :]
        seen = valid[None, :] & (s[:, None] <= pos[None, :]) & (s[:, None] < limit)
        offs = base + s[:, None].to(tl.int64) * ld + r[None, :]
        x = tl.load(scores_ptr + offs, mask=seen, other=0.0)
        prob = tl.where(seen, tl.exp(x * scale - m_safe[None, :]) * inv[None, :], 0.0)
        tl.store(probs_ptr + offs, prob.to(probs_ptr.dtype.element_ty), mask=inside)


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def masked_softmax(
    scores: torch.Tensor,
    probs: torch.Tensor,
    q_lens: torch.Tensor,
    kv_lens: torch.Tensor,
    *,
    heads_kv: int,
    q_len: int,
    group: int,
    scale: float,
    n_keys: int,
    per_row_keys: bool,
) -> None:
    """Write ``probs`` (``[P, rows, ld]``, fp16/bf16) from ``scores`` (same, float32).

    ``P = B * heads_kv``; query rows ``r < group * q_len`` are ``r = g * q_len + t``.
    Without ``per_row_keys`` keys ``s < n_keys`` are written; with it, keys
    ``s < min(kv_lens[b], n_keys)`` (the rest of ``probs`` is left as it was), and
    ``n_keys`` must bound every ``kv_lens[b]`` (the cache length).
    """
    if triton is None:
        raise RuntimeError("the masked softmax needs triton (pip install triton)")
    n_problems, rows, ld = scores.shape
    if probs.shape != scores.shape or scores.dtype != torch.float32:
        raise ValueError("scores must be float32 and probs the same shape")
    if not (scores.is_contiguous() and probs.is_contiguous()):
        raise ValueError("scores and probs must be contiguous")
    n_rows = group * q_len
    if n_problems == 0 or n_rows == 0 or rows == 0:
        return
    q_lens, kv_lens = q_lens.contiguous(), kv_lens.contiguous()  # indexed as flat [B]
    block_r = min(64, max(8, _next_pow2(ld)))
    block_s = max(16, 4096 // block_r)
    grid = (n_problems, triton.cdiv(ld, block_r))
    _masked_softmax_kernel[grid](
        scores,
        probs,
        q_lens,
        kv_lens,
        n_keys,
        rows * ld,
        ld,
        n_rows,
        heads_kv,
        q_len,
        float(scale),
        PER_ROW_KEYS=per_row_keys,
        BLOCK_S=block_s,
        BLOCK_R=block_r,
    )
