"""``fused``: bass's Triton flash-attention kernel over the ragged pass (one launch per layer,
two with split-KV) and its op ``bass::ragged_attention_fused``; ``TRITON_INTERPRET=1`` runs
it on CPU tensors. Design: docs/reference/ops.md, "fused"."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch.library import wrap_triton

from . import reference

try:
    import triton
    import triton.language as tl
except ImportError:  # the op stays registered; the implementation reports unavailable
    triton = tl = None

__all__ = ["fused_attention", "num_kv_splits"]

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
            # fp32 again: Inductor may pass the scale as fp64 (docs: "fused")
            qk = (qk * qk_scale).to(tl.float32)
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


ASSUMED_SMS = 132  # H100 SXM; used where no CUDA device can be asked (CPU/interpreter)
MIN_KEYS_PER_SPLIT = 256  # a split chunk shorter than this costs more than it hides
MAX_SPLITS = 16


def _next_pow2(n: int) -> int:
    p = 1
    while p < n:  # a loop, not int.bit_length: n may be a SymInt under torch.compile
        p *= 2
    return p


def num_kv_splits(programs: int, S: int, sms: int = ASSUMED_SMS) -> int:
    """How many chunks to split each program's keys into (1: the direct path), from the
    grid's ``programs`` per split and the cache capacity ``S`` (shapes only): split only
    below one wave of ``sms`` multiprocessors, into at most ``S // MIN_KEYS_PER_SPLIT`` and
    ``MAX_SPLITS`` chunks."""
    if programs >= sms:
        return 1
    return max(1, min(-(-sms // max(programs, 1)), S // MIN_KEYS_PER_SPLIT, MAX_SPLITS))


def _tiles(M: int, D: int, fp32: bool, interpret: bool) -> tuple[int, int, int, int, int]:
    """BLOCK_M, BLOCK_N, BLOCK_D, num_warps, num_stages for ``M`` query rows per block
    (sized for no register spills on sm_90: docs/reference/ops.md, "fused")."""
    block_d = max(16, _next_pow2(D))  # tl.dot needs every dimension >= 16
    if fp32:
        block_m, block_n, num_warps, num_stages = 16, 32, 8, 2
    else:
        block_m = min(64, max(16, _next_pow2(M)))
        block_n = 64 if block_d <= 128 else 32
        num_warps = 4 if block_m * block_d < 64 * 128 else 8
        num_stages = 3 if block_d <= 128 else 2
    if interpret:  # small tiles keep the numpy interpreter fast and exercise the loops
        block_n = 16
    return block_m, block_n, block_d, num_warps, num_stages


def interpreted() -> bool:
    """True when the kernels were defined under TRITON_INTERPRET=1 (set before triton's
    first import)."""
    if triton is None:
        return False
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(_ragged_attention_fwd, InterpretedFunction)


def _launch(kernel):
    """``wrap_triton(kernel)`` (traced into compiled graphs), or under TRITON_INTERPRET=1,
    which torch 2.11 refuses there, the kernel itself (the same in eager calls)."""
    try:
        return wrap_triton(kernel)
    except RuntimeError:
        if not interpreted():
            raise
        return kernel


@contextlib.contextmanager
def _numpy_2_4_hint(interpret: bool) -> Iterator[None]:
    """Triton 3.6's interpreter fails on NumPy >= 2.4 (triton-lang/triton#9171, fixed after
    3.6) with an error that names neither: explained."""
    try:
        yield
    except Exception as exc:
        if not (interpret and "only 0-dimensional arrays" in str(exc)):
            raise
        import numpy

        raise RuntimeError(
            f"Triton {triton.__version__}'s interpreter (TRITON_INTERPRET=1) cannot run the "
            f"'fused' kernels with NumPy {numpy.__version__}: it converts a 1-element array "
            "to an int, which NumPy >= 2.4 refuses (triton-lang/triton#9171); install "
            "'numpy<2.4', or a Triton with the fix, to run them on a CPU"
        ) from exc


def fused_attention(
    q, k, v, starts, q_lens, kv_lens, scale: float, *, split=None, block_m=None, block_n=None
) -> torch.Tensor:
    """The Triton kernels on one layer (no input checks).

    Args:
        q: ``[1, Hq, N, D]`` float16, bfloat16 or float32, any strides, ``D <= 256``
            (float64, or ``D > 256``, goes to the reference).
        k, v: ``[B, Hkv, S, D]``, q's dtype, any strides; ``Hq % Hkv == 0``.
        starts, q_lens, kv_lens: int32 ``[B]`` (the layout of :mod:`bass.ops.reference`).
        scale: softmax scale.
        split: ``None`` picks from shapes (:func:`num_kv_splits`); ``0`` forces the direct
            path; ``n >= 1`` the split-KV path with ``n`` chunks (``1`` still runs the
            partials and the combine kernel).
        block_m, block_n: tile overrides (tests); powers of two >= 16.

    Returns:
        ``[1, Hq, N, D]`` in q's dtype, token-major; tokens of no row are 0.
    """
    if triton is None:
        raise RuntimeError("ragged attention impl 'fused' needs triton: pip install triton")
    _, Hq, N, D = q.shape
    if q.dtype == torch.float64 or D > 256:  # beyond the kernels' tiles (Gemma 4's 512)
        return reference.attention(q, k, v, starts, q_lens, kv_lens, scale)
    B, Hkv, S, _ = k.shape
    G = int(Hq // Hkv)  # a constexpr: specialise it under torch.compile
    interpret = interpreted()
    if q.device.type == "cpu" and not interpret:
        raise RuntimeError(
            "impl 'fused' runs on CUDA tensors, got cpu; to run its kernels on CPU (slowly) "
            "start Python with TRITON_INTERPRET=1 set before triton is imported"
        )
    # tiles for the average row's G * N / B query rows (shapes only)
    fp32 = q.dtype == torch.float32
    bm, bn, bd, num_warps, num_stages = _tiles(G * -(-N // max(B, 1)), D, fp32, interpret)
    bm, bn = block_m or bm, block_n or bn
    # the kernels index the lengths as flat [B] arrays: a strided or expanded view must be
    # made dense here
    starts, q_lens, kv_lens = starts.contiguous(), q_lens.contiguous(), kv_lens.contiguous()
    blocks = G * N // bm + B  # >= every row's first block + its blocks: see the kernels
    if split is None:
        props = torch.cuda.get_device_properties(q.device) if q.is_cuda else None
        sms = props.multi_processor_count if props is not None else ASSUMED_SMS
        splits = int(num_kv_splits(Hkv * blocks, S, sms))
        use_split = splits > 1
    else:
        splits, use_split = max(int(split), 1), split >= 1
    # token-major [N, Hq, D] storage; the direct path writes only the rows' tokens, so
    # padding tokens need their zeros up front; the combine kernel writes every token
    alloc = torch.empty if use_split else torch.zeros
    out = alloc((1, N, Hq, D), dtype=q.dtype, device=q.device).transpose(1, 2)
    if out.numel() == 0 or B == 0:
        return out.zero_()
    f32 = dict(dtype=torch.float32, device=q.device)
    part_out = torch.zeros((splits, Hq, N, D) if use_split else 0, **f32)
    part_lse = torch.full((splits, Hq, N) if use_split else (0,), float("-inf"), **f32)
    with _numpy_2_4_hint(interpret):  # the kernels, on the device or in the interpreter
        _launch(_ragged_attention_fwd)[(blocks, Hkv, splits if use_split else 1)](
            q, k, v, starts, q_lens, kv_lens, out, part_out, part_lse,
            scale * LOG2E, B, N, D,
            *q.stride()[1:], *k.stride(), *v.stride(), *out.stride()[1:3],
            G=G, BLOCK_B=_next_pow2(B), SPLIT=use_split, BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=bd,
            UPCAST_DOT=interpret and q.dtype == torch.bfloat16, IEEE_FP32=fp32,
            num_warps=num_warps, num_stages=num_stages,
        )  # fmt: skip
        if use_split:
            block_t = min(16, _next_pow2(N))
            _launch(_ragged_attention_combine)[(Hq, triton.cdiv(N, block_t), 1)](
                part_out, part_lse, out, Hq, N, D, splits, *out.stride()[1:3],
                BLOCK_T=block_t, BLOCK_D=bd, num_warps=4,
            )  # fmt: skip
    return out


def _op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, starts: torch.Tensor,
        q_lens: torch.Tensor, kv_lens: torch.Tensor, scale: float) -> torch.Tensor:  # fmt: skip
    return fused_attention(q, k, v, starts, q_lens, kv_lens, scale)


# triton_op wherever the kernels can run, else a plain custom op that raises on use (why:
# docs/reference/ops.md, "fused")
_GPU_TORCH = torch.version.cuda is not None or getattr(torch.version, "hip", None) is not None
if triton is not None and (_GPU_TORCH or interpreted()):
    torch.library.triton_op("bass::ragged_attention_fused", mutates_args=())(_op)
else:
    torch.library.custom_op("bass::ragged_attention_fused", mutates_args=())(_op).register_fake(
        lambda q, *args: q.new_empty(q.shape[0], q.shape[2], q.shape[1], q.shape[3]).transpose(1, 2)
    )


def unavailable() -> str | None:
    """Why ``fused`` cannot run in this process (``None``: it can)."""
    if triton is None:
        return "triton is not installed"
    if not (torch.cuda.is_available() or interpreted()):
        return "no CUDA device (and not in Triton's interpreter)"
    return None
