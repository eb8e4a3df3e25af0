"""The repetition penalty (``generate(repetition_penalty=)``): transformers'
``RepetitionPenaltyLogitsProcessor`` over ragged rows. A token that already occurs in a
row (its prompt or its new tokens) has its logit divided by the penalty where positive,
multiplied where negative, before any warping, for the main model's choice (greedy or
sampled) and its processed log-probabilities, and for a draft model's proposals (each
draft position reads the row and the drafts before it, as the main model will).

In a verify pass, position ``i`` of a row reads the row's tokens and its drafts
``d_1..d_i`` (the tokens a plain decoding would have fed before it): so speculation keeps
the penalised distribution exactly, as it keeps the unpenalised one.
"""

from __future__ import annotations

import torch

__all__ = ["SeenTokens", "penalize"]

CHUNK = 256  # verify tokens penalised at a time (bounds the [rows, V] temporaries)


def penalize(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """``logits`` ``[..., V]`` with each token ``seen`` (bool, same shape) penalised as
    transformers' ``RepetitionPenaltyLogitsProcessor`` does it: divided by ``penalty``
    where positive, multiplied where negative; float32 (float64 for float64 ``logits``),
    the dtype transformers' ``generate`` scores in."""
    x = logits.to(_dtype(logits))
    return torch.where(seen, torch.where(x < 0, x * penalty, x / penalty), x)


def _dtype(logits: torch.Tensor) -> torch.dtype:
    return torch.float64 if logits.dtype == torch.float64 else torch.float32


class SeenTokens:
    """Which token ids each cache slot's row holds (prompt and new tokens), a ``[slots,
    V]`` mask on the device brought up to date from the host rows before each pass reads
    it (only the tokens added since; a slot a new prompt took starts over), and the
    penalty it applies (:meth:`first_scores`, :meth:`verify_scores`)."""

    def __init__(self, penalty: float, slots: int, width: int, device):
        self.penalty = penalty
        # one column past the vocabulary: where a verify pass's padding drafts are written
        self.mask = torch.zeros(slots, width + 1, dtype=torch.bool, device=device)
        self.held = [(-1, 0)] * slots  # per slot: (its prompt, its tokens in the mask)

    @classmethod
    def start(cls, penalty: float | None, slots: int, width: int, device) -> SeenTokens | None:
        """The mask of a generation with ``slots`` cache rows; ``None`` without a penalty
        (``None`` or 1.0: nothing to track)."""
        return None if penalty is None or penalty == 1.0 else cls(penalty, slots, width, device)

    def _update(self, state, slots: list[int]) -> torch.Tensor:
        """Add the tokens ``slots``' rows gained since the last update (one small copy to
        the device, no sync); returns ``slots`` on the device."""
        reset, rows, cols = [], [], []
        for s in slots:
            prompt, seq = state.prompt_of[s], state.seqs[s]
            owner, n = self.held[s]
            if owner != prompt:  # admitted here, or moved here by compaction
                reset.append(s)
                n = 0
            rows += [s] * (len(seq) - n)
            cols += seq[n:]
            self.held[s] = (prompt, len(seq))
        host = torch.tensor([*slots, *reset, *rows, *cols], dtype=torch.int64)
        dev = host.to(self.mask.device, non_blocking=True)
        slots_t, reset_t, rows_t, cols_t = dev.split([len(slots), len(reset), len(rows), len(rows)])
        if reset:
            self.mask[reset_t] = False
        if rows:
            self.mask[rows_t, cols_t] = True
        return slots_t

    def rows(self, state, slots: list[int]) -> torch.Tensor:
        """A copy of the masks of ``slots``' rows, ``[R, V+1]`` bool (one column past the
        vocabulary): a drafter adds each token it drafts (``mask[rows, tokens] = True``)
        and penalises its next logits with :meth:`drafts`."""
        return self.mask[self._update(state, slots)]

    def drafts(self, logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """A draft model's logits ``[R', V']`` penalised by the rows' masks ``[R', V+1]``
        (:meth:`rows`, with the drafts so far), over the logits' width."""
        return penalize(logits, mask[:, : logits.shape[-1]], self.penalty)

    def first_scores(self, logits: torch.Tensor, state, fill: list[int]) -> torch.Tensor:
        """The penalised logits ``[F, V]`` of the prompts just prefilled into ``fill``."""
        seen = self.mask[self._update(state, fill), :-1]
        return penalize(logits, seen, self.penalty)

    def verify_scores(self, logits: torch.Tensor, v, state, slots: list[int]) -> torch.Tensor:
        """The penalised logits ``[n, V]`` of a verify pass's tokens (``v``: its
        :class:`bass.verify.VerifyPass`, active rows ``slots``): position ``i`` of a row
        reads the row's tokens and its drafts ``d_1..d_i``."""
        slots_t = self._update(state, slots)
        n, V = logits.shape
        R, K1 = v.index.shape
        dev = logits.device
        row = torch.arange(R, device=dev).repeat_interleave(K1)  # each verify token's row
        owner = torch.empty(n, dtype=torch.int64, device=dev).scatter_(0, v.index.view(-1), row)
        owner = slots_t[owner]  # [n]: each verify token's slot
        # + the drafts before each position (i < j, within the row's drafts)
        i = torch.arange(K1 - 1, device=dev)
        live = (i[None, :] < torch.arange(K1, device=dev)[:, None])[None]  # [1, K+1, K]
        live = live & (i < v.drafted[:, None])[:, None, :]  # [R, K+1, K]
        drafts, at = v.drafts[:, None, :].long(), v.index[:, :, None]  # [R, 1, K], [R, K+1, 1]
        out = torch.empty(n, V, dtype=_dtype(logits), device=dev)
        for lo in range(0, n, CHUNK):  # CHUNK rows at a time: no [n, V] temporaries
            c = min(CHUNK, n - lo)
            seen = self.mask[owner[lo : lo + c]]  # [c, V+1]: what each row holds
            if K1 > 1:  # (entries of other chunks, or past a row's drafts: column V)
                col = torch.where(live & (at >= lo) & (at < lo + c), drafts, V)  # [R, K+1, K]
                flat = (at - lo).clamp(0, c - 1) * (V + 1) + col
                seen.view(-1)[flat.view(-1)] = True
            out[lo : lo + c] = penalize(logits[lo : lo + c], seen[:, :V], self.penalty)
        return out
