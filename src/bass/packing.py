"""The packed layout of a forward pass: only real tokens, one flat batch with
FlashAttention's varlen offsets, built from host lists and moved to the device in one copy
(:func:`pack`). docs/concepts/engine.md ("The packed layout") explains it, with a worked
example.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

__all__ = ["TOKEN_BUCKETS", "Extra", "PackedPass", "bucket_tokens", "pack"]

# Token counts a static-shape pass (CUDA graphs) is padded to: at most 1.6x the real
# count up to 512 (5 -> 8), a multiple of 512 beyond; few enough that one graph per
# bucket is cheap to capture.
TOKEN_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)


def bucket_tokens(n: int, buckets: Sequence[int] = TOKEN_BUCKETS) -> int:
    """The smallest bucket ``>= n`` (multiples of the largest beyond it).

    >>> bucket_tokens(5), bucket_tokens(13), bucket_tokens(600)
    (8, 16, 1024)
    """
    i = bisect.bisect_left(buckets, n)
    if i < len(buckets):
        return buckets[i]
    top = buckets[-1]
    return -(-n // top) * top


@dataclass
class PackedPass:
    """One packed forward pass, on the device; ``q_lens``, ``starts`` (``cu_q_lens``) and
    ``host_lens`` (``lens``) are the host lists it was built from."""

    input_ids: torch.Tensor | None  # int64 [1, N]; None until set_input_ids
    positions: torch.Tensor  # int64 [1, N]
    cu_q_lens: torch.Tensor  # int32 [B+1]
    lens: torch.Tensor  # int32 [B]: committed lengths before the pass
    kv_lens: torch.Tensor  # int32 [B]
    logits_index: torch.Tensor | None  # int64 [L]: the tokens whose logits are needed; None: all
    real: int  # real tokens (cu_q_lens[B]); N may be larger (bucket padding)
    q_lens: list[int]
    starts: list[int]
    host_lens: list[int] = field(default_factory=list)
    extra: dict[str, torch.Tensor] = field(default_factory=dict)  # pack's extra, as int64 views

    def set_input_ids(self, ids: torch.Tensor) -> None:
        """Set ``input_ids`` from a device tensor of the ``real`` token ids (int64
        ``[real]``), padded with id 0 up to ``N``."""
        pad = self.positions.shape[1] - ids.shape[0]
        if pad:
            ids = torch.cat([ids, ids.new_zeros(pad)])
        self.input_ids = ids.view(1, -1)

    @property
    def tokens(self) -> int:
        """Tokens the dense layers compute (padding included)."""
        return self.positions.shape[1]


@dataclass
class Extra:
    """A caller's int64 values for the device, to ride in a pass's one copy: ``values``
    (flat, row-major) and the ``shape`` of the view they come back as."""

    values: Sequence[int]
    shape: tuple[int, ...]


def pack(
    q_lens: Sequence[int],
    lens: Sequence[int],
    device: torch.device,
    *,
    ids: Sequence[int] | None = None,
    logits_at: Sequence[int] | None = None,
    bucket: Sequence[int] | None = None,
    logits_slots: int | None = None,
    logits_multiple: int = 1,
    extra: Mapping[str, Extra] | None = None,
    separate: bool = False,
) -> PackedPass:
    """Build a :class:`PackedPass` from host lists, with one host-to-device copy.

    Args:
        q_lens: per cache row, how many tokens it feeds this pass (0 for none).
        lens: per cache row, its committed cache length before the pass.
        ids: the ``sum(q_lens)`` token ids, row after row; ``None`` when the caller
            sets ``input_ids`` itself from device tensors (then ``input_ids`` is ``None``).
        logits_at: token indices (into the flat pass) whose logits are needed; ``None``
            keeps all ``N``.
        logits_multiple: pad the rows whose logits are computed to a multiple of this
            (repeats of the first; callers read the first ``len(logits_at)``, or ``N``).
            A device's tuning may ask for it (:mod:`bass.backends`: a CPU BLAS computes 4
            rows of the lm head faster than 2 or 3); 1, the default, pads nothing.
        bucket: a bucket set: pad ``N`` up to a bucket with tokens of no row.
        logits_slots: pad ``logits_at`` to this many entries (repeating index 0) so its
            shape is fixed too (static shapes).
        extra: the caller's other int64 values for this pass, by name (:class:`Extra`);
            they ride in the same copy and come back as ``PackedPass.extra[name]``.
        separate: make each tensor its own allocation (several copies) instead of views
            of one: ``torch.compile`` guards on views' storage offsets, which change
            with every pass's sizes.
    """
    starts = [0] * (len(q_lens) + 1)
    for b, n in enumerate(q_lens):
        starts[b + 1] = starts[b] + n
    real = starts[-1]
    n_tok = bucket_tokens(real, bucket) if bucket is not None else real
    pad = n_tok - real
    pos = [p for n, start in zip(q_lens, lens) for p in range(start, start + n)] + [0] * pad
    head = list(ids) + [0] * pad if ids is not None else []
    kv = [s + n for s, n in zip(lens, q_lens)]
    keep = list(logits_at) if logits_at is not None else []
    if logits_slots is not None and logits_at is not None:
        keep += [0] * (logits_slots - len(keep))
    elif logits_multiple > 1 and (len(keep) if logits_at is not None else n_tok) > 1:
        # a BLAS may compute a few rows more faster than fewer (bass.backends says when)
        if logits_at is None:
            keep, logits_at = list(range(n_tok)), ()
        keep += [keep[0]] * (-len(keep) % logits_multiple)
    B = len(q_lens)
    extra = dict(extra or {})
    more = [t for e in extra.values() for t in e.values]
    if separate:

        def t(values, dtype=torch.int64):
            return torch.tensor(values, dtype=dtype).to(device, non_blocking=True)

        parts = [t(head), t(pos), t(starts, torch.int32), t(list(lens), torch.int32)]
        parts += [t(kv, torch.int32), t(keep), t(more)]
    else:
        # one int64 host tensor, one copy to the device, then views
        flat = torch.tensor([*head, *pos, *starts, *lens, *kv, *keep, *more], dtype=torch.int64)
        flat = flat.to(device, non_blocking=True)
        o1, o2 = len(head), len(head) + n_tok
        o3 = o2 + 3 * B + 1
        small = flat[o2:o3].to(torch.int32)  # the int32 ones in one cast
        parts = [flat[:o1], flat[o1:o2], small[: B + 1], small[B + 1 : 2 * B + 1]]
        parts += [small[2 * B + 1 :], flat[o3 : o3 + len(keep)], flat[o3 + len(keep) :]]
    views, o = {}, 0
    for name, e in extra.items():  # the caller's values, as named views of the last part
        n = len(e.values)
        views[name] = parts[6].narrow(0, o, n).view(e.shape)
        o += n
    return PackedPass(
        input_ids=parts[0].view(1, n_tok) if ids is not None else None,
        positions=parts[1].view(1, n_tok),
        cu_q_lens=parts[2],
        lens=parts[3],
        kv_lens=parts[4],
        logits_index=parts[5] if logits_at is not None else None,
        real=real,
        q_lens=list(q_lens),
        starts=starts,
        host_lens=list(lens),
        extra=views,
    )
