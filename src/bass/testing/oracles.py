"""Naive float64 loop oracles of the bass ops' contracts (``docs/reference/ops.md``); how
they judge: docs/reference/testing.md ("The oracles")."""

from __future__ import annotations

import operator
from collections.abc import Sequence

import torch

from ..ops import contract
from ..ops.plan import read_lengths

__all__ = [
    "naive_kv_append",
    "naive_kv_append_packed",
    "naive_ragged_attention",
    "naive_ragged_attention_packed",
]

Lengths = torch.Tensor | Sequence[int]


def _float64(*tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t.detach().cpu().to(torch.float64) for t in tensors]


def _lengths(lengths: Lengths, name: str, device) -> torch.Tensor:
    """``lengths`` (a tensor or a sequence of ints) as the int32 tensor the ops take."""
    if isinstance(lengths, torch.Tensor):
        if lengths.is_floating_point() or lengths.is_complex():
            raise TypeError(f"{name} must hold integers, got {lengths.dtype}")
        return lengths.to(device=device, dtype=torch.int32)
    try:
        return torch.tensor([operator.index(x) for x in lengths], dtype=torch.int32, device=device)
    except TypeError:
        raise TypeError(f"{name} must hold integers, got {lengths!r}") from None


def _contract(op: str, tensors: tuple, lens: tuple, packed: bool, *rest):
    """The ops' own checks (:mod:`bass.ops.contract`) on the oracle's inputs, its lengths
    made int32 tensors: the metadata, then every row's lengths (always: ``length_checks``
    does not apply), so the oracles refuse what the ops refuse, in their words. Returns
    ``(raw, q, other)`` host lists: the first lengths as given (``cu_q_lens`` when
    ``packed``), each row's new-token count, the ``[B]`` lengths."""
    append = op.startswith("naive_kv_append")
    names = ("cu_q_lens" if packed else "new_lens" if append else "q_lens",
             "cache_lens" if append else "kv_lens")  # fmt: skip
    device = getattr(tensors[-1], "device", "cpu")
    first, other = (_lengths(x, name, device) for x, name in zip(lens, names))
    check = contract.check_append if append else contract.check_attention
    check(*tensors, first, other, *rest, packed=packed)
    N = tensors[2 if append else 0].shape[2]  # the new entries' or queries' tokens
    S = tensors[0 if append else 1].shape[2]  # the caches' slots
    T = None if packed else N
    return read_lengths(op, first, other, N, S, packed, T, append, host=True, check=True)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_len: int, group: int, scale):
    """One row's queries ``[Hq, n, D]``, the last ``n`` positions before ``kv_len``, each
    over keys/values ``[Hkv, S, D]`` 0..its position of KV head ``h // group``."""
    out = torch.zeros_like(q)
    for h in range(q.shape[0]):
        for i in range(q.shape[1]):
            position = kv_len - q.shape[1] + i
            keys, values = k[h // group, : position + 1], v[h // group, : position + 1]
            out[h, i] = torch.softmax((keys @ q[h, i]) * scale, dim=0) @ values
    return out


def naive_ragged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_lens: Lengths,
    kv_lens: Lengths,
    scale: float,
) -> torch.Tensor:
    """What ``torch.ops.bass.ragged_attention(q, k, v, q_lens, kv_lens, scale)`` returns.

    Row ``b``'s query ``i < q_lens[b]`` sits at absolute position
    ``kv_lens[b] - q_lens[b] + i`` and attends to keys ``0..`` that position of row ``b``;
    query head ``h`` uses KV head ``h // (Hq // Hkv)``. Slots ``i >= q_lens[b]`` are 0.

    Args:
        q: ``[B, Hq, T, D]`` any float dtype, any strides; q, k, v on one device.
        k, v: ``[B, Hkv, S, D]``; ``Hq`` a multiple of ``Hkv``.
        q_lens, kv_lens: int ``[B]`` (tensors or sequences),
            ``0 <= q_lens[b] <= min(T, kv_lens[b])``, ``kv_lens[b] <= S``.
        scale: the softmax scale.

    Returns:
        ``[B, Hq, T, D]`` float64 on the CPU, computed from the inputs upcast to float64.

    >>> import torch
    >>> q, k, v = torch.ones(1, 2, 2, 4), torch.ones(1, 1, 3, 4), torch.arange(12.).view(1, 1, 3, 4)
    >>> out = naive_ragged_attention(q, k, v, [1], [2], 0.5)  # one query, at position 1
    >>> out[0, :, 0].tolist()  # equal scores: the mean of values 0 and 1, for both heads
    [[2.0, 3.0, 4.0, 5.0], [2.0, 3.0, 4.0, 5.0]]
    >>> bool((out[0, :, 1] == 0).all())  # slot 1 is padding
    True
    """
    _, q_lens, kv_lens = _contract(
        "naive_ragged_attention", (q, k, v), (q_lens, kv_lens), False, scale
    )
    q, k, v = _float64(q, k, v)
    B, Hq, T, D = q.shape
    group = Hq // k.shape[1]
    out = torch.zeros(B, Hq, T, D, dtype=torch.float64)
    for b in range(B):
        q_len, kv_len = q_lens[b], kv_lens[b]
        out[b, :, :q_len] = _attend(q[b, :, :q_len], k[b], v[b], kv_len, group, scale)
    return out


def naive_ragged_attention_packed(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_q_lens: Lengths,
    kv_lens: Lengths,
    scale: float,
) -> torch.Tensor:
    """What ``torch.ops.bass.ragged_attention_packed(q, k, v, cu_q_lens, kv_lens, scale)``
    returns.

    Token ``j`` with ``cu_q_lens[b] <= j < cu_q_lens[b+1]`` is row ``b``'s query
    ``i = j - cu_q_lens[b]``, at absolute position ``kv_lens[b] - q_len_b + i``
    (``q_len_b = cu_q_lens[b+1] - cu_q_lens[b]``), attending causally to keys ``0..`` that
    position of row ``b``; query head ``h`` uses KV head ``h // (Hq // Hkv)``. Tokens
    ``j >= cu_q_lens[B]`` are padding: their output is 0.

    Args:
        q: ``[1, Hq, N, D]`` packed queries, any float dtype, device and strides.
        k, v: ``[B, Hkv, S, D]`` per-row caches.
        cu_q_lens: int ``[B+1]``: ``0 = cu_q_lens[0] <= ... <= cu_q_lens[B] <= N``.
        kv_lens: int ``[B]``, ``q_len_b <= kv_lens[b] <= S``.
        scale: the softmax scale.

    Returns:
        ``[1, Hq, N, D]`` float64 on the CPU.

    >>> import torch
    >>> q, k = torch.ones(1, 1, 3, 2), torch.ones(2, 1, 4, 2)
    >>> v = torch.arange(16.).view(2, 1, 4, 2)
    >>> out = naive_ragged_attention_packed(q, k, v, [0, 0, 2], [3, 2], 1.0)  # token 2: padding
    >>> out[0, 0].tolist()  # row 1's queries at positions 0 and 1, then padding
    [[8.0, 9.0], [9.0, 10.0], [0.0, 0.0]]
    """
    cu, _, kv_lens = _contract(
        "naive_ragged_attention_packed",
        (q, k, v),
        (cu_q_lens, kv_lens),
        True,
        scale,
    )
    q, k, v = _float64(q, k, v)
    _, Hq, N, D = q.shape
    group = Hq // k.shape[1]
    out = torch.zeros(1, Hq, N, D, dtype=torch.float64)
    for b in range(k.shape[0]):
        rows = slice(cu[b], cu[b + 1])
        out[0, :, rows] = _attend(q[0, :, rows], k[b], v[b], kv_lens[b], group, scale)
    return out


def naive_kv_append(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    cache_lens: Lengths,
    new_lens: Lengths,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The caches ``torch.ops.bass.kv_append(k_cache, v_cache, k_new, v_new, cache_lens,
    new_lens)`` must leave: copies of the inputs with ``cache[b, :, cache_lens[b] + i] =
    new[b, :, i]`` for every ``i < new_lens[b]``; nothing else changes.

    Args:
        k_cache, v_cache: ``[B, Hkv, S, D]`` (not modified).
        k_new, v_new: ``[B, Hkv, T, D]``; slots ``i >= new_lens[b]`` are never read.
        cache_lens, new_lens: int ``[B]``, ``new_lens[b] <= T``,
            ``cache_lens[b] + new_lens[b] <= S``.

    Returns:
        ``(k_expected, v_expected)``: new tensors, the caches' dtype and device.
    """
    _, new_lens, cache_lens = _contract(
        "naive_kv_append",
        (k_cache, v_cache, k_new, v_new),
        (new_lens, cache_lens),
        False,
    )
    k_expected, v_expected = k_cache.clone(), v_cache.clone()
    for b in range(k_cache.shape[0]):
        start, n = cache_lens[b], new_lens[b]
        k_expected[b, :, start : start + n] = k_new[b, :, :n]
        v_expected[b, :, start : start + n] = v_new[b, :, :n]
    return k_expected, v_expected


def naive_kv_append_packed(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    cu_q_lens: Lengths,
    cache_lens: Lengths,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The caches ``torch.ops.bass.kv_append_packed(k_cache, v_cache, k_new, v_new,
    cu_q_lens, cache_lens)`` must leave: token ``j`` of row ``b``
    (``cu_q_lens[b] <= j < cu_q_lens[b+1]``) at slot ``cache_lens[b] + j - cu_q_lens[b]``
    of row ``b``; padding tokens (``j >= cu_q_lens[B]``) and every other slot change
    nothing.

    Args:
        k_cache, v_cache: ``[B, Hkv, S, D]`` (not modified).
        k_new, v_new: ``[1, Hkv, N, D]`` packed new entries.
        cu_q_lens: int ``[B+1]`` as in :func:`naive_ragged_attention_packed`.
        cache_lens: int ``[B]``, ``cache_lens[b] + q_len_b <= S``.

    Returns:
        ``(k_expected, v_expected)``: new tensors, the caches' dtype and device.

    >>> import torch
    >>> kc = torch.zeros(2, 1, 4, 1)
    >>> new = torch.tensor([1., 2., 3., 9.]).view(1, 1, 4, 1)  # token 3 is padding
    >>> k, _ = naive_kv_append_packed(kc, kc.clone(), new, new, [0, 2, 3], [1, 0])
    >>> k[:, 0, :, 0].tolist()
    [[0.0, 1.0, 2.0, 0.0], [3.0, 0.0, 0.0, 0.0]]
    """
    cu, q_lens, cache_lens = _contract(
        "naive_kv_append_packed",
        (k_cache, v_cache, k_new, v_new),
        (cu_q_lens, cache_lens),
        True,
    )
    k_expected, v_expected = k_cache.clone(), v_cache.clone()
    for b in range(k_cache.shape[0]):
        start, n = cache_lens[b], q_lens[b]
        k_expected[b, :, start : start + n] = k_new[0, :, cu[b] : cu[b + 1]]
        v_expected[b, :, start : start + n] = v_new[0, :, cu[b] : cu[b + 1]]
    return k_expected, v_expected
