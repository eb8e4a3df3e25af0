"""The Triton kernels of the ``fused`` attention implementation (device code only; the
launchers and the ops are in :mod:`bass.ops.triton_fused`).

* ``_ragged_attention_fwd``: the attention kernel (online softmax, fp32 accumulation),
  padded (``[B, Hq, T, D]``) or packed (``PACKED=True``) queries.
* ``_ragged_attention_combine``: merges the partial results of the split-KV path.

Tiling (GQA-aware). One program owns one (row ``b``, KV head, query block). The ``G = Hq //
Hkv`` query heads sharing that KV head are flattened with the query slots into the tile's M
dimension, token-major: ``m = t * G + g`` is query slot ``t`` of query head ``kvh * G + g``.
Each K/V tile is therefore loaded once for all G heads. Token-major (rather than head-major
``g * T + t``) keeps a row's live queries in the first ``q_lens[b] * G`` values of m, so a
query block past them is all padding (the program reads no keys and writes zeros), and
the last live query of a block, which bounds the causal window, is its last m.

Per program the KV axis is walked in tiles of BLOCK_N keys up to ``hi``, the causal limit
of the block's last live query (never past ``kv_lens[b]``), in two stages: whole tiles at
or below the block's first query position need no mask (every query of the block sees
them); the remaining tiles mask ``key <= position`` per query. Keys at or past ``kv_lens[b]``
are never loaded, so a cache from ``torch.empty`` (NaN there) is harmless.

Worked example (the ragged indexing): ``G = 2``, ``T = 3``, ``q_lens[b] = 2``,
``kv_lens[b] = 6``. The queries sit at positions ``kv_len - q_len + t = 4, 5``::

    m        0    1    2    3    4    5
    (t, g)  (0,0)(0,1)(1,0)(1,1)(2,0)(2,1)
    pos      4    4    5    5    -    -     (t = 2 >= q_len: padding, output 0)

With BLOCK_M = 16 there is one query block; its last live query has position 5, so
``hi = 6`` keys are read; keys 0..4 are visible to every query (the unmasked stage, had
they filled a whole tile) and key 5 only to m = 2, 3 (the masked stage).

Split-KV (flash-decoding). With few programs (small B * Hkv * query blocks) and long
caches the GPU would idle, so a third grid axis splits each program's key range
``[0, hi)`` into ``splits`` chunks of whole tiles (``ceil(ceil(hi / BLOCK_N) / splits)``
tiles each, from the row's own ``hi``, so short rows leave trailing chunks empty). Each
program writes its normalised partial output and log-sum-exp (base 2) to fp32 scratch;
``_ragged_attention_combine`` rescales and sums them (an empty chunk has lse ``-inf``
and weight 0). :func:`num_kv_splits` picks ``splits`` from shapes and the SM count only,
so the choice is compile-safe and never syncs.

Packed layout (``PACKED=True``). Queries and output are ``[1, Hq, N, D]`` (the output
token-major) and row ``b`` owns tokens ``cu[b] .. cu[b+1] - 1``; the tiling within a row
is the one above, with query slot ``t`` at token ``cu[b] + t``. Grid axis 0 walks the
query blocks of the whole pass instead of (row, block) pairs, as vLLM's unified attention
does: row ``b``'s blocks start at ``start_b = G * cu[b] // BLOCK_M + b``, which grows by
at least the ``cdiv(G * q_len_b, BLOCK_M)`` blocks the row needs, so
``G * N // BLOCK_M + B`` programs per KV head cover every row whatever the lengths (the
grid depends on shapes only: a CUDA graph can capture the launch). A program finds its
row as the last ``b`` with ``start_b <= block``; blocks past its row's queries, or past
``cu[B]``, read nothing and write nothing. Worked example: ``G = 2``, ``BLOCK_M = 16``,
``cu = [0, 3, 3, 12]``: starts ``0, 1, 2, 4`` (the last one is ``B``'s, the end), so
block 0 is row 0 (its 6 query rows), block 1 is row 1 (no query: empty) and blocks 2-3
are row 2 (18 query rows: two blocks); ``G * N // 16 + B = 4`` programs. The direct path
stores only a row's own tokens (the next slots are the next row's) and the output starts
zeroed for the padding tokens; the split path's partials are indexed by (head, token)
and the combine kernel runs as one row of ``N`` tokens of which ``cu[B]`` are live.

Dtypes: float16, bfloat16 and float32 run in the kernels (float32 dots in IEEE fp32,
not TF32, to match the reference); float64 is delegated to the reference (no fp64
tensor-core attention is worth having).
"""

from __future__ import annotations

try:
    import triton
    import triton.language as tl
except ImportError:  # the launchers report the implementation unavailable
    triton = tl = None

LOG2E = 1.4426950408889634  # scores are kept in the log2 domain (exp2 is the fast path)


def _jit(fn):
    return fn if triton is None else triton.jit(fn)


@_jit
def _ragged_attention_fwd(
    Q,  # [B, Hq, T, D]
    K,  # [B, Hkv, S, D]
    V,  # [B, Hkv, S, D]
    q_lens,  # int32 [B] (padded layout; unused when PACKED)
    kv_lens,  # int32 [B]
    cu_q_lens,  # int32 [B+1] (PACKED: row b's tokens are cu[b]..cu[b+1]-1; else unused)
    Out,  # [B, Hq, T, D] q's dtype, strides below, last dim contiguous (output; direct path)
    PartOut,  # fp32 [splits, B, Hq, T, D] contiguous (output; split path only)
    PartLse,  # fp32 [splits, B, Hq, T] contiguous, log2 domain (output; split path only)
    qk_scale,  # float: scale * log2(e)
    B,  # int: rows
    Hkv,  # int: KV heads
    T,  # int: query slots per row (padded); PACKED: N, the pass's tokens
    D,  # int: head dim
    stride_qb, stride_qh, stride_qt, stride_qd,  # Q strides (PACKED: stride_qb = 0)
    stride_kb, stride_kh, stride_ks, stride_kd,  # K strides
    stride_vb, stride_vh, stride_vs, stride_vd,  # V strides
    stride_ob, stride_oh, stride_ot,  # Out strides (PACKED: 0, D, Hq * D: token-major)
    G: tl.constexpr,  # query heads per KV head
    PACKED: tl.constexpr,  # packed layout: Q/Out are [1, Hq, N, D], rows from cu_q_lens
    BLOCK_B: tl.constexpr,  # PACKED: next power of two >= B + 1 (else 1)
    SPLIT: tl.constexpr,  # False: write Out; True: write PartOut/PartLse (grid axis 2)
    BLOCK_M: tl.constexpr,  # query rows (m = t * G + g) per program
    BLOCK_N: tl.constexpr,  # keys per tile
    BLOCK_D: tl.constexpr,  # next power of two >= D (>= 16)
    UPCAST_DOT: tl.constexpr,  # dots in fp32 (interpreter: Triton 3.6 mis-multiplies bf16)
    IEEE_FP32: tl.constexpr,  # fp32 inputs: exact fp32 dots, not TF32 (as the reference)
):  # fmt: skip
    pid_s = tl.program_id(2)  # KV split (0 on the direct path)
    num_splits = tl.num_programs(2)
    if PACKED:
        # 0) axis 0 walks the query blocks of the whole pass: row b's blocks start at
        # start_b = G * cu[b] // BLOCK_M + b (strictly increasing, and at least
        # cdiv(G * q_len_b, BLOCK_M) apart), so the program's row is the last b with
        # start_b <= its block; a block past row b's queries (or past every row) is
        # all padding and reads nothing
        pid_blk = tl.program_id(0)
        kvh = tl.program_id(1).to(tl.int64)
        idx = tl.arange(0, BLOCK_B)
        in_cu = idx <= B
        cu = tl.load(cu_q_lens + idx, mask=in_cu, other=0)
        starts = (cu * G) // BLOCK_M + idx
        b = tl.sum(((starts <= pid_blk) & in_cu).to(tl.int32), 0) - 1  # 0..B (B: no row)
        has_row = b < B
        b = tl.minimum(b, B - 1)
        q_start = tl.load(cu_q_lens + b)
        q_len = tl.where(has_row, tl.load(cu_q_lens + b + 1) - q_start, 0)
        pid_m = pid_blk - ((q_start * G) // BLOCK_M + b)  # the block within row b
    else:
        pid_bh = tl.program_id(0)  # b * Hkv + kv head
        pid_m = tl.program_id(1)  # query block
        b = pid_bh // Hkv
        kvh = (pid_bh % Hkv).to(tl.int64)
        q_start = 0
        q_len = tl.load(q_lens + b)
    kv_len = tl.load(kv_lens + b)
    b = b.to(tl.int64)  # offsets into large caches overflow int32
    Hq = Hkv * G

    # 1) this block's query rows, token-major: m = t * G + g
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    t = offs_m // G
    h = kvh * G + offs_m % G  # query head of each row
    row_ok = t < q_len
    pos = kv_len - q_len + t  # absolute position of each query
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D

    # 2) the keys this program reads, [lo, end): the block's causal window [0, hi) cut
    # into num_splits chunks of whole tiles; an all-padding block gets hi = 0.
    t_first = pid_m * BLOCK_M // G
    t_last = tl.minimum(((pid_m + 1) * BLOCK_M - 1) // G, q_len - 1)
    hi = tl.where(t_first < q_len, kv_len - q_len + t_last + 1, 0)
    tiles_per_split = tl.cdiv(tl.cdiv(hi, BLOCK_N), num_splits)
    lo = pid_s * tiles_per_split * BLOCK_N
    end = tl.minimum(lo + tiles_per_split * BLOCK_N, hi)
    # keys < kv_len - q_len + t_first + 1 are visible to every query of the block
    full = tl.minimum(end, kv_len - q_len + t_first + 1)
    mid = lo + tl.maximum(full - lo, 0) // BLOCK_N * BLOCK_N  # end of the unmasked tiles

    tok = q_start + t  # the query's slot in Q and Out (its token, when PACKED)
    q_ptrs = Q + b * stride_qb + h[:, None] * stride_qh + tok[:, None] * stride_qt
    q_mask = row_ok[:, None] & d_ok[None, :]
    q = tl.load(q_ptrs + offs_d[None, :] * stride_qd, mask=q_mask, other=0.0)
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

    # 4) epilogue: normalise; padding rows and rows that saw no key give 0
    has_keys = l_i > 0.0
    l_safe = tl.where(has_keys, l_i, 1.0)
    o = tl.where(row_ok[:, None], acc / l_safe[:, None], 0.0)
    if SPLIT:
        lse = tl.where(has_keys, m_i + tl.log2(l_safe), float("-inf"))
        if PACKED:  # partials are [splits, 1, Hq, N]: one slot per (head, token)
            part = pid_s * Hq * T + h * T + tok
        else:  # [splits, B, Hq, T]
            part = pid_s * B * Hq * T + (b * Hq + h) * T + t
        tl.store(PartOut + part[:, None] * D + offs_d[None, :], o, mask=row_ok[:, None] & d_ok)
        tl.store(PartLse + part, lse, mask=row_ok)
    else:
        out_ptrs = Out + b * stride_ob + h[:, None] * stride_oh + tok[:, None] * stride_ot
        if PACKED:  # only this row's tokens: the slots after them are the next row's
            store_ok = row_ok[:, None] & d_ok[None, :]
        else:  # the row's padding slots too (they get 0)
            store_ok = (t < T)[:, None] & d_ok[None, :]
        tl.store(out_ptrs + offs_d[None, :], o.to(Out.dtype.element_ty), mask=store_ok)


@_jit
def _ragged_attention_combine(
    PartOut,  # fp32 [splits, B, Hq, T, D] contiguous
    PartLse,  # fp32 [splits, B, Hq, T] contiguous, log2 domain; -inf for an empty chunk
    q_lens,  # int32 [B] (packed: B = 1, T = N and this points at cu_q_lens[B])
    Out,  # [B, Hq, T, D] q's dtype, strides below, last dim contiguous (output)
    B,  # int: rows
    Hq,  # int: query heads
    T,  # int: query slots per row
    D,  # int: head dim
    num_splits,  # int: chunks per row
    stride_ob,
    stride_oh,
    stride_ot,  # Out strides
    BLOCK_T: tl.constexpr,  # query slots per program
    BLOCK_D: tl.constexpr,  # next power of two >= D
):
    pid_bh = tl.program_id(0)  # b * Hq + query head
    pid_t = tl.program_id(1)
    b = pid_bh // Hq
    q_len = tl.load(q_lens + b)
    offs_t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    row_ok = offs_t < q_len
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    row = pid_bh.to(tl.int64) * T + offs_t  # flat [B, Hq, T] index
    split_stride = B * Hq * T  # elements per split in PartLse

    lse_max = tl.full([BLOCK_T], float("-inf"), tl.float32)
    for s in range(num_splits):
        lse = tl.load(PartLse + s * split_stride + row, mask=row_ok, other=float("-inf"))
        lse_max = tl.maximum(lse_max, lse)
    ref = tl.where(lse_max == float("-inf"), 0.0, lse_max)
    acc = tl.zeros([BLOCK_T, BLOCK_D], tl.float32)
    w_sum = tl.zeros([BLOCK_T], tl.float32)
    for s in range(num_splits):
        part = s * split_stride + row
        w = tl.exp2(tl.load(PartLse + part, mask=row_ok, other=float("-inf")) - ref)
        o_mask = row_ok[:, None] & d_ok[None, :]
        o = tl.load(PartOut + part[:, None] * D + offs_d[None, :], mask=o_mask, other=0.0)
        acc += w[:, None] * o
        w_sum += w
    out = tl.where(row_ok[:, None], acc / tl.where(w_sum > 0.0, w_sum, 1.0)[:, None], 0.0)
    out_base = Out + b.to(tl.int64) * stride_ob + (pid_bh % Hq).to(tl.int64) * stride_oh
    out_ptrs = out_base + offs_t[:, None].to(tl.int64) * stride_ot + offs_d[None, :]
    tl.store(out_ptrs, out.to(Out.dtype.element_ty), mask=(offs_t < T)[:, None] & d_ok[None, :])
