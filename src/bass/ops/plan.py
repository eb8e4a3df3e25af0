"""A packed pass's attention, planned once and run by every layer (FlashInfer's plan/run).

A decoder's forward pass calls attention (and the KV append) once per layer, with the same
lengths each time. Whatever depends only on those lengths (choosing the implementation,
grouping rows for one batched call, building masks and scatter indices) is done once per
pass by :func:`plan_packed`, on the host, from the lengths the engine already holds there;
each layer's :meth:`PackedPlan.attend` and :meth:`PackedPlan.append` then take only
tensors and the plan, and never read the device. That is what lets the per-row SDPA
implementation serve a GPU in eager mode without a device sync per layer.

The plan travels with the pass: :class:`bass.cache.RaggedKVCache` holds it for its
``update`` and hands it to the model's forward as the keyword argument ``bass_plan``,
which transformers passes down to bass's attention function. Compiled passes carry no plan
(a Python object would be guarded on): they call the ops with tensors only.

Worked example: rows feeding 3, 0 and 2 tokens after 4, 4 and 0 cached
(``q_lens = [3, 0, 2]``, ``cache_lens = [4, 4, 0]``): the plan holds ``kv_lens = [7, 4,
2]`` on the host; ``attend`` runs row 0's 3 queries over its first 7 keys and row 2's 2
over its first 2 (one call each, or one batched call when the rows are alike);
``append`` writes row 0's slots 4-6 and row 2's slots 0-1 with one scatter per cache.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["PackedPlan", "plan_packed"]


class PackedPlan:
    """One pass's attention and KV-append work (see the module docstring): a packed pass
    whose row ``b`` brings ``q_lens[b]`` of the ``num_tokens`` tokens after
    ``cache_lens[b]`` cached ones (host lists), with the pass's device tensors
    ``cu_q_lens`` int32 ``[B+1]``, ``cache_lens_t`` and ``kv_lens_t`` int32 ``[B]`` (``kv =
    cache + q``). ``impl``: a packed implementation name or ``"auto"`` (with host lengths:
    the per-row SDPA, on every device); ``self.impl`` is the one that runs, ``self.q_lens``
    and ``self.kv_lens`` host lists ``[B]``.

    >>> import torch
    >>> cu = torch.tensor([0, 3, 3, 5], dtype=torch.int32)
    >>> lens = torch.tensor([4, 4, 0], dtype=torch.int32)
    >>> p = plan_packed("auto", [3, 0, 2], [4, 4, 0], 5, cu, lens, lens + cu.diff())
    >>> p.impl.name, p.kv_lens, p.slots.tolist()
    ('sdpa', [7, 4, 2], [4, 5, 6, 0, 1])
    """

    def __init__(
        self,
        impl: str,
        q_lens: Sequence[int],
        cache_lens: Sequence[int],
        num_tokens: int,
        cu_q_lens: torch.Tensor,
        cache_lens_t: torch.Tensor,
        kv_lens_t: torch.Tensor,
    ):
        from .packed import resolve_packed_implementation

        device = cu_q_lens.device
        self.q_lens = list(q_lens)
        self.kv_lens = [n + q for n, q in zip(cache_lens, q_lens)]
        self.cu_q_lens, self.cache_lens_t, self.kv_lens_t = cu_q_lens, cache_lens_t, kv_lens_t
        self.num_tokens = num_tokens
        if impl == "auto":  # with host lengths, the per-row SDPA runs on any device
            impl = "sdpa"
        self.impl = resolve_packed_implementation(impl, device, planned=True)
        self.cu = [0]
        for n in self.q_lens:
            self.cu.append(self.cu[-1] + n)
        self.device = device
        self._run = self.impl.plan(self) if self.impl.plan is not None else None
        # the real tokens' (row, slot) pairs for the append: one scatter per cache
        rows = [b for b, n in enumerate(self.q_lens) for _ in range(n)]
        slots = [s for n, q in zip(cache_lens, self.q_lens) for s in range(n, n + q)]
        pairs = torch.tensor([rows, slots], dtype=torch.long).reshape(2, -1)
        pairs = pairs.to(device, non_blocking=True)
        self.rows, self.slots, self.real = pairs[0], pairs[1], self.cu[-1]

    @property
    def max_q_len(self) -> int:
        return max(self.q_lens, default=0)

    def attend(self, q, k, v, scale: float) -> torch.Tensor:
        """One layer's attention: q ``[1, Hq, N, D]``; k, v ``[B, Hkv, S, D]`` (this
        pass's keys already appended); returns ``[1, Hq, N, D]`` token-major."""
        if self._run is not None:
            return self._run(q, k, v, scale)
        return self.impl.op(q, k, v, self.cu_q_lens, self.kv_lens_t, scale)

    def append(self, k_cache, v_cache, k_new, v_new) -> None:
        """One layer's KV append: token ``j`` of row ``b`` to slot ``cache_lens[b] + j -
        cu_q_lens[b]`` (``k_new``, ``v_new``: ``[1, Hkv, N, D]``)."""
        real = self.real
        if real == 0:
            return
        for cache, new in ((k_cache, k_new), (v_cache, v_new)):
            vals = new[0] if real == new.shape[2] else new[0].narrow(1, 0, real)
            vals = vals.transpose(0, 1)  # [real, Hkv, D]: what cache[rows, :, slots] is
            cache[self.rows, :, self.slots] = vals.to(cache.dtype)


#: Plan a packed pass (the constructor of :class:`PackedPlan`, under the name hf.py uses).
plan_packed = PackedPlan
