"""Penalties on what a row already holds, before any warping, for the main model's choice
(greedy or sampled), its processed log-probabilities and a draft model's proposals:

- ``repetition_penalty`` (transformers' ``RepetitionPenaltyLogitsProcessor``): the logit
  of a token already in the row (its prompt or its new tokens) divided by the penalty
  where positive, multiplied where negative;
- then ``frequency_penalty`` and ``presence_penalty`` (OpenAI's and vLLM's): the logit of
  a token that occurs ``c`` times among the row's *new* tokens lowered by ``frequency *
  c``, and by ``presence`` if ``c > 0``.

In a verify pass, position ``i`` of a row reads the row's tokens and its drafts
``d_1..d_i`` (the tokens a plain decoding would have fed before it), and so does a draft
model's ``i``-th proposal: speculation keeps the penalised distribution exactly, as it
keeps the unpenalised one.
"""

from __future__ import annotations

import torch

__all__ = ["PENALTIES", "SeenTokens", "occurrences", "penalize"]

#: The penalties' options (``generate`` keywords, ``[generation]`` keys).
PENALTIES = ("repetition_penalty", "frequency_penalty", "presence_penalty")

CHUNK = 256  # verify tokens penalised at a time (bounds the [rows, V] temporaries)


def penalize(
    logits: torch.Tensor,
    seen: torch.Tensor | None,
    penalty: float | None,
    counts: torch.Tensor | None = None,
    frequency: float = 0.0,
    presence: float = 0.0,
) -> torch.Tensor:
    """``logits`` ``[..., V]`` penalised: each token ``seen`` (bool, same shape; the
    prompt's and the new tokens) as transformers' ``RepetitionPenaltyLogitsProcessor``
    does it, divided by ``penalty`` where positive, multiplied where negative (``None``:
    not); then lowered by ``frequency * counts`` and by ``presence`` where ``counts > 0``
    (``counts``: each token's occurrences among the new tokens, any integer dtype, same
    shape), as vLLM applies them. float32 (float64 for float64 ``logits``), the dtype
    transformers' ``generate`` scores in."""
    dtype = _float(logits)
    x = logits.to(dtype)
    if seen is not None and penalty is not None:
        x = torch.where(seen, torch.where(x < 0, x * penalty, x / penalty), x)
    if counts is not None and frequency:
        x = x - frequency * counts.to(dtype)
    if counts is not None and presence:
        x = x - presence * (counts > 0).to(dtype)
    return x


def occurrences(ids: torch.Tensor, width: int) -> torch.Tensor:
    """Each token's count among ``ids`` ``[..., n]``: ``[..., width]`` int64 (an id past
    ``width``, with no logit, counts nowhere). ``> 0`` is :func:`penalize`'s ``seen`` of
    tokens ``ids``; the new tokens' counts are its ``counts``."""
    out = torch.zeros(*ids.shape[:-1], width + 1, dtype=torch.int64, device=ids.device)
    ids = ids.long().clamp(max=width)
    return out.scatter_add_(-1, ids, torch.ones_like(ids))[..., :width]


def _float(logits: torch.Tensor) -> torch.dtype:
    return torch.float64 if logits.dtype == torch.float64 else torch.float32


class SeenTokens:
    """What each cache slot's row holds, on the device: a ``[slots, V+1]`` mask of its
    tokens (prompt and new ones) for a repetition penalty, and ``[slots, V+1]`` counts of
    its new tokens for frequency and presence penalties (each only where its penalty is
    on; one column past the vocabulary, where padding drafts are written), brought up to
    date from the host rows before each pass reads them (only the tokens added since; a
    slot a new prompt took starts over); and the penalties they apply
    (:meth:`first_scores`, :meth:`verify_scores`, and a drafter's :meth:`rows`,
    :meth:`drafts`, :meth:`drafted`)."""

    def __init__(self, params, slots: int, width: int, device):
        self.penalty, self.frequency, self.presence = _active(params)
        shape = (slots, width + 1)
        self.mask = self.counts = None
        if self.penalty is not None:
            self.mask = torch.zeros(shape, dtype=torch.bool, device=device)
        if self.frequency or self.presence:
            self.counts = torch.zeros(shape, dtype=torch.int32, device=device)
        self.device, self.width = device, width
        self.held = [(-1, 0)] * slots  # per slot: (its prompt, its tokens counted)
        self.last = (None, None)  # the slots of the last update, on the device

    @classmethod
    def start(cls, params, slots: int, width: int, device) -> SeenTokens | None:
        """The state of a generation with ``slots`` cache rows and ``params``' penalties
        (a :class:`bass.sampling.SamplingParams`); ``None`` without any (nothing to
        track)."""
        return cls(params, slots, width, device) if any(_active(params)) else None

    def _update(self, state, slots: list[int]) -> torch.Tensor:
        """Add the tokens ``slots``' rows gained since the last update (one small copy to
        the device, no sync); returns ``slots`` on the device."""
        reset, rows, cols, new_rows, new_cols = [], [], [], [], []
        for s in slots:
            prompt, seq = state.prompt_of[s], state.seqs[s]
            owner, n = self.held[s]
            if owner != prompt:  # admitted here, or moved here by compaction
                reset.append(s)
                n = 0
            # (a prompt id past the logits' width, the input embeddings': no logit to penalise)
            first_new = max(n, len(seq) - len(state.outputs[prompt]))  # past the prompt
            for to_rows, to_cols, start in ((rows, cols, n), (new_rows, new_cols, first_new)):
                ids = [t for t in seq[start:] if t < self.width]
                to_rows += [s] * len(ids)
                to_cols += ids
            self.held[s] = (prompt, len(seq))
        if not (reset or rows or new_rows) and self.last[0] == tuple(slots):
            return self.last[1]  # (a drafter's update this step already brought them)
        parts = [slots, reset, rows, cols, new_rows, new_cols]
        host = torch.tensor([t for p in parts for t in p], dtype=torch.int64)
        dev = host.to(self.device, non_blocking=True).split([len(p) for p in parts])
        slots_t, reset_t, rows_t, cols_t, new_rows_t, new_cols_t = dev
        if self.mask is not None:
            self.mask[reset_t] = False
            self.mask[rows_t, cols_t] = True
        if self.counts is not None:
            self.counts[reset_t] = 0
            one = torch.ones((), dtype=torch.int32, device=self.device)
            self.counts.index_put_((new_rows_t, new_cols_t), one.expand(len(new_rows)), True)
        self.last = (tuple(slots), slots_t)
        return slots_t

    def _gather(self, slots_t: torch.Tensor) -> tuple:
        """Copies of the rows of ``slots_t``: ``(mask, counts)``, each ``None`` where off."""
        return tuple(None if t is None else t[slots_t] for t in (self.mask, self.counts))

    def _apply(self, logits: torch.Tensor, seen: tuple) -> torch.Tensor:
        V = logits.shape[-1]
        mask, counts = (None if t is None else t[:, :V] for t in seen)
        return penalize(logits, mask, self.penalty, counts, self.frequency, self.presence)

    def _add(self, seen: tuple, rows: torch.Tensor, cols: torch.Tensor) -> None:
        """Add tokens ``cols`` (new ones) to rows ``rows`` of ``seen`` (any shapes, equal;
        duplicates counted)."""
        mask, counts = seen
        if mask is not None:
            mask[rows, cols] = True
        if counts is not None:
            one = torch.ones((), dtype=counts.dtype, device=counts.device)
            counts.index_put_((rows.reshape(-1), cols.reshape(-1)), one.expand(rows.numel()), True)

    def rows(self, state, slots: list[int]) -> tuple:
        """What ``slots``' rows hold, copied for a drafter: it penalises its logits with
        :meth:`drafts` and adds each token it drafts with :meth:`drafted`."""
        return self._gather(self._update(state, slots))

    def drafts(self, logits: torch.Tensor, seen: tuple, index: torch.Tensor) -> torch.Tensor:
        """A draft model's logits ``[R', V']`` for rows ``index`` of ``seen`` (:meth:`rows`,
        with the drafts so far) penalised, over the logits' width."""
        return self._apply(logits, tuple(None if t is None else t[index] for t in seen))

    def drafted(self, seen: tuple, index: torch.Tensor, tokens: torch.Tensor) -> None:
        """Rows ``index`` of ``seen`` drafted ``tokens`` (one each)."""
        self._add(seen, index, tokens)

    def first_scores(self, logits: torch.Tensor, state, fill: list[int]) -> torch.Tensor:
        """The penalised logits ``[F, V]`` of the prompts just prefilled into ``fill``."""
        return self._apply(logits, self._gather(self._update(state, fill)))

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
        # + the drafts before each position j: d_i, i < j <= the row's drafts (the positions
        # past them repeat its last logits row: not counted again)
        i, j = torch.arange(K1 - 1, device=dev), torch.arange(K1, device=dev)[:, None]
        live = (i < j)[None] & (j <= v.drafted[:, None, None])  # [R, K+1, K]
        drafts, at = v.drafts[:, None, :].long(), v.index[:, :, None]  # [R, 1, K], [R, K+1, 1]
        out = torch.empty(n, V, dtype=_float(logits), device=dev)
        for lo in range(0, n, CHUNK):  # CHUNK rows at a time: no [n, V] temporaries
            c = min(CHUNK, n - lo)
            seen = self._gather(owner[lo : lo + c])  # [c, V+1] each: what each row holds
            if K1 > 1:  # (entries of other chunks, or past a row's drafts: column V)
                col = torch.where(live & (at >= lo) & (at < lo + c), drafts, V)  # [R, K+1, K]
                self._add(seen, (at - lo).clamp(0, c - 1).expand_as(col), col)
            out[lo : lo + c] = self._apply(logits[lo : lo + c], seen)
        return out


def _active(params) -> tuple:
    """``(repetition, frequency, presence)`` penalties of ``params`` that change logits:
    ``None`` / ``0.0`` for each that is off."""
    rep = params.repetition_penalty
    return (
        None if rep in (None, 1) else rep,
        params.frequency_penalty or 0.0,
        params.presence_penalty or 0.0,
    )
