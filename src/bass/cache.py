"""RaggedKVCache: a preallocated KV cache with one length per row, speaking the part of
transformers' ``Cache`` protocol that decoder layers and mask builders use (why:
docs/concepts/design.md, "transformers integration").

``lens`` int32 ``[B]`` counts each row's committed entries; a pass (:meth:`begin_packed`,
or :meth:`begin` padded) appends at ``lens``, attention sees ``lens + q_lens``, and
:meth:`commit` keeps what the caller accepts (a smaller length is the whole rollback).
Buffers are never reallocated, so their ``data_ptr`` is fixed (CUDA graphs).
"""

from __future__ import annotations

import os

import torch

from .backends import available_memory as _available_memory
from .errors import UnsupportedModelError
from .ops import kv_append

#: The share of the free memory the KV caches may take by default, by device type (the
#: rest: weights' copies, activations, logits): :meth:`RaggedKVCache.default_budget`.
KV_MEMORY_SHARE = {"cuda": 0.8, "cpu": 0.5}


class LayerReadsLength(UnsupportedModelError):
    """A layer asked the cache for its length (``get_seq_length(layer_idx)``) inside the
    forward: refused (:func:`bass.hf` names the model)."""

    def __init__(self, layer_idx: int, model: str = "this model"):
        self.layer_idx = layer_idx
        super().__init__(
            f"layer {layer_idx} of {model} asks the cache for its length inside its forward "
            "(cache.get_seq_length(layer_idx), as Llama 4's attention temperature tuning "
            "does); bass's cache holds one length per row, the rows packed into one pass, so "
            "there is no one length to give: this model (with this config) cannot run "
            "through bass"
        )


class RaggedKVCache:
    """Per-layer ``[B, Hkv, S, D]`` key/value buffers plus per-row lengths, allocated by
    each layer's first ``update`` from the shapes and dtype the model produces."""

    is_compileable = True

    def __init__(self, batch_size: int, max_len: int, num_layers: int, device: torch.device):
        if max_len < 1:
            raise ValueError(f"max_len must be >= 1, got {max_len}")
        self.max_len = int(max_len)
        self.num_layers = num_layers
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers
        self.lens = torch.zeros(batch_size, dtype=torch.int32, device=device)  # [B]
        self.q_lens = torch.zeros(batch_size, dtype=torch.int32, device=device)  # [B]
        self.cu_q_lens: torch.Tensor | None = None  # int32 [B+1] during a packed pass
        self.plan = None  # the packed pass's attention plan (bass.ops.Plan), if any

    @staticmethod
    def bytes_per_token(model) -> int:
        """Bytes of keys and values one position of ``model`` takes in a cache (every
        layer; a tensor-parallel rank holds its share of the key/value heads). Values as
        wide as ``v_head_dim`` where the config has one (multi-head latent attention; where
        the cache holds compressed latents instead, this overestimates)."""
        from . import compat

        itemsize = next(model.parameters()).element_size()
        return kv_bytes_per_token(model.config, itemsize, compat.tp_size(model))

    @staticmethod
    def default_budget(device) -> int | None:
        """The KV memory budget on ``device`` when none is given: a share
        (:data:`KV_MEMORY_SHARE`) of its free memory (a CPU host's shared by its
        ``$LOCAL_WORLD_SIZE`` ranks), or ``None`` where that is not known."""
        device = torch.device(device)
        share = KV_MEMORY_SHARE.get(device.type)
        if share is None:
            return None
        if device.type == "cuda":
            free = torch.cuda.mem_get_info(device)[0]
        else:  # one host's memory for every local rank
            free = _available_memory()
            local = os.environ.get("LOCAL_WORLD_SIZE", "1")
            share /= max(1, int(local)) if local.isdigit() else 1
        return None if free is None else int(free * share)

    @property
    def batch_size(self) -> int:
        return self.lens.shape[0]

    @property
    def kv_lens(self) -> torch.Tensor:  # int32 [B]: lengths attention sees this pass
        return self.lens + self.q_lens

    def begin(self, q_lens: torch.Tensor) -> torch.Tensor:
        """Frame a padded forward pass whose row ``b`` brings ``q_lens[b]`` real tokens;
        returns ``kv_lens`` (int32 ``[B]``)."""
        self.q_lens = q_lens.to(dtype=torch.int32)
        self.cu_q_lens = self.plan = None
        return self.kv_lens

    def begin_packed(
        self, cu_q_lens: torch.Tensor, lens: torch.Tensor | None = None, plan=None
    ) -> torch.Tensor:
        """Frame a packed forward pass: row ``b`` brings tokens ``cu_q_lens[b]`` ..
        ``cu_q_lens[b+1] - 1`` of the flat ``[1, N]`` input; returns ``kv_lens``. ``lens``
        (given: replaces the committed lengths first); ``plan``: the pass's
        :class:`bass.ops.Plan`, whose append every layer's :meth:`update` runs."""
        if lens is not None:
            self.lens = lens
        self.plan = plan
        self.cu_q_lens = cu_q_lens
        self.q_lens = cu_q_lens[1:] - cu_q_lens[:-1]
        return self.kv_lens

    def commit(self, keep: torch.Tensor) -> None:
        """Advance each row by ``keep[b]`` (``0 <= keep[b] <= q_lens[b]``) of the entries
        the last pass wrote; the rest are dropped by not being counted."""
        self.lens = self.lens + keep.to(dtype=torch.int32)
        self.q_lens = torch.zeros_like(self.q_lens)
        self.cu_q_lens = self.plan = None

    def compact(self, keep: list[int]) -> None:
        """Keep only rows ``keep`` (ascending row indices), moved to the front in place:
        each buffer becomes a view of its first ``len(keep)`` rows (the same ``data_ptr``).
        Ascending, row ``keep[i] >= i``: the gather reads them before any is overwritten.
        """
        if any(b >= a for a, b in zip(keep[1:], keep)):
            raise ValueError(f"compact needs ascending row indices, got {keep}")
        n = len(keep)
        moved = keep != list(range(n))  # else: a prefix stays where it is
        index = torch.tensor(keep, dtype=torch.long, device=self.lens.device)
        for store in (self.keys, self.values):
            for i, t in enumerate(store):
                if t is not None:  # layers not allocated yet have nothing to move
                    if moved:
                        t[:n].copy_(t.index_select(0, index))
                    store[i] = t[:n]
        self.lens = self.lens.index_select(0, index)
        self.q_lens = torch.zeros_like(self.lens)
        self.cu_q_lens = self.plan = None

    def copy_prefix(self, src: list[int], dst: list[int], length: int) -> None:
        """Rows ``dst`` get the first ``length`` positions of rows ``src`` (pairwise):
        rows whose prompts are equal share one prefill. Their lengths are not set (each
        pass brings the rows' lengths from the host); past a row's own length the copy is
        never read. One host-to-device copy, no sync."""
        index = torch.tensor([*src, *dst], dtype=torch.long)
        src_t, dst_t = index.to(self.lens.device, non_blocking=True).split(len(src))
        for t in (*self.keys, *self.values):
            if t is not None:  # (a layer that never wrote: nothing to copy)
                t[dst_t, :, :length] = t[src_t, :, :length]

    def buffers(self) -> list[torch.Tensor]:
        """Every allocated key and value buffer (tests check their addresses)."""
        return [t for store in (self.keys, self.values) for t in store if t is not None]

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        """Append this pass's keys/values (``[1, Hkv, N, D]`` packed, ``[B, Hkv, T, D]``
        padded) to layer ``layer_idx``; returns its whole ``[B, Hkv, S, D]`` buffers.
        What follows ``layer_idx`` is ignored (:data:`bass.compat.CACHE_UPDATE_EXTRAS`)."""
        if self.keys[layer_idx] is None:  # values may be narrower (MLA's latents)
            for store, new in ((self.keys, key_states), (self.values, value_states)):
                _, H, _, D = new.shape
                store[layer_idx] = new.new_zeros((self.batch_size, H, self.max_len, D))
        k, v = self.keys[layer_idx], self.values[layer_idx]
        if self.plan is not None:
            self.plan.append(k, v, key_states, value_states)
        elif self.cu_q_lens is not None:
            torch.ops.bass.kv_append_packed(
                k, v, key_states, value_states, self.cu_q_lens, self.lens
            )
        else:
            kv_append(k, v, key_states, value_states, self.lens, self.q_lens)
        return k, v

    def get_seq_length(self, layer_idx: int | None = None) -> int:
        # A model's forward asks this (no layer) for default positions and mask sizes; bass
        # always passes explicit per-row positions and masks by lengths, so the buffer size
        # is the honest answer. A layer asking for its own (Llama 4's attention temperature
        # tuning: query scales from the cache's length) would get one length for rows of
        # many: refused, not run on the buffer's size.
        if layer_idx is not None:
            raise LayerReadsLength(layer_idx)
        return self.max_len

    def get_mask_sizes(self, query, layer_idx: int = 0) -> tuple[int, int]:
        # ``query``: cache_position or query_length by version (bass.compat, shim 3)
        return self.max_len, 0

    def get_query_offset(self, layer_idx: int = 0) -> int:
        return 0

    def __len__(self) -> int:
        return self.num_layers


def kv_bytes_per_token(config, itemsize: int, tp: int = 1) -> int:
    """:meth:`RaggedKVCache.bytes_per_token` from a model's ``config`` alone (before its
    weights load): ``itemsize`` bytes per value, ``tp`` ranks sharing the key/value heads."""
    from . import compat

    cfg = config.get_text_config()
    heads = max(1, compat.kv_heads(cfg) // tp)
    k_dim = compat.head_dim(cfg)
    v_dim = compat.config_value(cfg, "v_head_dim") or k_dim
    return cfg.num_hidden_layers * heads * (k_dim + v_dim) * itemsize
