"""The packed form of the bass ops: every row's new tokens in one flat batch.

The engine's forward passes feed only real tokens (:mod:`bass.packing`): a ``[1, N]``
input, so a decoder hands its attention function packed queries ``[1, Hq, N, D]`` and its
cache packed keys/values ``[1, Hkv, N, D]``. Importing :mod:`bass.ops` registers:

* ``bass::ragged_attention_packed(q, k, v, cu_q_lens, kv_lens, scale, impl="auto")``
* ``bass::kv_append_packed(k_cache, v_cache, k_new, v_new, cu_q_lens, cache_lens)``

The contract (FlashAttention's varlen convention for the offsets)::

    q:          [1, Hq, N, D]   packed queries, any strides (usually a transposed view)
    k, v:       [B, Hkv, S, D]  per-row caches, the new keys already written; Hq % Hkv == 0
    cu_q_lens:  int32 [B+1]     cu_q_lens[0] = 0, non-decreasing, cu_q_lens[B] <= N
    kv_lens:    int32 [B]       q_len_b := cu_q_lens[b+1] - cu_q_lens[b] <= kv_lens[b] <= S
    out:        [1, Hq, N, D]   q's dtype, stored token-major (out.transpose(1, 2) is
                                contiguous: HF's transpose back to [1, N, Hq, D] is free)
    k_new, v_new: [1, Hkv, N, D] (kv_append_packed) packed new keys/values, any strides
    cache_lens: int32 [B]       (kv_append_packed) cache_lens[b] + q_len_b <= S

Token ``j`` with ``cu_q_lens[b] <= j < cu_q_lens[b+1]`` is row ``b``'s query
``i = j - cu_q_lens[b]``; it sits at absolute position ``kv_lens[b] - q_len_b + i`` and
attends causally to keys ``0..`` that position of row ``b`` (query head ``h`` uses KV head
``h // (Hq // Hkv)``). Tokens ``j >= cu_q_lens[B]`` belong to no row (padding, e.g. a
CUDA-graph bucket): their output is 0. Rows may bring no token. ``kv_append_packed``
writes token ``j`` of row ``b`` at slot ``cache_lens[b] + j - cu_q_lens[b]`` of row ``b``;
padding tokens and every other slot are left alone.

Worked example: rows feeding 3, 0 and 2 tokens: ``N = 5``, ``cu_q_lens = [0, 3, 3, 5]``;
tokens 0-2 belong to row 0, tokens 3-4 to row 2. With ``cache_lens = [4, 4, 0]`` the
append writes row 0's slots 4, 5, 6 and row 2's slots 0, 1; attention then takes
``kv_lens = [7, 4, 2]``: row 0's tokens sit at positions 4, 5, 6, row 2's at 0, 1. A
CUDA-graph bucket of ``N = 8`` adds tokens 5-7, which belong to no row.

Implementations (``impl=``), in a registry of :class:`bass.ops.Implementation` of its own:

* ``reference``: pure PyTorch, CPU and CUDA, vectorised over tokens; no host read (a CUDA
  graph can capture it). The oracle, and ``auto``'s CUDA pick.
* ``sdpa``: ``scaled_dot_product_attention`` on each row's own slices or on rows batched
  over views of the cache (:func:`bass.ops.sdpa.sdpa_attention_packed`). Called as the op
  it reads the lengths on the host: ``auto``'s pick on a CPU, where that is free. The
  engine's eager passes plan it once per pass from host lengths (:mod:`bass.ops.plan`),
  which lets it serve CUDA too (torch's flash / memory-efficient SDPA kernels), with no
  device sync per layer; that path has run on CPU only so far.
* ``fused``: Triton, CUDA (:mod:`bass.ops.triton_fused`). Checked in Triton's interpreter
  only, never yet on a GPU, so ``auto`` does not pick it (as the padded op's ``fused``):
  it enters ``auto`` after it passed its tests on a GPU.
* ``pad`` and ``split``: the paper's BASS-PAD and BASS-SPLIT (CUTLASS, CUDA,
  :mod:`bass.ops.cutlass`) in packed form (:func:`padded_as_packed`): the queries gathered
  into ``[B, Hq, T, D]``, the padded kernel, the result scattered back token-major.
  Compiled by nvcc in CI, never yet run on a GPU: named explicitly only.

Dispatch cost. These ops run twice per layer per pass, so they are registered at the
lowest level, ``torch.library.Library`` kernels per device key plus shape-only fakes
(``torch.library.custom_op``'s Python wrapper costs tens of microseconds more per call on
a small CPU, see ``bench/results/cpu_op_overhead.md``), and each kernel checks a call's
metadata and picks its implementation once per signature (shapes, dtypes, devices and
``impl``), reusing the decision on later calls; the CPU kernels likewise build the
per-pass index work once per distinct set of lengths, which every layer of a pass shares.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from . import (
    _ON_REFRESH,
    Implementation,
    _available_names,
    _highest_priority,
    _named_implementation,
    checks,
)
from .checks import (
    check_no_grad,
    check_packed_append_inputs,
    check_packed_append_lengths,
    check_packed_append_metadata,
    check_packed_attention_inputs,
    check_packed_attention_lengths,
    check_packed_attention_metadata,
    check_scale,
)
from .sdpa import SdpaPlan, _empty_out, _remember, sdpa_attention_packed

__all__ = [
    "GATHER_BUDGET",
    "cpu_append_packed",
    "kv_append_packed",
    "packed_implementations",
    "padded_as_packed",
    "ragged_attention_packed",
    "reference_append_packed",
    "reference_attention_packed",
    "register_packed_implementation",
    "resolve_packed_implementation",
    "sdpa_attention_packed",
]

OP = "ragged_attention_packed"

_lib = torch.library.Library("bass", "FRAGMENT")
_lib.define(
    "ragged_attention_packed(Tensor q, Tensor k, Tensor v, Tensor cu_q_lens, Tensor kv_lens, "
    "float scale, str impl='auto') -> Tensor"
)
_lib.define(
    "kv_append_packed(Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor k_new, Tensor v_new, "
    "Tensor cu_q_lens, Tensor cache_lens) -> ()"
)


# --------------------------------------------------------------------------- registry

_PACKED: dict[str, Implementation] = {}
_DECISIONS: dict[tuple, Callable] = {}  # call signature -> implementation function
_PLANS: dict[tuple, tuple] = {}  # lengths -> cpu_append_packed's per-pass index


def _forget() -> None:
    _DECISIONS.clear()


_ON_REFRESH.append(_forget)  # bass.ops.refresh_availability() forgets the decisions


def register_packed_implementation(impl: Implementation) -> None:
    """Add (or replace) an implementation selectable as ``impl=<name>`` of
    ``ragged_attention_packed``: ``impl.op(q, k, v, cu_q_lens, kv_lens, scale) -> out``
    with the op's semantics (including the token-major output)."""
    if impl.name == "auto":
        raise ValueError("'auto' is reserved for automatic selection")
    _PACKED[impl.name] = impl
    _forget()


def packed_implementations(device: str | torch.device | None = None) -> list[str]:
    """Names of the packed implementations that can run here (on ``device``'s type)."""
    return _available_names(_PACKED, device)


def resolve_packed_implementation(
    impl: str, device: torch.device, planned: bool = False
) -> Implementation:
    """The implementation ``impl`` names on ``device``; ``"auto"``: the available one of
    highest priority registered with ``in_auto`` (a static order: ``sdpa`` on CPU, the
    reference on CUDA until a kernel is cleared for ``auto`` there), leaving out, off the
    CPU, those that read lengths on the host unless the pass is ``planned`` (its lengths
    are on the host already: :mod:`bass.ops.plan`)."""
    if impl == "auto":
        ok = [
            i
            for i in _PACKED.values()
            if device.type in i.devices
            and i.available()
            and (planned or device.type == "cpu" or not i.host_lengths)
        ]
        return _highest_priority(ok, OP, device)
    return _named_implementation(_PACKED, OP, impl, device)


# --------------------------------------------------------------------------- helpers


def _token_rows(cu_q_lens: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For each of ``n`` packed tokens: its row (``B`` for padding past ``cu[B]``) and its
    index within the row (int64 ``[n]`` each). Vectorised, no host read."""
    cu = cu_q_lens.to(torch.long)
    j = torch.arange(n, device=cu.device)
    row = torch.searchsorted(cu[1:], j, right=True)  # ends <= j: [n] in 0..B
    return row, j - cu.index_select(0, row)  # cu[B] for padding: any index >= 0


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


# --------------------------------------------------------------------------- reference

# Elements of K (and as many of V) the reference gathers per chunk of tokens: the
# memory it needs beyond its output. Shapes alone set the chunks (CUDA-graph safe).
GATHER_BUDGET = 1 << 25


def reference_attention_packed(q, k, v, cu_q_lens, kv_lens, scale: float) -> torch.Tensor:
    """The oracle: each token's row of ``k``/``v`` gathered next to it, one masked
    softmax per (token, head) over all ``S`` slots, in float32 (float64 stays float64).
    Memory and time grow with ``N * S`` (each token reads its whole cache row): an
    oracle, and CUDA's fallback until a kernel is cleared for ``auto`` there.
    Vectorised over tokens and heads, in chunks of tokens that keep the gathered keys
    under :data:`GATHER_BUDGET` elements; no host read on any device.

    Shapes: q ``[1, Hq, N, D]``; k, v ``[B, Hkv, S, D]``; cu_q_lens int32 ``[B+1]``;
    kv_lens int32 ``[B]``; returns ``[1, Hq, N, D]`` token-major.
    """
    _, Hq, N, D = q.shape
    B, Hkv, S, _ = k.shape
    G = Hq // Hkv  # HF's repeat_kv order: query head h uses KV head h // G
    out = q.new_zeros(1, N, Hq, D)  # token-major; padding tokens stay 0
    if N == 0 or B == 0 or S == 0:
        return out.transpose(1, 2)
    cdt = _compute_dtype(q.dtype)
    row, i = _token_rows(cu_q_lens, N)  # [N] each
    live = row < B  # a token of some row (not padding)
    row = row.clamp(max=B - 1)
    cu = cu_q_lens.to(torch.long)
    q_len = (cu[1:] - cu[:-1]).index_select(0, row)  # [N]: the token's row's q_len
    pos = kv_lens.to(torch.long).index_select(0, row) - q_len + i  # [N] absolute position
    # token j sees keys 0..pos[j] of its row, all within kv_len: a NaN left in a slot
    # past a row's length is masked out of the scores, and zeroed out of the values
    # (its zero weight would not do: 0 * NaN is NaN)
    slot = torch.arange(S, device=q.device)
    allowed = (slot <= pos[:, None]) & live[:, None]  # [N, S]
    zero = torch.zeros((), dtype=cdt, device=q.device)
    in_row = (slot < kv_lens.to(torch.long)[:, None])[:, None, :, None]  # [B, 1, S, 1]
    v = torch.where(in_row, v.to(cdt), zero)  # [B, Hkv, S, D]
    qt = q[0].transpose(0, 1).reshape(N, Hkv, G, D)  # [N, Hkv, G, D]
    chunk = max(1, GATHER_BUDGET // (Hkv * S * D))
    for start in range(0, N, chunk):  # shapes only: the same chunks on every call
        stop = min(start + chunk, N)
        rows, seen = row[start:stop], allowed[start:stop, None, None, :]  # [n, 1, 1, S]
        kt = k.index_select(0, rows).to(cdt)  # [n, Hkv, S, D]
        vt = v.index_select(0, rows)
        scores = torch.matmul(qt[start:stop].to(cdt), kt.transpose(-1, -2)) * scale
        scores = scores.masked_fill(~seen, float("-inf"))  # [n, Hkv, G, S]
        # a padding token sees no key: softmax gives NaN there; the contract says 0
        probs = torch.where(seen, torch.softmax(scores, dim=-1), zero)
        o = torch.matmul(probs, vt)  # [n, Hkv, G, D]
        out[0, start:stop] = o.reshape(stop - start, Hq, D).to(q.dtype)
    return out.transpose(1, 2)


def reference_append_packed(k_cache, v_cache, k_new, v_new, cu_q_lens, cache_lens) -> None:
    """Vectorised, no host read: one gather and one index_put per cache. Every token
    writes somewhere, so the index has a fixed size: a padding token (past ``cu[B]``)
    rewrites the last real token's slot with that token's value, and when the pass has
    no real token at all every token rewrites slot ``cache_lens[B-1]`` of row ``B-1``
    with the value it holds. Duplicate indices therefore always carry equal values,
    whatever order the scatter applies them in.

    Shapes: k_cache, v_cache ``[B, Hkv, S, D]`` (mutated); k_new, v_new
    ``[1, Hkv, N, D]``; cu_q_lens int32 ``[B+1]``; cache_lens int32 ``[B]``.
    """
    B, _, S, _ = k_cache.shape
    N = k_new.shape[2]
    if N == 0 or B == 0:
        return
    row, i = _token_rows(cu_q_lens, N)
    real = cu_q_lens[B].to(torch.long)  # tokens that belong to a row
    token = torch.arange(N, device=row.device)
    src = torch.where(row < B, token, (real - 1).clamp(min=0))  # the token each one writes
    rows = row.index_select(0, src).clamp(max=B - 1)
    slots = cache_lens.to(torch.long).index_select(0, rows) + i.index_select(0, src)
    slots = slots.clamp(0, S - 1)
    keep_old = (real == 0).expand(N)[:, None, None]  # no real token: write back the old
    for cache, new in ((k_cache, k_new), (v_cache, v_new)):
        vals = new[0].transpose(0, 1).index_select(0, src).to(cache.dtype)  # [N, Hkv, D]
        cache[rows, :, slots] = torch.where(keep_old, cache[rows, :, slots], vals)


# --------------------------------------------------------------------------- CPU


def cpu_append_packed(k_cache, v_cache, k_new, v_new, cu_q_lens, cache_lens) -> None:
    """CPU: one index_put per cache at the real tokens' (row, slot) pairs, built on the
    host once per set of lengths (every layer of a pass appends with the same ones).

    Shapes: as :func:`reference_append_packed`.
    """
    cu, lens = cu_q_lens.tolist(), cache_lens.tolist()
    key = (*cu, -1, *lens)
    index = _PLANS.get(key)
    if index is None:
        rows = [b for b in range(len(lens)) for _ in range(cu[b + 1] - cu[b])]
        slots = [s for b, n in enumerate(lens) for s in range(n, n + cu[b + 1] - cu[b])]
        pairs = torch.tensor([rows, slots], dtype=torch.long).reshape(2, -1)
        index = _remember(_PLANS, key, (pairs[0], pairs[1]))
    real = cu[-1]
    if real == 0:
        return
    rows, slots = index
    for cache, new in ((k_cache, k_new), (v_cache, v_new)):
        vals = new[0] if real == new.shape[2] else new[0].narrow(1, 0, real)  # [Hkv, real, D]
        vals = vals.transpose(0, 1)  # [real, Hkv, D]: the shape cache[rows, :, slots] has
        cache[rows, :, slots] = vals if vals.dtype == cache.dtype else vals.to(cache.dtype)


# --------------------------------------------------------------------------- the ops


def _attention(q, k, v, cu_q_lens, kv_lens, scale, impl="auto"):
    # the metadata checks and the implementation depend on nothing else: once per signature
    key = (
        impl,
        q.shape, q.dtype, q.device,
        k.shape, k.dtype, k.device,
        v.shape, v.dtype, v.device,
        cu_q_lens.shape, cu_q_lens.dtype, cu_q_lens.device,
        kv_lens.shape, kv_lens.dtype, kv_lens.device,
    )  # fmt: skip
    fn = _DECISIONS.get(key)
    if fn is None:
        check_packed_attention_metadata(q, k, v, cu_q_lens, kv_lens, scale)
        fn = _remember(_DECISIONS, key, resolve_packed_implementation(impl, q.device).op)
    elif not math.isfinite(scale):
        check_scale(scale)
    if checks._CHECK_LENGTHS:  # a backend kernel: the tensors hold data
        check_packed_attention_lengths(cu_q_lens, kv_lens, q.shape[2], k.shape[2], True)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        check_no_grad("bass.ragged_attention_packed", q=q, k=k, v=v)
    return fn(q, k, v, cu_q_lens, kv_lens, scale)


def _append(k_cache, v_cache, k_new, v_new, cu_q_lens, cache_lens):
    key = (
        -1,
        k_cache.shape, k_cache.dtype, k_cache.device,
        v_cache.shape, v_cache.dtype, v_cache.device,
        k_new.shape, k_new.dtype, k_new.device,
        v_new.shape, v_new.dtype, v_new.device,
        cu_q_lens.shape, cu_q_lens.dtype, cu_q_lens.device,
        cache_lens.shape, cache_lens.dtype, cache_lens.device,
    )  # fmt: skip
    fn = _DECISIONS.get(key)
    if fn is None:
        check_packed_append_metadata(k_cache, v_cache, k_new, v_new, cu_q_lens, cache_lens)
        cpu = k_cache.device.type == "cpu"
        fn = _remember(_DECISIONS, key, cpu_append_packed if cpu else reference_append_packed)
    if checks._CHECK_LENGTHS:
        check_packed_append_lengths(cu_q_lens, cache_lens, k_new.shape[2], k_cache.shape[2], True)
    if torch.is_grad_enabled() and (k_new.requires_grad or v_new.requires_grad):
        check_no_grad("bass.kv_append_packed", k_new=k_new, v_new=v_new)
    fn(k_cache, v_cache, k_new, v_new, cu_q_lens, cache_lens)


for _key in ("CPU", "CUDA"):
    _lib.impl("ragged_attention_packed", _attention, _key)
    _lib.impl("kv_append_packed", _append, _key)


@torch.library.register_fake("bass::ragged_attention_packed", lib=_lib)
def _attention_fake(q, k, v, cu_q_lens, kv_lens, scale, impl="auto"):
    check_packed_attention_inputs(q, k, v, cu_q_lens, kv_lens, scale)
    return _empty_out(q, zero=False)  # token-major, as every implementation's


@torch.library.register_fake("bass::kv_append_packed", lib=_lib)
def _append_fake(k_cache, v_cache, k_new, v_new, cu_q_lens, cache_lens):
    check_packed_append_inputs(k_cache, v_cache, k_new, v_new, cu_q_lens, cache_lens)


register_packed_implementation(
    Implementation(
        "reference",
        reference_attention_packed,
        ("cpu", "cuda"),
        priority=0,
        description="pure PyTorch, each token's cache row gathered, no host read",
    )
)


def _sdpa_plan(plan) -> Callable:
    """The per-pass SDPA work from a :class:`bass.ops.plan.PackedPlan`'s host lengths
    (NaN checks of batched calls on a CPU only: elsewhere they would sync)."""
    dev = plan.device
    return SdpaPlan(plan.cu, plan.kv_lens, plan.num_tokens, dev, dev.type == "cpu").run


register_packed_implementation(
    Implementation(
        "sdpa",
        sdpa_attention_packed,
        ("cpu", "cuda"),
        priority=1,
        host_lengths=True,
        plan=_sdpa_plan,
        description="F.scaled_dot_product_attention per row on its own slices (lengths on "
        "the host: CPU, or any device through a planned pass)",
    )
)


# --------------------------------------------------------------------------- PAD / SPLIT


def padded_as_packed(padded_op: Callable, max_q_len: int | None = None) -> Callable:
    """A packed implementation ``(q, k, v, cu_q_lens, kv_lens, scale) -> out`` from a
    padded one ``(q [B, Hq, T, D], k, v, q_lens, kv_lens, scale) -> [B, Hq, T, D]``.

    Row ``b``'s tokens ``cu_q_lens[b] + i`` (``i < T``) are gathered into ``[B, Hq, T,
    D]`` (slots past ``q_len_b`` repeat a token and are padding to the padded op), the
    padded op runs, and each real slot's output is scattered back to its token
    (padding slots to a dummy token that is dropped). No host read: ``T`` is
    ``max_q_len`` when the caller knows it (a planned pass), else ``N`` (shapes only).

    Worked example: ``cu_q_lens = [0, 3, 3, 5]``, ``T = 3``: row 0 gathers tokens 0-2,
    row 1 nothing (3 padding slots), row 2 tokens 3, 4 and a padding slot.
    """

    def run(q, k, v, cu_q_lens, kv_lens, scale: float) -> torch.Tensor:
        _, Hq, N, D = q.shape
        B = k.shape[0]
        T = N if max_q_len is None else max(1, min(max_q_len, N))
        out = q.new_zeros(1, N + 1, Hq, D)  # token N: where padding slots land
        if N == 0 or B == 0:
            return out[:, :N].transpose(1, 2)
        cu = cu_q_lens.to(torch.long)
        q_lens = cu[1:] - cu[:-1]  # [B]
        t = torch.arange(T, device=q.device)
        live = t[None] < q_lens[:, None]  # [B, T]
        src = (cu[:-1, None] + t).clamp(max=N - 1)  # [B, T]
        qp = q[0].index_select(1, src.flatten()).unflatten(1, (B, T)).transpose(0, 1)
        op = padded_op(qp, k, v, q_lens.to(torch.int32), kv_lens, scale)  # [B, Hq, T, D]
        dst = torch.where(live, src, N).flatten()
        vals = op.transpose(1, 2).reshape(B * T, Hq, D).to(q.dtype)
        out[0].index_put_((dst,), vals)  # real slots: distinct tokens; padding: token N
        return out[:, :N].transpose(1, 2)

    return run


def _plan_padded(padded_op: Callable) -> Callable:
    def plan(p) -> Callable:
        run = padded_as_packed(padded_op, p.max_q_len)
        return lambda q, k, v, scale: run(q, k, v, p.cu_q_lens, p.kv_lens_t, scale)

    return plan


def _register_padded_forms() -> None:
    """The packed forms of the padded op's CUTLASS implementations (``pad``, ``split``)."""
    from . import _IMPLEMENTATIONS

    for name in ("pad", "split"):
        padded = _IMPLEMENTATIONS.get(name)
        if padded is None:
            continue
        register_packed_implementation(
            Implementation(
                name,
                padded_as_packed(padded.op),
                padded.devices,
                available=padded.available,
                priority=padded.priority,
                in_auto=False,  # not before its tests pass on a GPU
                plan=_plan_padded(padded.op),
                description=padded.description + " (packed form: queries gathered per row)",
            )
        )


_register_padded_forms()


# --------------------------------------------------------------------------- public


def ragged_attention_packed(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_q_lens: torch.Tensor,
    kv_lens: torch.Tensor,
    scale: float,
    impl: str = "auto",
) -> torch.Tensor:
    """Causal attention of packed new queries over per-row KV caches.

    ``torch.ops.bass.ragged_attention_packed(q, k, v, cu_q_lens, kv_lens, scale, impl)``
    (this function calls it). Token ``j`` with ``cu_q_lens[b] <= j < cu_q_lens[b+1]`` is
    row ``b``'s query ``i = j - cu_q_lens[b]`` at absolute position
    ``kv_lens[b] - q_len_b + i`` (``q_len_b = cu_q_lens[b+1] - cu_q_lens[b]``); it attends
    to keys ``0..`` that position of row ``b``. Tokens past ``cu_q_lens[B]`` belong to no
    row (padding) and their output is 0. Worked example: rows feeding 3, 0 and 2 tokens
    give ``N = 5``, ``cu_q_lens = [0, 3, 3, 5]``: tokens 0-2 are row 0's, 3-4 row 2's.

    Args:
        q: ``[1, Hq, N, D]`` packed queries, any strides; float16, bfloat16, float32 or
            float64.
        k: ``[B, Hkv, S, D]`` per-row key cache, q's dtype; ``Hq % Hkv == 0`` (query head
            ``h`` uses KV head ``h // (Hq // Hkv)``).
        v: ``[B, Hkv, S, D]`` per-row value cache.
        cu_q_lens: int32 ``[B+1]``: ``0 = cu_q_lens[0] <= ... <= cu_q_lens[B] <= N``.
        kv_lens: int32 ``[B]``, ``q_len_b <= kv_lens[b] <= S`` (the new keys are in the
            cache already).
        scale: softmax scale, usually ``D ** -0.5``.
        impl: ``"auto"`` (``sdpa`` on CPU, ``reference`` on CUDA), ``"reference"``,
            ``"sdpa"`` (CPU) or ``"fused"`` (Triton, CUDA; not yet run on a GPU, so
            ``auto`` does not pick it).

    Returns:
        ``[1, Hq, N, D]`` in q's dtype, stored token-major (``out.transpose(1, 2)`` is
        contiguous, so ``out.transpose(1, 2).reshape(1, N, Hq * D)`` copies nothing).

    Inference only: inputs requiring grad raise. In eager mode the lengths are range-
    checked on the host (:func:`bass.ops.length_checks` skips that in a trusted loop).

    Example (rows feeding 2, 0 and 1 tokens; row 0 had 3 cached, row 2 none)::

        >>> import torch, bass
        >>> q = torch.randn(1, 3, 4, 8).transpose(1, 2)     # [1, Hq=4, N=3, D=8], a view
        >>> k, v = torch.randn(3, 2, 6, 8), torch.randn(3, 2, 6, 8)  # B=3, Hkv=2, S=6
        >>> cu = torch.tensor([0, 2, 2, 3], dtype=torch.int32)
        >>> kv = torch.tensor([5, 4, 1], dtype=torch.int32)
        >>> out = torch.ops.bass.ragged_attention_packed(q, k, v, cu, kv, 8 ** -0.5)
        >>> out.shape, out.transpose(1, 2).is_contiguous()
        (torch.Size([1, 4, 3, 8]), True)
    """
    return torch.ops.bass.ragged_attention_packed(q, k, v, cu_q_lens, kv_lens, scale, impl)


def kv_append_packed(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    cu_q_lens: torch.Tensor,
    cache_lens: torch.Tensor,
) -> None:
    """Write a packed pass's new keys and values into per-row caches, in place.

    ``torch.ops.bass.kv_append_packed(k_cache, v_cache, k_new, v_new, cu_q_lens,
    cache_lens)`` (this function calls it). Token ``j`` of row ``b``
    (``cu_q_lens[b] <= j < cu_q_lens[b+1]``) goes to slot ``cache_lens[b] + j -
    cu_q_lens[b]`` of row ``b``; tokens past ``cu_q_lens[B]`` (padding) and every other
    slot are left alone. The caller advances its lengths itself.

    Args:
        k_cache, v_cache: ``[B, Hkv, S, D]`` preallocated caches (mutated).
        k_new, v_new: ``[1, Hkv, N, D]`` packed new entries, any strides.
        cu_q_lens: int32 ``[B+1]`` as in :func:`ragged_attention_packed`.
        cache_lens: int32 ``[B]``, ``cache_lens[b] + q_len_b <= S``.

    Inference only, like :func:`ragged_attention_packed`.

    Example (rows feeding 2 and 1 tokens, after 1 and 0 cached)::

        >>> import torch, bass
        >>> kc, vc = torch.zeros(2, 1, 4, 2), torch.zeros(2, 1, 4, 2)
        >>> new = torch.arange(1.0, 4.0)[None, None, :, None].expand(1, 1, 3, 2)
        >>> cu = torch.tensor([0, 2, 3], dtype=torch.int32)
        >>> bass.ops.kv_append_packed(kc, vc, new, new, cu, torch.tensor([1, 0], dtype=torch.int32))
        >>> kc[:, 0, :, 0]
        tensor([[0., 1., 2., 0.],
                [3., 0., 0., 0.]])
    """
    torch.ops.bass.kv_append_packed(k_cache, v_cache, k_new, v_new, cu_q_lens, cache_lens)


def _document() -> None:
    # Let help(torch.ops.bass.<op>) show the contract, not just the schema.
    for fn in (ragged_attention_packed, kv_append_packed):
        packet = getattr(torch.ops.bass, fn.__name__)
        try:
            packet.__doc__ = fn.__doc__
            packet.default.__doc__ = fn.__doc__
        except (AttributeError, TypeError):  # pragma: no cover - older torch
            pass


_document()
