"""``fused``: bass's own Triton flash-attention kernel over the ragged pass, one launch per
layer (two with split-KV); the kernels are in :mod:`bass.ops.fused_kernels`.

Selectable by name on CUDA; not in ``auto`` (``flex`` is the CUDA default). The op
``bass::ragged_attention_fused`` is a ``torch.library.triton_op``, so Inductor sees the
kernels inside a compiled graph; its launch reads no length (the grid comes from shapes),
so a CUDA graph can capture it. In a process started with ``TRITON_INTERPRET=1`` Triton's
interpreter runs the kernels, on CPU tensors too: that is how the CPU tests check them.
Checked in the interpreter only; not yet run on a GPU.
"""

from __future__ import annotations

import torch
from torch.library import wrap_triton

from . import reference
from .fused_kernels import LOG2E, _ragged_attention_combine, _ragged_attention_fwd

try:
    import triton
except ImportError:  # the op stays registered; the implementation reports unavailable
    triton = None

__all__ = ["fused_attention", "num_kv_splits"]

ASSUMED_SMS = 132  # H100 SXM; used where no CUDA device can be asked (CPU/interpreter)
MIN_KEYS_PER_SPLIT = 256  # a split chunk shorter than this costs more than it hides
MAX_SPLITS = 16


def _next_pow2(n: int) -> int:
    p = 1
    while p < n:  # a loop, not int.bit_length: n may be a SymInt under torch.compile
        p *= 2
    return p


def num_kv_splits(programs: int, S: int, sms: int = ASSUMED_SMS) -> int:
    """How many chunks to split each program's keys into (1: the direct path).

    ``programs``: the grid's programs per split; ``S``: the cache capacity. Shapes only,
    never the lengths, so the choice needs no host sync and is stable under
    ``torch.compile``. Split only when the programs fill less than one wave of ``sms``
    multiprocessors, into at most ``S // MIN_KEYS_PER_SPLIT`` and ``MAX_SPLITS`` chunks.
    """
    if programs >= sms:
        return 1
    return max(1, min(-(-sms // max(programs, 1)), S // MIN_KEYS_PER_SPLIT, MAX_SPLITS))


def _tiles(M: int, D: int, fp32: bool, interpret: bool) -> tuple[int, int, int, int, int]:
    """BLOCK_M, BLOCK_N, BLOCK_D, num_warps, num_stages for ``M`` query rows per block.

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


def interpreted() -> bool:
    """True when the kernels were defined under TRITON_INTERPRET=1 (it must be set before
    triton is first imported, as the interpreter also replaces triton.language's own
    ``@jit`` helpers)."""
    if triton is None:
        return False
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(_ragged_attention_fwd, InterpretedFunction)


def fused_attention(
    q, k, v, starts, q_lens, kv_lens, scale: float, *, split=None, block_m=None, block_n=None
) -> torch.Tensor:
    """The Triton kernels on one layer (no input checks).

    Args:
        q: ``[1, Hq, N, D]`` float16, bfloat16 or float32 (float64 goes to the reference),
            any strides; ``D <= 256``.
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
    if q.dtype == torch.float64:
        return reference.attention(q, k, v, starts, q_lens, kv_lens, scale)
    _, Hq, N, D = q.shape
    B, Hkv, S, _ = k.shape
    G = int(Hq // Hkv)  # a constexpr: specialise it under torch.compile
    if D > 256:
        raise ValueError(f"impl 'fused' supports head dim D <= 256, got {D}; use impl='reference'")
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
        splits = int(num_kv_splits(Hkv * blocks, S, _num_sms(q.device)))
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
    wrap_triton(_ragged_attention_fwd)[(blocks, Hkv, splits if use_split else 1)](
        q, k, v, starts, q_lens, kv_lens, out, part_out, part_lse,
        scale * LOG2E, B, N, D,
        *q.stride()[1:], *k.stride(), *v.stride(), *out.stride()[1:3],
        G=G, BLOCK_B=_next_pow2(B), SPLIT=use_split, BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=bd,
        UPCAST_DOT=interpret and q.dtype == torch.bfloat16, IEEE_FP32=fp32,
        num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    if use_split:
        block_t = min(16, _next_pow2(N))
        wrap_triton(_ragged_attention_combine)[(Hq, triton.cdiv(N, block_t), 1)](
            part_out, part_lse, out, Hq, N, D, splits, *out.stride()[1:3],
            BLOCK_T=block_t, BLOCK_D=bd, num_warps=4,
        )  # fmt: skip
    return out


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return ASSUMED_SMS


def _op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    starts: torch.Tensor,
    q_lens: torch.Tensor,
    kv_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    return fused_attention(q, k, v, starts, q_lens, kv_lens, scale)


# triton_op (Inductor sees the kernels) wherever they can run: a CUDA build of torch, or
# Triton's interpreter. Elsewhere (CPU-only torch) the same schema is a plain custom op
# that raises on use: triton_op's registration imports torch._inductor, a second of
# import time for an op that cannot run there.
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


def prepare(plan) -> tuple[torch.Tensor, ...]:
    return plan.starts, plan.q_lens, plan.kv_lens


def run(state, q, k, v, scale: float) -> torch.Tensor:
    return torch.ops.bass.ragged_attention_fused(q, k, v, *state, scale)
