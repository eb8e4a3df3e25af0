"""The ``fused`` implementation of ``bass::ragged_attention``: Triton flash-attention kernels.

What is here:

* :func:`fused_attention`: the host launcher (picks tiles and the split count from shapes
  only, allocates, launches). It launches the compiled kernels on CUDA tensors; in a
  process started with ``TRITON_INTERPRET=1`` Triton's interpreter runs them, also on CPU
  tensors (slow; that is how the CPU tests check them).
* :func:`num_kv_splits`: the split-KV rule, metadata only.
* the op ``bass::ragged_attention_fused`` (a ``torch.library.triton_op``, so Inductor sees
  the kernels; a stub that raises under a CPU-only torch) and its registration as
  implementation ``fused`` (CUDA, priority 10; unavailable without triton or a GPU).
* :func:`fused_attention_packed`: the same kernels in their ``PACKED`` mode, registered
  as ``impl="fused"`` of ``bass::ragged_attention_packed`` (the layout: see
  :mod:`bass.ops.triton_kernels`, "Packed layout").

Neither has run on a GPU yet (only in Triton's interpreter), so neither is in ``auto``.

The kernels themselves, and how they tile the ragged and packed layouts, are in
:mod:`bass.ops.triton_kernels`.
"""

from __future__ import annotations

import torch
from torch.library import wrap_triton

from . import Implementation, reference, register_implementation
from .packed import reference_attention_packed, register_packed_implementation
from .triton_kernels import LOG2E, _ragged_attention_combine, _ragged_attention_fwd

try:
    import triton
except ImportError:  # the op stays registered; the implementation reports unavailable
    triton = None

__all__ = ["fused_attention", "fused_attention_packed", "num_kv_splits"]

ASSUMED_SMS = 132  # H100 SXM; used where no CUDA device can be asked (CPU/interpreter)
MIN_KEYS_PER_SPLIT = 256  # a split chunk shorter than this costs more than it hides
MAX_SPLITS = 16


# --------------------------------------------------------------------------- host side


def _next_pow2(n: int) -> int:
    p = 1
    while p < n:  # a loop, not int.bit_length: n may be a SymInt under torch.compile
        p *= 2
    return p


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return ASSUMED_SMS


def num_kv_splits(programs: int, S: int, sms: int = ASSUMED_SMS) -> int:
    """How many chunks to split each program's keys into (1: the direct path).

    ``programs`` is ``B * Hkv * query blocks``, ``S`` the cache capacity (``k.shape[2]``):
    shapes only, never the lengths, so the choice needs no host sync and is stable under
    ``torch.compile``. Split only when the programs fill less than one wave of ``sms``
    multiprocessors, into at most ``S // MIN_KEYS_PER_SPLIT`` and ``MAX_SPLITS`` chunks.
    """
    if programs >= sms:
        return 1
    return max(1, min(-(-sms // max(programs, 1)), S // MIN_KEYS_PER_SPLIT, MAX_SPLITS))


def _tiles(M: int, D: int, fp32: bool, interpret: bool) -> tuple[int, int, int, int, int]:
    """BLOCK_M, BLOCK_N, BLOCK_D, num_warps, num_stages for ``M = G * T`` query rows.

    Chosen so that sm_90 builds (Triton 3.6, checked with cuobjdump -res-usage) do not
    spill registers; fp32 inputs use exact fp32 (FMA) dots, which need smaller tiles.
    """
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


def _interpreted() -> bool:
    """True when the kernels were defined under TRITON_INTERPRET=1 (Triton's interpreter;
    it must be set before triton is first imported, as the interpreter also replaces
    triton.language's own ``@jit`` helpers)."""
    if triton is None:
        return False
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(_ragged_attention_fwd, InterpretedFunction)


def _launchable(q: torch.Tensor) -> bool:
    """Whether the kernels run in Triton's interpreter; raise if they cannot run on q."""
    if q.shape[-1] > 256:
        raise ValueError(
            f"impl 'fused' supports head dim D <= 256, got {q.shape[-1]}; use impl='reference'"
        )
    interpret = _interpreted()
    if q.device.type == "cpu" and not interpret:
        raise RuntimeError(
            f"impl 'fused' runs on CUDA tensors, got {q.device.type}; to run its kernels on "
            "CPU (slowly) start Python with TRITON_INTERPRET=1 set before triton is imported"
        )
    return interpret


def _scratch(use_split: bool, lse_shape: tuple, D: int, device) -> tuple[torch.Tensor, ...]:
    """The split path's fp32 partial outputs ``[*lse_shape, D]`` and log-sum-exps
    ``lse_shape``; on the direct path (the kernel writes out itself) empty placeholders."""
    if not use_split:
        empty = torch.empty(0, dtype=torch.float32, device=device)
        return empty, empty
    part_out = torch.empty((*lse_shape, D), dtype=torch.float32, device=device)
    return part_out, torch.empty(lse_shape, dtype=torch.float32, device=device)


def fused_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_lens: torch.Tensor,
    kv_lens: torch.Tensor,
    scale: float,
    *,
    split: int | None = None,
    block_m: int | None = None,
    block_n: int | None = None,
) -> torch.Tensor:
    """``bass::ragged_attention`` through the Triton kernels (no input checks).

    Args:
        q: ``[B, Hq, T, D]`` float16, bfloat16 or float32 (float64 goes to the reference),
            any strides; ``D <= 256``.
        k, v: ``[B, Hkv, S, D]``, q's dtype, any strides; ``Hq % Hkv == 0``.
        q_lens, kv_lens: int32 ``[B]``, as in ``bass.ops.ragged_attention``.
        scale: softmax scale.
        split: ``None`` picks from shapes (:func:`num_kv_splits`); ``0`` forces the direct
            path; ``n >= 1`` forces the split-KV path with ``n`` chunks (``1`` still runs
            the partials and the combine kernel).
        block_m, block_n: tile overrides (tests); powers of two >= 16.

    Returns:
        ``[B, Hq, T, D]`` contiguous, q's dtype. CUDA tensors run the compiled kernels
        (through ``wrap_triton``, so it traces). In a process started with
        ``TRITON_INTERPRET=1`` the kernels run in Triton's interpreter, on CPU tensors too.
    """
    if triton is None:
        raise RuntimeError("ragged_attention impl 'fused' needs triton: pip install triton")
    if q.dtype == torch.float64:
        return reference.ragged_attention(q, k, v, q_lens, kv_lens, scale).contiguous()
    B, Hq, T, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    G = int(Hq // Hkv)  # a constexpr: specialise it under torch.compile
    interpret = _launchable(q)
    bm, bn, bd, num_warps, num_stages = _tiles(G * T, D, q.dtype == torch.float32, interpret)
    bm, bn = block_m or bm, block_n or bn
    # the kernels index the lengths as flat [B] arrays: a strided or expanded view (e.g.
    # torch.ones(1).expand(B)) passes the op's checks and must be made dense here
    q_lens, kv_lens = q_lens.contiguous(), kv_lens.contiguous()
    out = torch.empty((B, Hq, T, D), dtype=q.dtype, device=q.device)
    if out.numel() == 0:
        return out
    m_blocks = triton.cdiv(G * T, bm)
    if split is None:
        splits = int(num_kv_splits(B * Hkv * m_blocks, S, _num_sms(q.device)))
        use_split = splits > 1
    else:
        splits, use_split = max(int(split), 1), split >= 1
    fwd, combine = _ragged_attention_fwd, _ragged_attention_combine
    part_out, part_lse = _scratch(use_split, (splits, B, Hq, T), D, q.device)
    wrap_triton(fwd)[(B * Hkv, m_blocks, splits if use_split else 1)](
        q, k, v, q_lens, kv_lens, q_lens, out, part_out, part_lse,
        scale * LOG2E, B, Hkv, T, D,
        *q.stride(), *k.stride(), *v.stride(), *out.stride()[:3],
        G=G,
        PACKED=False,
        BLOCK_B=1,
        SPLIT=use_split,
        BLOCK_M=bm,
        BLOCK_N=bn,
        BLOCK_D=bd,
        UPCAST_DOT=interpret and q.dtype == torch.bfloat16,
        IEEE_FP32=q.dtype == torch.float32,
        num_warps=num_warps,
        num_stages=num_stages,
    )  # fmt: skip
    if use_split:
        block_t = min(16, _next_pow2(T))
        wrap_triton(combine)[(B * Hq, triton.cdiv(T, block_t), 1)](
            part_out, part_lse, q_lens, out, B, Hq, T, D, splits, *out.stride()[:3],
            BLOCK_T=block_t, BLOCK_D=bd, num_warps=4,
        )  # fmt: skip
    return out


def fused_attention_packed(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_q_lens: torch.Tensor,
    kv_lens: torch.Tensor,
    scale: float,
    *,
    split: int | None = None,
    block_m: int | None = None,
    block_n: int | None = None,
) -> torch.Tensor:
    """``bass::ragged_attention_packed`` through the same Triton kernels (no input checks).

    The kernels in their ``PACKED`` mode: grid axis 0 walks the query blocks of the whole
    pass, ``G * N // BLOCK_M + B`` of them (an upper bound on the blocks the rows need,
    from shapes only, so the launch never reads the lengths and a CUDA graph can capture
    it); each block finds its row in ``cu_q_lens`` and blocks left over read nothing.

    Args:
        q: ``[1, Hq, N, D]`` float16, bfloat16 or float32 (float64 goes to the packed
            reference), any strides; ``D <= 256``.
        k, v: ``[B, Hkv, S, D]``, q's dtype, any strides; ``Hq % Hkv == 0``.
        cu_q_lens: int32 ``[B+1]``; kv_lens: int32 ``[B]``, as in
            ``bass.ops.ragged_attention_packed``.
        scale: softmax scale.
        split, block_m, block_n: as in :func:`fused_attention`.

    Returns:
        ``[1, Hq, N, D]`` in q's dtype, stored token-major; tokens past ``cu_q_lens[B]``
        are 0. CUDA tensors run the compiled kernels; in a process started with
        ``TRITON_INTERPRET=1`` Triton's interpreter runs them, on CPU tensors too. Never
        run on a GPU yet: ``auto`` does not pick it.
    """
    if triton is None:
        raise RuntimeError("ragged_attention_packed impl 'fused' needs triton: pip install triton")
    if q.dtype == torch.float64:
        return reference_attention_packed(q, k, v, cu_q_lens, kv_lens, scale)
    _, Hq, N, D = q.shape
    B, Hkv, S, _ = k.shape
    G = int(Hq // Hkv)
    interpret = _launchable(q)
    # tiles for the average row's G * N / B query rows (shapes only)
    rows_per_block = G * -(-N // max(B, 1))
    bm, bn, bd, num_warps, num_stages = _tiles(
        rows_per_block, D, q.dtype == torch.float32, interpret
    )
    bm, bn = block_m or bm, block_n or bn
    cu_q_lens, kv_lens = cu_q_lens.contiguous(), kv_lens.contiguous()
    blocks = G * N // bm + B  # >= sum over rows of cdiv(G * q_len_b, bm): see the kernel
    if split is None:
        splits = int(num_kv_splits(Hkv * blocks, S, _num_sms(q.device)))
        use_split = splits > 1
    else:
        splits, use_split = max(int(split), 1), split >= 1
    # token-major: [N, Hq, D] storage. The direct path writes only the rows' tokens, so
    # padding tokens need their zeros up front; the combine kernel writes every token.
    alloc = torch.empty if use_split else torch.zeros
    out = alloc((1, N, Hq, D), dtype=q.dtype, device=q.device).transpose(1, 2)
    if out.numel() == 0 or B == 0:
        return out.zero_()
    out_strides = (0, out.stride(1), out.stride(2))  # (row, head, token)
    part_out, part_lse = _scratch(use_split, (splits, 1, Hq, N), D, q.device)
    wrap_triton(_ragged_attention_fwd)[(blocks, Hkv, splits if use_split else 1)](
        q, k, v, kv_lens, kv_lens, cu_q_lens, out, part_out, part_lse,
        scale * LOG2E, B, Hkv, N, D,
        0, *q.stride()[1:], *k.stride(), *v.stride(), *out_strides,
        G=G,
        PACKED=True,
        BLOCK_B=_next_pow2(B + 1),
        SPLIT=use_split,
        BLOCK_M=bm,
        BLOCK_N=bn,
        BLOCK_D=bd,
        UPCAST_DOT=interpret and q.dtype == torch.bfloat16,
        IEEE_FP32=q.dtype == torch.float32,
        num_warps=num_warps,
        num_stages=num_stages,
    )  # fmt: skip
    if use_split:  # as one row of N tokens whose length is cu_q_lens[B]
        block_t = min(16, _next_pow2(N))
        wrap_triton(_ragged_attention_combine)[(Hq, triton.cdiv(N, block_t), 1)](
            part_out, part_lse, cu_q_lens[B:], out, 1, Hq, N, D, splits, *out_strides,
            BLOCK_T=block_t, BLOCK_D=bd, num_warps=4,
        )  # fmt: skip
    return out


# --------------------------------------------------------------------------- the op


def _ragged_attention_fused(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_lens: torch.Tensor,
    kv_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    return fused_attention(q, k, v, q_lens, kv_lens, scale)


# triton_op (Inductor sees the kernels) wherever the kernels can run: a CUDA build of
# torch, or Triton's interpreter. Elsewhere (CPU-only torch) the same schema is a plain
# custom op that raises on use: triton_op's registration imports torch._inductor, a
# second of import time for an op that cannot run there.
_GPU_TORCH = torch.version.cuda is not None or getattr(torch.version, "hip", None) is not None
if triton is not None and (_GPU_TORCH or _interpreted()):
    torch.library.triton_op("bass::ragged_attention_fused", mutates_args=())(
        _ragged_attention_fused
    )
else:
    torch.library.custom_op("bass::ragged_attention_fused", mutates_args=())(
        _ragged_attention_fused
    ).register_fake(lambda q, k, v, q_lens, kv_lens, scale: q.new_empty(q.shape))


def _available() -> bool:
    return triton is not None and torch.cuda.is_available()


register_implementation(
    Implementation(
        name="fused",
        op=torch.ops.bass.ragged_attention_fused.default,
        devices=("cuda",),
        available=_available,
        priority=10,
        # Not in "auto" until it has passed the CUDA tests on a GPU (none has run yet):
        # a GPU user gets the tested reference unless they ask for this by name.
        in_auto=False,
        description=(
            "Triton flash-attention kernel over the ragged layout (GQA-aware, split-KV)"
            if triton is not None
            else "Triton flash-attention kernel; unavailable: triton not installed"
        ),
    )
)
register_packed_implementation(
    Implementation(
        name="fused",
        op=fused_attention_packed,
        devices=("cuda",),
        available=_available,
        priority=10,
        # Checked in Triton's interpreter only: not in "auto" until it passes on a GPU.
        in_auto=False,
        description=(
            "the same Triton kernels over the packed layout (a grid from shapes only)"
            if triton is not None
            else "Triton flash-attention kernel; unavailable: triton not installed"
        ),
    )
)
