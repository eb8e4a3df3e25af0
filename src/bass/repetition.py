"""The repetition penalty (``generate(repetition_penalty=)``): transformers'
``RepetitionPenaltyLogitsProcessor`` over ragged rows. A token that already occurs in a
row (its prompt or its new tokens) has its logit divided by the penalty where positive,
multiplied where negative, before any warping, for the main model's choice (greedy or
sampled) and its processed log-probabilities; the draft model proposes without it.

In a verify pass, position ``i`` of a row reads the row's tokens and its drafts
``d_1..d_i`` (the tokens a plain decoding would have fed before it): so speculation keeps
the penalised distribution exactly, as it keeps the unpenalised one.
"""

from __future__ import annotations

import torch

__all__ = ["SeenTokens", "penalize"]


def penalize(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """``logits`` ``[..., V]`` with each token ``seen`` (bool, same shape) penalised as
    transformers' ``RepetitionPenaltyLogitsProcessor`` does it: divided by ``penalty``
    where positive, multiplied where negative; float32 (float64 for float64 ``logits``),
    the dtype transformers' ``generate`` scores in."""
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    x = logits.to(dtype)
    return torch.where(seen, torch.where(x < 0, x * penalty, x / penalty), x)


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
        seen = self.mask[slots_t[owner]]  # [n, V+1]: what each row holds
        if K1 > 1:  # + the drafts before each position (i < j, within the row's drafts);
            i = torch.arange(K1 - 1, device=dev)  # the others written past the vocabulary
            live = (i[None, :] < torch.arange(K1, device=dev)[:, None])[None]  # [1, K+1, K]
            live = live & (i < v.drafted[:, None])[:, None, :]  # [R, K+1, K]
            col = torch.where(live, v.drafts[:, None, :].long(), V)  # [R, K+1, K]
            seen.view(-1)[(v.index[:, :, None] * (V + 1) + col).view(-1)] = True
        return penalize(logits, seen[:, :V], self.penalty)
