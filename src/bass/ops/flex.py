"""``flex``: PyTorch FlexAttention over the whole ragged pass, one launch per layer, its block
mask built once per pass from the lengths. Design: docs/reference/ops.md, "flex"; which
inputs run the reference instead: its "One family, one dispatch"."""

from __future__ import annotations

import functools
import types
from typing import NamedTuple

import torch
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from . import reference
from .contract import token_major

BLOCK = 128  # sparse block size for queries and keys: the one flex's kernels are tuned for
# rows of the mask's static-size length table (why static: docs/reference/ops.md, "flex")
TABLE_ROWS = 256


class FlexState(NamedTuple):
    """One pass's FlexAttention metadata, tensors on the pass's device."""

    src: torch.Tensor  # int64 [B, T]: the token row b's slot t reads (padding: its last)
    back: torch.Tensor  # int64 [N]: each token's slot b * T + t; B * T (zeros) for no row
    starts: torch.Tensor  # int32 [B] (the reference fallback)
    q_lens: torch.Tensor  # int32 [B]
    kv_lens: torch.Tensor  # int32 [B]
    table: torch.Tensor  # int32 [2, R >= B]: q_lens, and each row's first query position
    blocks: tuple  # kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices
    block_mask: BlockMask | None  # built once for eager passes
    cap: torch.Tensor | None = None  # float32 0-d: the plan's soft-cap (compiled passes')
    window: torch.Tensor | None = None  # int32 0-d: the plan's sliding window (compiled)


def prepare(plan) -> FlexState:
    """The block mask and the row gather of one pass, from the plan's length tensors (no
    host read)."""
    T, S, N = plan.width, plan.cache_size, plan.num_tokens
    q_lens, kv_lens = plan.q_lens, plan.kv_lens
    ql, kv = q_lens.to(torch.long), kv_lens.to(torch.long)
    dev, B = ql.device, ql.shape[0]
    off = (kv - ql)[:, None]  # [B, 1]
    first = torch.arange(-(-T // BLOCK), device=dev) * BLOCK  # [Qb]: each block's first slot
    live = first < ql[:, None]  # [B, Qb]: blocks holding a query
    last = torch.minimum(first + BLOCK - 1, ql[:, None] - 1)  # the block's last query
    seen = torch.where(live, (off + last) // BLOCK + 1, 0)  # key blocks its last query sees
    full = torch.minimum(torch.where(live, (off + first + 1) // BLOCK, 0), seen)
    j = torch.arange(-(-S // BLOCK), device=dev)  # Inductor's CPU template wants all S
    part_idx = (full[..., None] + j).clamp(max=j.shape[0] - 1)
    blocks = (
        (seen - full).int()[:, None],
        part_idx.int()[:, None],
        full.int()[:, None],
        j.int().expand(B, 1, first.shape[0], j.shape[0]).contiguous(),
    )
    src, back = reference.row_slots(plan.starts, q_lens, T, N)
    table = torch.zeros(2, max(TABLE_ROWS, 1 << (B - 1).bit_length()), dtype=torch.int32,
                        device=dev)  # fmt: skip
    table[0, :B], table[1, :B] = q_lens, kv_lens - q_lens
    torch._dynamo.mark_static(table)
    cap = None if plan.softcap is None else _scalar(float(plan.softcap), dev)
    window = None if plan.window is None else _scalar(int(plan.window), dev)
    state = FlexState(src, back, plan.starts, q_lens, kv_lens, table, blocks, None, cap, window)
    return state._replace(block_mask=_block_mask(state, S)) if plan.kind == "eager" else state


def _block_mask(state: FlexState, S: int) -> BlockMask:
    q_lens, offsets = state.table[0], state.table[1]

    def mask_mod(b, h, q_idx, kv_idx):  # query q_idx of row b sits at offsets[b] + q_idx
        return (q_idx < q_lens[b]) & (kv_idx <= offsets[b] + q_idx)

    return BlockMask.from_kv_blocks(
        *state.blocks,
        BLOCK_SIZE=(BLOCK, BLOCK),
        mask_mod=mask_mod,
        seq_lengths=(state.src.shape[1], S),
        compute_q_blocks=False,  # the transposed index serves only a backward pass
    )


def _call(q, k, v, block_mask, scale, gqa, cap=None, window=None, offsets=None):
    # CUDA: the Triton template by name ("AUTO" found no kernel on an H100; the docs' "flex")
    options = {"BACKEND": "TRITON"} if q.is_cuda else None

    def score_mod(score, b, h, q_idx, kv_idx):  # beyond the contract: the cap (Gemma 2),
        if cap is not None:  # before the mask
            score = torch.tanh(score / cap) * cap
        if window is not None:  # a sliding window: query q_idx of row b sits at offsets[b]
            score = torch.where(offsets[b] + q_idx - kv_idx < window, score, -float("inf"))
        return score

    mod = None if cap is None and window is None else score_mod
    return flex_attention(q, k, v, mod, block_mask, scale=scale, enable_gqa=gqa,
                          kernel_options=options)  # fmt: skip


@functools.lru_cache(maxsize=None, typed=True)  # a cap of 4.0 is no window of 4
def _scalar(value: float | int, device: torch.device) -> torch.Tensor:
    """A soft-cap (float32) or a window (int32) as a 0-d tensor, an input of the flex kernel
    like q: torch 2.13's CPU flex template fails to lower a cap captured as a (symbolic)
    Python float, or as a tensor made inside the graph."""
    dtype = torch.int32 if isinstance(value, int) else torch.float32
    return torch.tensor(value, dtype=dtype, device=device)


@functools.cache
def _compiled(key: tuple):
    """An eager pass's flex kernel: :func:`_call` compiled with dynamic shapes, one code
    object per ``key`` (what a graph specialises on; why: docs/reference/ops.md, "flex")."""
    code = _call.__code__.replace(co_name=f"flex_{abs(hash(key))}")
    return torch.compile(types.FunctionType(code, _call.__globals__), fullgraph=True, dynamic=True)


def supports(q: torch.Tensor) -> bool:
    """Inputs flex runs (the others run the reference; why: the Ops page): not float64, head
    dim >= 16 on CUDA and >= 32 on CPU (tests/ops/test_ops_flex.py keeps checking why)."""
    return takes(q.dtype, q.shape[-1], q.device.type)


def takes(dtype: torch.dtype, head_dim: int, device_type: str) -> bool:
    """:func:`supports` from a model's dtype and head dim, before any pass."""
    return dtype != torch.float64 and head_dim >= (16 if device_type == "cuda" else 32)


def run(state: FlexState, q, k, v, scale: float, softcap: float | None = None,
        window: int | None = None) -> torch.Tensor:  # fmt: skip
    """One layer: one FlexAttention call, plus the gather into rows and back. Beyond the
    ops' contract (bass's attention function passes them): ``softcap`` (Gemma 2), scores
    become ``softcap * tanh(scores / softcap)``; ``window`` (sliding-window layers), a
    query at position ``p`` sees keys ``p - window + 1 .. p`` only; both in a ``score_mod``."""
    _, Hq, N, D = q.shape
    B, Hkv, S, _ = k.shape
    compiling = torch.compiler.is_compiling()  # traced into the caller's graph: one kernel
    # inputs flex does not take, and (traced) a cap or window the plan was not given: the
    # reference
    unplanned = (softcap is not None and state.cap is None) or (
        window is not None and state.window is None
    )
    if not supports(q) or (compiling and unplanned):
        starts, q_lens, kv_lens = state.starts, state.q_lens, state.kv_lens
        return reference.attention(q, k, v, starts, q_lens, kv_lens, scale, softcap, window=window)
    if N == 0 or B == 0:
        return token_major(q, zero=True)
    offsets = state.table[1]
    if compiling:
        # one 4-D gather: the CPU template needs a [B, Hq, T, D] buffer (docs: "flex")
        qr = q[0][:, state.src].transpose(0, 1).contiguous()
        cap = None if softcap is None else state.cap  # the layer's, as the plan's tensor
        win = None if window is None else state.window
        o = _call(qr, k, v, _block_mask(state, S), scale, Hq != Hkv, cap, win, offsets)
    else:
        qr = reference.to_rows(q, state.src)  # [B, Hq, T, D]
        bm = state.block_mask if state.block_mask is not None else _block_mask(state, S)
        ones = tuple(n == 1 for n in (*qr.shape[:3:2], *state.blocks[1].shape[2:], N))
        cap = None if softcap is None else _scalar(float(softcap), q.device)
        win = None if window is None else _scalar(int(window), q.device)
        key = (q.device.type, q.dtype, Hq, Hkv, D, *ones, cap is None, win is None)
        o = _compiled(key)(qr, k, v, bm, scale, Hq != Hkv, cap, win, offsets)
    return reference.from_rows(o, state.back)
