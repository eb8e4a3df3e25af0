"""The ``torch.ops.bass`` custom ops ``ragged_attention`` (padded queries),
``ragged_attention_packed`` (the engine's), ``kv_append`` and ``kv_append_packed``,
registered on import (``import bass`` does); contract and implementations: the Ops page
(``docs/reference/ops.md``). Schemas and checks: :mod:`~bass.ops.contract`; the dispatch:
:mod:`~bass.ops.plan`; one module per implementation (``bass ops`` lists them).
"""

from __future__ import annotations

import contextlib

import torch

from .contract import LENGTH_DTYPE, PAD_OUTPUT, QUERY_BUCKETS, bucket_query_len, length_checks
from .plan import PASS_KINDS, Implementation, Plan, implementations, register, resolve

__all__ = [
    "LENGTH_DTYPE",
    "PAD_OUTPUT",
    "PASS_KINDS",
    "QUERY_BUCKETS",
    "Implementation",
    "Plan",
    "bucket_query_len",
    "implementations",
    "kv_append",
    "kv_append_packed",
    "length_checks",
    "ragged_attention",
    "ragged_attention_packed",
    "register",
    "resolve",
]


def ragged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_lens: torch.Tensor,
                     kv_lens: torch.Tensor, scale: float, impl: str = "auto"
                     ) -> torch.Tensor:  # fmt: skip
    """Causal attention of ragged new queries over per-row KV caches.

    ``torch.ops.bass.ragged_attention`` (this function calls it). Row ``b``'s query ``i <
    q_lens[b]`` sits at position ``kv_lens[b] - q_lens[b] + i`` and attends to keys ``0..``
    that position of row ``b``; slots ``i >= q_lens[b]`` are padding (output 0).

    Args:
        q: ``[B, Hq, T, D]`` queries (torch SDPA's and transformers' layout); float16,
            bfloat16, float32 or float64.
        k: ``[B, Hkv, S, D]`` per-row key cache, same dtype; ``Hq`` is a multiple of
            ``Hkv`` (GQA/MQA: query head ``h`` uses KV head ``h // (Hq // Hkv)``).
        v: ``[B, Hkv, S, D]`` per-row value cache. ``flex``, ``pad`` and ``sdpa`` on
            CUDA (and ``auto`` where it picks them: compiled passes) need its slots past
            ``kv_lens[b]`` finite (0 * NaN is NaN): allocate caches with ``torch.zeros``,
            as bass does.
        q_lens: int32 ``[B]``, ``0 <= q_lens[b] <= min(T, kv_lens[b])``.
        kv_lens: int32 ``[B]``, ``kv_lens[b] <= S``; the new keys are already in the cache.
        scale: softmax scale, usually ``D ** -0.5``.
        impl: ``"auto"`` (default) or an implementation's name (:func:`implementations`).

    Returns:
        ``[B, Hq, T, D]`` in q's dtype, contiguous whatever q's strides.

    Inference only (inputs requiring grad raise). Under ``torch.autocast``, q, k and v are
    cast to its dtype first, as SDPA's are. In eager mode the lengths are range-checked on
    the host (:func:`length_checks` turns that off).

    Example (row 0: two new tokens after three cached; row 1: one token, no history)::

        >>> import torch, bass
        >>> q = torch.randn(2, 4, 2, 8)                    # B=2, Hq=4, T=2, D=8
        >>> k, v = torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)  # Hkv=2, S=5
        >>> q_lens = torch.tensor([2, 1], dtype=torch.int32)
        >>> kv_lens = torch.tensor([5, 1], dtype=torch.int32)
        >>> out = torch.ops.bass.ragged_attention(q, k, v, q_lens, kv_lens, 8 ** -0.5)
        >>> out.shape
        torch.Size([2, 4, 2, 8])
        >>> bool((out[1, :, 1] == 0).all())               # row 1's slot 1 is padding
        True
    """
    return torch.ops.bass.ragged_attention(q, k, v, q_lens, kv_lens, scale, impl)


def ragged_attention_packed(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            cu_q_lens: torch.Tensor, kv_lens: torch.Tensor, scale: float,
                            impl: str = "auto") -> torch.Tensor:  # fmt: skip
    """Causal attention of packed new queries over per-row KV caches.

    ``torch.ops.bass.ragged_attention_packed`` (this function calls it). Token ``j`` with
    ``cu_q_lens[b] <= j < cu_q_lens[b+1]`` is row ``b``'s query ``i = j - cu_q_lens[b]`` at
    position ``kv_lens[b] - q_len_b + i`` (``q_len_b = cu_q_lens[b+1] - cu_q_lens[b]``) and
    attends to keys ``0..`` that position of row ``b``. Tokens past ``cu_q_lens[B]`` belong
    to no row (e.g. a CUDA-graph bucket's padding): output 0.

    Args:
        q: ``[1, Hq, N, D]`` packed queries, any strides; float16, bfloat16, float32 or
            float64.
        k: ``[B, Hkv, S, D]`` per-row key cache, q's dtype; ``Hq % Hkv == 0`` (query head
            ``h`` uses KV head ``h // (Hq // Hkv)``).
        v: ``[B, Hkv, S, D]`` per-row value cache; finite past ``kv_lens[b]`` for
            ``flex``, ``pad`` and ``sdpa`` on CUDA (see :func:`ragged_attention`).
        cu_q_lens: int32 ``[B+1]``: ``0 = cu_q_lens[0] <= ... <= cu_q_lens[B] <= N``.
        kv_lens: int32 ``[B]``, ``q_len_b <= kv_lens[b] <= S`` (the new keys are in the
            cache already).
        scale: softmax scale, usually ``D ** -0.5``.
        impl: ``"auto"`` or an implementation's name (``bass ops`` lists them).

    Returns:
        ``[1, Hq, N, D]`` in q's dtype, stored token-major (``out.transpose(1, 2)`` is
        contiguous, so ``out.transpose(1, 2).reshape(1, N, Hq * D)`` copies nothing).

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


def kv_append(k_cache: torch.Tensor, v_cache: torch.Tensor, k_new: torch.Tensor,
              v_new: torch.Tensor, cache_lens: torch.Tensor, new_lens: torch.Tensor
              ) -> None:  # fmt: skip
    """Write a step's new keys and values into per-row caches, in place.

    ``torch.ops.bass.kv_append`` (this function calls it): for ``i < new_lens[b]``,
    ``k_cache[b, :, cache_lens[b] + i] = k_new[b, :, i]`` (and the same for v); nothing
    else changes. The caller advances its lengths itself.

    Args:
        k_cache, v_cache: ``[B, Hkv, S, D]`` preallocated caches (mutated).
        k_new, v_new: ``[B, Hkv, T, D]`` new entries, ``T <= S``; slots
            ``i >= new_lens[b]`` are padding and are ignored.
        cache_lens: int32 ``[B]``, each row's current length.
        new_lens: int32 ``[B]``, ``new_lens[b] <= T`` and
            ``cache_lens[b] + new_lens[b] <= S``.

    Example::

        >>> import torch, bass
        >>> kc, vc = torch.zeros(2, 1, 4, 2), torch.zeros(2, 1, 4, 2)
        >>> new = torch.ones(2, 1, 2, 2)
        >>> bass.ops.kv_append(kc, vc, new, new, torch.tensor([1, 3], dtype=torch.int32),
        ...                    torch.tensor([2, 1], dtype=torch.int32))
        >>> kc[:, 0, :, 0]
        tensor([[0., 1., 1., 0.],
                [0., 0., 0., 1.]])
    """
    torch.ops.bass.kv_append(k_cache, v_cache, k_new, v_new, cache_lens, new_lens)


def kv_append_packed(k_cache: torch.Tensor, v_cache: torch.Tensor, k_new: torch.Tensor,
                     v_new: torch.Tensor, cu_q_lens: torch.Tensor, cache_lens: torch.Tensor
                     ) -> None:  # fmt: skip
    """Write a packed pass's new keys and values into per-row caches, in place.

    ``torch.ops.bass.kv_append_packed`` (this function calls it). Token ``j`` of row ``b``
    goes to slot ``cache_lens[b] + j - cu_q_lens[b]``; padding tokens and every other slot
    are left alone. The caller advances its lengths itself.

    Args:
        k_cache, v_cache: ``[B, Hkv, S, D]`` preallocated caches (mutated).
        k_new, v_new: ``[1, Hkv, N, D]`` packed new entries, any strides.
        cu_q_lens: int32 ``[B+1]`` as in :func:`ragged_attention_packed`.
        cache_lens: int32 ``[B]``, ``cache_lens[b] + q_len_b <= S``.

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


def _document_ops() -> None:
    # Let help(torch.ops.bass.<op>) show the contract, not just the schema.
    for fn in (ragged_attention, ragged_attention_packed, kv_append, kv_append_packed):
        packet = getattr(torch.ops.bass, fn.__name__)
        with contextlib.suppress(AttributeError, TypeError):  # older torch: read-only
            packet.__doc__ = packet.default.__doc__ = fn.__doc__


_document_ops()
