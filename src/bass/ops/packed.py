"""The packed form of the bass ops: every row's new tokens in one flat batch.

The engine's forward passes feed only real tokens (:mod:`bass.packing`): a ``[1, N]``
input, so a decoder hands its attention function packed queries ``[1, Hq, N, D]`` and its
cache packed keys/values ``[1, Hkv, N, D]``. Importing :mod:`bass.ops` registers:

* ``bass::ragged_attention_packed(q, k, v, cu_q_lens, kv_lens, scale, impl="auto")``
* ``bass::kv_append_packed(k_cache, v_cache, k_new, v_new, cu_q_lens, cache_lens)``

The contract (FlashAttention's varlen convention for the offsets)::

    q:         [1, Hq, N, D]   packed queries (often a transposed view: any strides)
    k, v:      [B, Hkv, S, D]  per-row caches, the new keys already written; Hq % Hkv == 0
    cu_q_lens: int32 [B+1]     cu_q_lens[0] = 0, non-decreasing, cu_q_lens[B] <= N
    kv_lens:   int32 [B]       q_len_b := cu_q_lens[b+1] - cu_q_lens[b] <= kv_lens[b] <= S
    out:       [1, Hq, N, D]   q's dtype, stored token-major (out.transpose(1, 2) is
                               contiguous: HF's transpose back to [1, N, Hq, D] is free)

Token ``j`` with ``cu_q_lens[b] <= j < cu_q_lens[b+1]`` is row ``b``'s query
``i = j - cu_q_lens[b]``; it sits at absolute position ``kv_lens[b] - q_len_b + i`` and
attends causally to keys ``0..`` that position of row ``b`` (query head ``h`` uses KV head
``h // (Hq // Hkv)``). Tokens ``j >= cu_q_lens[B]`` belong to no row (padding, e.g. a
CUDA-graph bucket): their output is 0. ``kv_append_packed`` writes token ``j`` of row
``b`` at slot ``cache_lens[b] + j - cu_q_lens[b]`` of row ``b``
(``cache_lens[b] + q_len_b <= S``); padding tokens change nothing.

Worked example: rows feeding 3, 0 and 2 tokens: ``N = 5``, ``cu_q_lens = [0, 3, 3, 5]``;
tokens 0-2 belong to row 0, tokens 3-4 to row 2. With ``kv_lens = [7, 4, 2]`` row 0's
tokens sit at positions 4, 5, 6 and row 2's at 0, 1.

Implementations (``impl=``): ``reference`` (pure PyTorch, CPU and CUDA, no host read on
CUDA, so a CUDA graph can capture it; the oracle), ``sdpa`` (CPU: one
``scaled_dot_product_attention`` per row on its own slices; ``auto``'s CPU pick) and
``fused`` (Triton, CUDA; checked in Triton's interpreter only, so ``auto`` does not pick
it). Both ops are registered with ``torch.library.Library`` kernels per device (about
3 µs of dispatch, against ~10-20 µs for ``torch.library.custom_op``: they run twice per
layer per pass) and shape-only fakes, so ``torch.compile(fullgraph=True)`` sees them as
single opaque nodes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from . import reference
from .checks import check_no_grad, check_packed_append_inputs, check_packed_attention_inputs

__all__ = [
    "PackedImplementation",
    "kv_append_packed",
    "packed_implementations",
    "ragged_attention_packed",
    "register_packed_implementation",
    "resolve_packed_implementation",
]

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


@dataclass(frozen=True)
class PackedImplementation:
    """One implementation of ``ragged_attention_packed``: ``fn(q, k, v, cu_q_lens,
    kv_lens, scale) -> out`` with the op's semantics (token-major output), the device
    types it runs on, whether it can run in this process, and its rank for ``auto``."""

    name: str
    fn: Callable[..., torch.Tensor]
    devices: tuple[str, ...]
    available: Callable[[], bool] = lambda: True
    priority: int = 0
    in_auto: bool = True
    description: str = ""


_PACKED: dict[str, PackedImplementation] = {}
_AUTO: dict[str, PackedImplementation] = {}  # auto's pick per device type


def register_packed_implementation(impl: PackedImplementation) -> None:
    """Add (or replace) an implementation selectable as ``impl=<name>``."""
    if impl.name == "auto":
        raise ValueError("'auto' is reserved for automatic selection")
    _PACKED[impl.name] = impl
    _AUTO.clear()


def packed_implementations(device: str | torch.device | None = None) -> list[str]:
    """Names of the packed implementations that can run here (on ``device``'s type)."""
    kind = None if device is None else torch.device(device).type
    return [n for n, i in _PACKED.items() if (kind is None or kind in i.devices) and i.available()]


def resolve_packed_implementation(impl: str, device: torch.device) -> PackedImplementation:
    """The implementation ``impl`` names on ``device``; ``"auto"``: the available one of
    highest priority registered with ``in_auto`` (decided once per device type)."""
    if impl == "auto":
        found = _AUTO.get(device.type)
        if found is None:
            ok = [
                i
                for i in _PACKED.values()
                if device.type in i.devices and i.in_auto and i.available()
            ]
            if not ok:
                raise RuntimeError(f"no ragged_attention_packed implementation runs on {device}")
            found = _AUTO[device.type] = max(ok, key=lambda i: i.priority)
        return found
    found = _PACKED.get(impl)
    if found is None:
        names = ", ".join(["auto", *_PACKED])
        raise ValueError(
            f"unknown ragged_attention_packed implementation {impl!r}; registered: {names}"
        )
    if device.type not in found.devices:
        raise ValueError(
            f"ragged_attention_packed implementation {impl!r} runs on "
            f"{', '.join(found.devices)}, not {device.type}; use impl='auto' or one of "
            f"{packed_implementations(device)}"
        )
    if not found.available():
        raise RuntimeError(
            f"ragged_attention_packed implementation {impl!r} is not available in this "
            f"process ({found.description}); available on {device.type}: "
            f"{packed_implementations(device)}"
        )
    return found


# --------------------------------------------------------------------------- helpers


def _token_rows(cu_q_lens: torch.Tensor, n: int):
    """For each of ``n`` packed tokens: its row (``B`` for padding past ``cu[B]``) and its
    index within the row. Vectorised, no host read."""
    B = cu_q_lens.shape[0] - 1
    j = torch.arange(n, device=cu_q_lens.device)
    row = torch.searchsorted(cu_q_lens[1:].contiguous(), j, right=True)  # [N] in 0..B
    start = cu_q_lens.to(torch.long).index_select(0, row.clamp(max=B))  # cu[B] for padding
    return row, j - start


def _empty_out(q: torch.Tensor) -> torch.Tensor:
    """A zero ``[1, Hq, N, D]`` output stored token-major."""
    _, Hq, N, D = q.shape
    return q.new_zeros(1, N, Hq, D).transpose(1, 2)


# --------------------------------------------------------------------------- reference


def reference_attention_packed(q, k, v, cu_q_lens, kv_lens, scale: float) -> torch.Tensor:
    """The oracle: the packed rows scattered into the padded layout, the padded
    reference (:func:`bass.ops.reference.ragged_attention`), gathered back. Rows are
    padded to the longest ``q_len`` on CPU (a free host read) and to ``N`` on CUDA (no
    host read: a CUDA graph can capture it; memory grows with ``B * N * S``)."""
    _, Hq, N, D = q.shape
    B = kv_lens.shape[0]
    if N == 0 or B == 0:
        return _empty_out(q)
    q_lens = (cu_q_lens[1:] - cu_q_lens[:-1]).to(torch.int32)
    T = max(1, int(q_lens.max())) if q.device.type == "cpu" else N
    row, t = _token_rows(cu_q_lens, N)
    t = t.clamp(0, T - 1)  # padding tokens go to the extra row B, any slot
    q_pad = q.new_zeros(B + 1, T, Hq, D)
    q_pad[row, t] = q[0].transpose(0, 1)  # [N, Hq, D]; real (row, t) pairs are distinct
    out = reference.ragged_attention(
        q_pad[:B].transpose(1, 2), k, v, q_lens, kv_lens, scale
    )  # [B, Hq, T, D]
    ext = torch.cat([out.transpose(1, 2), out.new_zeros(1, T, Hq, D)])  # row B: zeros
    return ext[row, t].unsqueeze(0).transpose(1, 2)  # [N, Hq, D] rows: token-major


def reference_append_packed(k_cache, v_cache, k_new, v_new, cu_q_lens, cache_lens) -> None:
    """Vectorised, no host read: one index_put per cache. A padding token rewrites the
    value of the last real token's slot (or, when there is none, the value already in
    slot ``(B-1, S-1)``), so duplicate indices always carry equal values."""
    B, _, S, _ = k_cache.shape
    N = k_new.shape[2]
    if N == 0 or B == 0:
        return
    row, t = _token_rows(cu_q_lens, N)
    real = cu_q_lens[B].to(torch.long)
    last = (real - 1).clamp(min=0)
    pad = row >= B
    src = torch.where(pad, last, torch.arange(N, device=row.device))  # token to copy
    rows = row.index_select(0, src).clamp(max=B - 1)
    slots = cache_lens.to(torch.long).index_select(0, rows) + t.index_select(0, src)
    slots = slots.clamp(0, S - 1)
    none = (real == 0).expand(N)  # no real token: rewrite what is there
    for cache, new in ((k_cache, k_new), (v_cache, v_new)):
        vals = new[0].transpose(0, 1).index_select(0, src).to(cache.dtype)  # [N, Hkv, D]
        old = cache[rows, :, slots]
        cache[rows, :, slots] = torch.where(none[:, None, None], old, vals)


# --------------------------------------------------------------------------- CPU


def _sdpa_row(q, k, v, out, a, e, b, L, scale, half, gqa) -> None:
    """Row ``b``'s tokens ``a..e-1`` over its first ``L`` keys, into ``out``."""
    n = e - a
    qb, kb, vb = q[:, :, a:e], k[b : b + 1, :, :L], v[b : b + 1, :, :L]
    if half:  # float32 math, rounded once (as the reference)
        qb, kb, vb = qb.float(), kb.float(), vb.float()
    mask, causal = None, False
    if n > 1 and n == L:
        causal = True
    elif n > 1:  # query i sits at position L - n + i
        i = torch.arange(n)[:, None]
        mask = torch.arange(L)[None] <= i + (L - n)
    ob = F.scaled_dot_product_attention(
        qb, kb, vb, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=gqa
    )
    out[:, :, a:e] = ob


# Decode rows (one query each) go through ONE padded call when they are at least half the
# rows and their lengths fill at least this share of the longest (the padding computed
# costs less than a call per row: decode attention is bound by reading the cache, so
# padding must stay small).
DECODE_BATCH_MIN_FILL = 0.8


def sdpa_attention_packed(q, k, v, cu_q_lens, kv_lens, scale: float) -> torch.Tensor:
    """CPU: ``scaled_dot_product_attention`` on each row's own slices (nothing past
    ``kv_len`` is read), lengths read on the host (free on CPU). Decode rows (one query)
    need no mask and, when they are most of the batch with similar lengths, share one
    call over the cache padded to the longest of them (a length mask; the cache buffer
    is a view, nothing is copied; a non-finite result, from NaN stored past a length,
    sends them back to one call each). Rows of several queries: ``is_causal`` when they
    attend only to their own new tokens, else a bottom-right causal mask."""
    Hq, Hkv = q.shape[1], k.shape[1]
    out = _empty_out(q)
    half = q.dtype in (torch.float16, torch.bfloat16)
    cu, kv = cu_q_lens.tolist(), kv_lens.tolist()
    gqa = Hq != Hkv
    B = len(kv)
    single = [b for b in range(B) if cu[b + 1] - cu[b] == 1]
    batched = False
    if len(single) >= 2 and 2 * len(single) >= B:
        top = max(kv[b] for b in single)
        batched = sum(kv[b] for b in single) >= DECODE_BATCH_MIN_FILL * top * len(single)
    if batched:
        # every cache row joins (a view); rows that are not decoding attend to key 0 and
        # are discarded
        tok = torch.tensor([cu[b] if b in set(single) else 0 for b in range(B)])
        lens = torch.tensor([kv[b] if b in set(single) else 1 for b in range(B)])
        qs = q[0].index_select(1, tok).transpose(0, 1)[:, :, None]  # [B, Hq, 1, D]
        ks, vs = k[:, :, :top], v[:, :, :top]
        if half:
            qs, ks, vs = qs.float(), ks.float(), vs.float()
        mask = (torch.arange(top)[None] < lens[:, None])[:, None, None]  # [B, 1, 1, top]
        ob = F.scaled_dot_product_attention(
            qs, ks, vs, attn_mask=mask, scale=scale, enable_gqa=gqa
        )[:, :, 0]  # [B, Hq, D]
        rows = torch.tensor(single)
        picked = ob.index_select(0, rows)  # [n, Hq, D]
        if bool(picked.sum().isfinite()):  # NaN/Inf anywhere survive the sum (one pass)
            out[0].transpose(0, 1)[torch.tensor([cu[b] for b in single])] = picked.to(q.dtype)
            done = set(single)
        else:  # NaN/Inf past a length leaked through a zero weight: redo them one by one
            done = set()
    else:
        done = set()
    for b, L in enumerate(kv):
        a, e = cu[b], cu[b + 1]
        if e > a and b not in done:
            _sdpa_row(q, k, v, out, a, e, b, L, scale, half, gqa)
    return out


class _RowSlots:
    """The (row, slot) index of every real token of a pass, built once per pass: every
    layer appends with the same lengths (compared by value, so a tensor changed in place
    is never mistaken for the old one)."""

    def __init__(self):
        self.key: tuple | None = None

    def get(self, cu_q_lens, cache_lens):
        cu, lens = cu_q_lens.tolist(), cache_lens.tolist()
        if self.key != (cu, lens):
            rows = [b for b in range(len(lens)) for _ in range(cu[b + 1] - cu[b])]
            slots = [s for b, n in enumerate(lens) for s in range(n, n + cu[b + 1] - cu[b])]
            index = torch.tensor([rows, slots], dtype=torch.long)
            self.key, self.value = (cu, lens), (index[0], index[1], cu[-1])
        return self.value


_ROW_SLOTS = _RowSlots()


def cpu_append_packed(k_cache, v_cache, k_new, v_new, cu_q_lens, cache_lens) -> None:
    """CPU: one index_put per cache at (row, slot) pairs read on the host."""
    rows, slots, real = _ROW_SLOTS.get(cu_q_lens, cache_lens)
    if real == 0:
        return
    for cache, new in ((k_cache, k_new), (v_cache, v_new)):
        cache[rows, :, slots] = new[0, :, :real].transpose(0, 1).to(cache.dtype)


# --------------------------------------------------------------------------- the ops


def _attention(q, k, v, cu_q_lens, kv_lens, scale, impl="auto"):
    check_packed_attention_inputs(q, k, v, cu_q_lens, kv_lens, scale)
    check_no_grad("bass.ragged_attention_packed", q=q, k=k, v=v)
    return resolve_packed_implementation(impl, q.device).fn(q, k, v, cu_q_lens, kv_lens, scale)


def _append(k_cache, v_cache, k_new, v_new, cu_q_lens, cache_lens):
    check_packed_append_inputs(k_cache, v_cache, k_new, v_new, cu_q_lens, cache_lens)
    check_no_grad("bass.kv_append_packed", k_new=k_new, v_new=v_new)
    if k_cache.device.type == "cpu":
        cpu_append_packed(k_cache, v_cache, k_new, v_new, cu_q_lens, cache_lens)
    else:
        reference_append_packed(k_cache, v_cache, k_new, v_new, cu_q_lens, cache_lens)


for _key in ("CPU", "CUDA"):
    _lib.impl("ragged_attention_packed", _attention, _key)
    _lib.impl("kv_append_packed", _append, _key)


@torch.library.register_fake("bass::ragged_attention_packed", lib=_lib)
def _attention_fake(q, k, v, cu_q_lens, kv_lens, scale, impl="auto"):
    check_packed_attention_inputs(q, k, v, cu_q_lens, kv_lens, scale)
    _, Hq, N, D = q.shape
    return q.new_empty(1, N, Hq, D).transpose(1, 2)


@torch.library.register_fake("bass::kv_append_packed", lib=_lib)
def _append_fake(k_cache, v_cache, k_new, v_new, cu_q_lens, cache_lens):
    check_packed_append_inputs(k_cache, v_cache, k_new, v_new, cu_q_lens, cache_lens)


register_packed_implementation(
    PackedImplementation(
        "reference",
        reference_attention_packed,
        ("cpu", "cuda"),
        priority=0,
        description="pure PyTorch: the padded reference on the rows scattered to padding",
    )
)
register_packed_implementation(
    PackedImplementation(
        "sdpa",
        sdpa_attention_packed,
        ("cpu",),
        priority=1,
        description="F.scaled_dot_product_attention per row on its own slices (CPU)",
    )
)


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

    ``torch.ops.bass.ragged_attention_packed(q, k, v, cu_q_lens, kv_lens, scale)`` (this
    function calls it). Token ``j`` with ``cu_q_lens[b] <= j < cu_q_lens[b+1]`` is row
    ``b``'s query ``i = j - cu_q_lens[b]`` at absolute position ``kv_lens[b] - q_len_b +
    i``; it attends to keys ``0..`` that position of row ``b``. Tokens past
    ``cu_q_lens[B]`` belong to no row and their output is 0.

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
        impl: ``"auto"``, ``"reference"``, ``"sdpa"`` (CPU) or ``"fused"`` (CUDA).

    Returns:
        ``[1, Hq, N, D]`` in q's dtype, stored token-major (``out.transpose(1, 2)`` is
        contiguous).

    Example (rows feeding 2, 0 and 1 tokens; row 0 had 3 cached, row 2 none)::

        >>> import torch, bass
        >>> q = torch.randn(1, 4, 3, 8)                      # Hq=4, N=3, D=8
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

    ``torch.ops.bass.kv_append_packed(...)`` (this function calls it). Token ``j`` of row
    ``b`` (``cu_q_lens[b] <= j < cu_q_lens[b+1]``) goes to slot
    ``cache_lens[b] + j - cu_q_lens[b]`` of row ``b``; tokens past ``cu_q_lens[B]`` and
    every other slot are left alone. The caller advances its lengths itself.

    Args:
        k_cache, v_cache: ``[B, Hkv, S, D]`` preallocated caches (mutated).
        k_new, v_new: ``[1, Hkv, N, D]`` packed new entries, any strides.
        cu_q_lens: int32 ``[B+1]`` as in :func:`ragged_attention_packed`.
        cache_lens: int32 ``[B]``, ``cache_lens[b] + q_len_b <= S``.

    Example::

        >>> import torch, bass
        >>> kc, vc = torch.zeros(2, 1, 4, 2), torch.zeros(2, 1, 4, 2)
        >>> new = torch.arange(1.0, 4.0)[None, None, :, None].expand(1, 1, 3, 2)
        >>> bass.ops.kv_append_packed(kc, vc, new, new, torch.tensor([0, 2, 3], dtype=torch.int32),
        ...                           torch.tensor([1, 0], dtype=torch.int32))
        >>> kc[:, 0, :, 0]
        tensor([[0., 1., 2., 0.],
                [3., 0., 0., 0.]])
    """
    check_no_grad("bass.kv_append_packed", k_new=k_new, v_new=v_new)
    torch.ops.bass.kv_append_packed(k_cache, v_cache, k_new, v_new, cu_q_lens, cache_lens)


def _document() -> None:
    for name, fn in (
        ("ragged_attention_packed", ragged_attention_packed),
        ("kv_append_packed", kv_append_packed),
    ):
        packet = getattr(torch.ops.bass, name)
        try:
            packet.__doc__ = fn.__doc__
            packet.default.__doc__ = fn.__doc__
        except (AttributeError, TypeError):  # pragma: no cover - older torch
            pass


_document()
