"""The Triton kernels of the ``fused`` implementation (device code only; the launcher and
the op are in :mod:`bass.ops.fused`).

* ``_ragged_attention_fwd``: the attention kernel (online softmax, fp32 accumulation).
* ``_ragged_attention_combine``: merges the partial results of the split-KV path.

Layout (:mod:`bass.ops.reference`): queries and output ``[1, Hq, N, D]`` (the output
token-major); row ``b`` owns tokens ``starts[b] .. starts[b] + q_lens[b] - 1``; tokens of no
row are padding (0).

Tiling (GQA-aware). One program owns one (row ``b``, KV head, query block). The ``G = Hq //
Hkv`` query heads sharing that KV head are flattened with the row's query slots into the
tile's M dimension, token-major: ``m = t * G + g`` is query ``t`` of query head ``kvh * G +
g``. Each K/V tile is therefore loaded once for all G heads, and the last live query of a
block, which bounds the causal window, is its last m.

Grid axis 0 walks the query blocks of the whole pass, as vLLM's unified attention does: row
``b``'s blocks start at ``start_b = G * starts[b] // BLOCK_M + b``, which grows by at least
the ``cdiv(G * q_len_b, BLOCK_M)`` blocks the row needs (rows are disjoint and in order),
so ``G * N // BLOCK_M + B`` programs per KV head cover every row whatever the lengths: the
grid depends on shapes only, and a CUDA graph can capture the launch. A program's row is
the last ``b`` with ``start_b <= block``; a block past its row's queries reads nothing.
Worked example: ``G = 2``, ``BLOCK_M = 16``, ``starts = [0, 3, 3]``, ``q_lens = [3, 0, 9]``
(``N = 12``): block starts ``0, 1, 2``, so block 0 is row 0 (6 query rows), block 1 row 1
(no query: empty), blocks 2-3 row 2 (18 query rows); ``G * N // 16 + B = 4`` programs.

Per program the KV axis is walked in tiles of BLOCK_N keys up to ``hi``, the causal limit of
the block's last live query (never past ``kv_lens[b]``), in two stages: whole tiles at or
below the block's first query position need no mask; the remaining tiles mask ``key <=
position`` per query. Keys at or past ``kv_lens[b]`` are never loaded, so a cache from
``torch.empty`` (NaN there) is harmless.

Split-KV (flash-decoding). With few programs and long caches the GPU would idle, so a third
grid axis splits each program's key range ``[0, hi)`` into ``splits`` chunks of whole
tiles. Each program writes its normalised partial output and log-sum-exp (base 2) to fp32
scratch indexed by (split, head, token), which starts at zeros and ``-inf`` so tokens of no
row combine to 0; ``_ragged_attention_combine`` rescales and sums them (an empty chunk has
lse ``-inf`` and weight 0).

Dtypes: float16, bfloat16 and float32 run in the kernels (float32 dots in IEEE fp32, not
TF32, to match the reference); float64 is delegated to the reference.
"""

from __future__ import annotations

try:
    import triton
    import triton.language as tl
except ImportError:  # the launcher reports the implementation unavailable
    triton = tl = None

LOG2E = 1.4426950408889634  # scores are kept in the log2 domain (exp2 is the fast path)


def _jit(fn):
    return fn if triton is None else triton.jit(fn)


@_jit
def _ragged_attention_fwd(
    Q,  # [1, Hq, N, D]
    K,  # [B, Hkv, S, D]
    V,  # [B, Hkv, S, D]
    starts,  # int32 [B]: row b's first token
    q_lens,  # int32 [B]
    kv_lens,  # int32 [B]
    Out,  # [1, Hq, N, D] q's dtype, token-major, zeroed (output; direct path)
    PartOut,  # fp32 [splits, Hq, N, D] contiguous, zeroed (output; split path only)
    PartLse,  # fp32 [splits, Hq, N], -inf filled, log2 domain (output; split path only)
    qk_scale,  # float: scale * log2(e)
    B,  # int: rows
    N,  # int: the pass's tokens
    D,  # int: head dim
    stride_qh, stride_qt, stride_qd,  # Q strides
    stride_kb, stride_kh, stride_ks, stride_kd,  # K strides
    stride_vb, stride_vh, stride_vs, stride_vd,  # V strides
    stride_oh, stride_ot,  # Out strides (token-major: D, Hq * D)
    G: tl.constexpr,  # query heads per KV head
    BLOCK_B: tl.constexpr,  # next power of two >= B
    SPLIT: tl.constexpr,  # False: write Out; True: write PartOut/PartLse (grid axis 2)
    BLOCK_M: tl.constexpr,  # query rows (m = t * G + g) per program
    BLOCK_N: tl.constexpr,  # keys per tile
    BLOCK_D: tl.constexpr,  # next power of two >= D (>= 16)
    UPCAST_DOT: tl.constexpr,  # dots in fp32 (interpreter: Triton 3.6 mis-multiplies bf16)
    IEEE_FP32: tl.constexpr,  # fp32 inputs: exact fp32 dots, not TF32 (as the reference)
):  # fmt: skip
    pid_blk = tl.program_id(0)
    kvh = tl.program_id(1).to(tl.int64)
    pid_s = tl.program_id(2)  # KV split (0 on the direct path)
    num_splits = tl.num_programs(2)
    Hq = tl.num_programs(1) * G

    # 0) the program's row: the last b whose first block is at or before this one
    idx = tl.arange(0, BLOCK_B)
    in_b = idx < B
    first_blocks = (tl.load(starts + idx, mask=in_b, other=0) * G) // BLOCK_M + idx
    b = tl.maximum(tl.sum(((first_blocks <= pid_blk) & in_b).to(tl.int32), 0) - 1, 0)
    q_start = tl.load(starts + b)
    q_len = tl.load(q_lens + b)
    kv_len = tl.load(kv_lens + b)
    pid_m = pid_blk - ((q_start * G) // BLOCK_M + b)  # the block within row b
    q_len = tl.where(pid_m >= 0, q_len, 0)
    b = b.to(tl.int64)  # offsets into large caches overflow int32

    # 1) this block's query rows, token-major: m = t * G + g
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    t = offs_m // G
    h = kvh * G + offs_m % G  # query head of each row
    row_ok = (t >= 0) & (t < q_len)
    pos = kv_len - q_len + t  # absolute position of each query
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D

    # 2) the keys this program reads, [lo, end): the block's causal window [0, hi) cut
    # into num_splits chunks of whole tiles; an all-padding block gets hi = 0.
    t_first = pid_m * BLOCK_M // G
    t_last = tl.minimum(((pid_m + 1) * BLOCK_M - 1) // G, q_len - 1)
    hi = tl.where((t_first >= 0) & (t_first < q_len), kv_len - q_len + t_last + 1, 0)
    tiles_per_split = tl.cdiv(tl.cdiv(hi, BLOCK_N), num_splits)
    lo = pid_s * tiles_per_split * BLOCK_N
    end = tl.minimum(lo + tiles_per_split * BLOCK_N, hi)
    # keys < kv_len - q_len + t_first + 1 are visible to every query of the block
    full = tl.minimum(end, kv_len - q_len + t_first + 1)
    mid = lo + tl.maximum(full - lo, 0) // BLOCK_N * BLOCK_N  # end of the unmasked tiles

    tok = q_start + t  # the query's token
    q_mask = row_ok[:, None] & d_ok[None, :]
    q_ptrs = Q + h[:, None] * stride_qh + tok[:, None] * stride_qt + offs_d[None, :] * stride_qd
    q = tl.load(q_ptrs, mask=q_mask, other=0.0)
    if UPCAST_DOT:
        q = q.to(tl.float32)
    k_base = K + b * stride_kb + kvh * stride_kh + offs_d[:, None] * stride_kd  # [BLOCK_D, 1]
    v_base = V + b * stride_vb + kvh * stride_vh + offs_d[None, :] * stride_vd  # [1, BLOCK_D]

    # 3) online softmax over the key tiles (log2 domain, fp32)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for stage in tl.static_range(2):  # 0: whole tiles every query sees; 1: masked tiles
        if stage == 0:
            start_n = lo
            stop_n = mid
        else:
            start_n = mid
            stop_n = end
        for start in range(start_n, stop_n, BLOCK_N):
            offs_n = start + tl.arange(0, BLOCK_N)
            # masked lanes must read 0 (0 * garbage could be NaN)
            if stage == 0:  # whole tiles of live keys visible to every query: no key mask
                k_mask = d_ok[:, None]
                v_mask = d_ok[None, :]
            else:
                k_mask = d_ok[:, None] & (offs_n < end)[None, :]
                v_mask = (offs_n < end)[:, None] & d_ok[None, :]
            k = tl.load(k_base + offs_n[None, :] * stride_ks, mask=k_mask, other=0.0)
            v = tl.load(v_base + offs_n[:, None] * stride_vs, mask=v_mask, other=0.0)
            if UPCAST_DOT:
                k = k.to(tl.float32)
                v = v.to(tl.float32)
            if IEEE_FP32:
                qk = tl.dot(q, k, input_precision="ieee")  # [BLOCK_M, BLOCK_N]
            else:
                qk = tl.dot(q, k)
            qk = qk * qk_scale
            if stage == 1:
                visible = (offs_n[None, :] <= pos[:, None]) & (offs_n[None, :] < end)
                qk = tl.where(visible, qk, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            # a row with no visible key yet keeps m = -inf: shift by 0 so exp2 gives 0, not NaN
            m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2(m_i - m_ref)
            p = tl.exp2(qk - m_ref[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None]
            if IEEE_FP32:
                acc += tl.dot(p, v, input_precision="ieee")
            else:
                acc += tl.dot(p.to(v.dtype), v)
            m_i = m_new

    # 4) epilogue: normalise; only this row's own tokens are stored (the slots after
    # them are the next row's), so padding keeps its zeros
    has_keys = l_i > 0.0
    l_safe = tl.where(has_keys, l_i, 1.0)
    o = acc / l_safe[:, None]
    if SPLIT:
        lse = tl.where(has_keys, m_i + tl.log2(l_safe), float("-inf"))
        part = (pid_s * Hq + h) * N + tok  # [splits, Hq, N]: one slot per (head, token)
        tl.store(PartOut + part[:, None] * D + offs_d[None, :], o, mask=q_mask)
        tl.store(PartLse + part, lse, mask=row_ok)
    else:
        out_ptrs = Out + h[:, None] * stride_oh + tok[:, None] * stride_ot + offs_d[None, :]
        tl.store(out_ptrs, o.to(Out.dtype.element_ty), mask=q_mask)


@_jit
def _ragged_attention_combine(
    PartOut,  # fp32 [splits, Hq, N, D] contiguous
    PartLse,  # fp32 [splits, Hq, N] contiguous, log2 domain; -inf for an empty chunk
    Out,  # [1, Hq, N, D] q's dtype, token-major (output)
    Hq,  # int: query heads
    N,  # int: tokens
    D,  # int: head dim
    num_splits,  # int: chunks per row
    stride_oh,
    stride_ot,  # Out strides
    BLOCK_T: tl.constexpr,  # tokens per program
    BLOCK_D: tl.constexpr,  # next power of two >= D
):
    h = tl.program_id(0)
    offs_t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    t_ok = offs_t < N
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    row = h.to(tl.int64) * N + offs_t  # flat [Hq, N] index

    lse_max = tl.full([BLOCK_T], float("-inf"), tl.float32)
    for s in range(num_splits):
        lse = tl.load(PartLse + s * Hq * N + row, mask=t_ok, other=float("-inf"))
        lse_max = tl.maximum(lse_max, lse)
    ref = tl.where(lse_max == float("-inf"), 0.0, lse_max)
    acc = tl.zeros([BLOCK_T, BLOCK_D], tl.float32)
    w_sum = tl.zeros([BLOCK_T], tl.float32)
    for s in range(num_splits):
        part = s * Hq * N + row
        w = tl.exp2(tl.load(PartLse + part, mask=t_ok, other=float("-inf")) - ref)
        o_mask = t_ok[:, None] & d_ok[None, :]
        o = tl.load(PartOut + part[:, None] * D + offs_d[None, :], mask=o_mask, other=0.0)
        acc += w[:, None] * o
        w_sum += w
    out = acc / tl.where(w_sum > 0.0, w_sum, 1.0)[:, None]  # no row, no key: 0
    out_ptrs = Out + h.to(tl.int64) * stride_oh + offs_t[:, None].to(tl.int64) * stride_ot
    tl.store(
        out_ptrs + offs_d[None, :], out.to(Out.dtype.element_ty), mask=t_ok[:, None] & d_ok[None, :]
    )
