"""Draft sources: a small draft model with its own ragged cache, or n-gram prompt lookup.

A drafter proposes up to ``k_rows[b]`` tokens for every active row of the batch:

* ``tokens`` int64 ``[B, K]`` (K = the step's batch-wide draft length; slots past a row's
  count are padding),
* ``probs`` ``[B, K, V]``: the (warped) distribution each token was drawn from, needed by
  lossless speculative sampling; ``None`` when decoding greedily,
* ``counts`` int64 ``[B]``: how many tokens each row actually proposed.

After the main model has verified them, :meth:`commit` tells the drafter how many of its
proposals each row kept, so it can roll its state back.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import hf
from .cache import RaggedKVCache
from .ops import bucket_query_len, length_hint
from .sampling import SamplingParams, sample, warp_probs


@dataclass
class Proposal:
    tokens: torch.Tensor  # int64 [B, K]
    probs: torch.Tensor | None  # [B, K, V] or None (greedy)
    counts: torch.Tensor  # int64 [B], 0..k_rows[b]


def pad_rows(rows: list[list[int]], width: int, device, pad: int = 0) -> torch.Tensor:
    """``rows`` right-padded with ``pad`` to int64 ``[len(rows), width]``."""
    out = torch.full((len(rows), width), pad, dtype=torch.long)
    for b, r in enumerate(rows):
        if r:
            out[b, : len(r)] = torch.tensor(r, dtype=torch.long)
    return out.to(device)


def choose(logits: torch.Tensor, params: SamplingParams, generator, need_probs: bool):
    """Pick the next token from ``logits`` ``[B, V]``: argmax, or a sample from the warped
    distribution. Returns ``(tokens [B], probs [B, V] or None)``."""
    if params.do_sample:
        probs = warp_probs(logits, params)
        return sample(probs, generator), probs
    probs = torch.softmax(logits.float(), dim=-1) if need_probs else None
    return logits.argmax(dim=-1), probs


class ModelDrafter:
    """Drafting with a small causal LM that shares the main model's vocabulary.

    Bookkeeping (DESIGN.md's invariant, draft side): before a step the draft cache holds
    ``seq[:d_len]``, and ``seq[d_len:]`` (the *pending* tokens, usually one, two after a
    row accepted everything) are fed first. It then feeds each drafted token but the
    last. With ``a`` accepted of ``n`` fed drafts, ``len(seq_before) + min(a, n)`` entries
    stay valid; lowering the length is the whole rollback.
    """

    name = "model"

    def __init__(self, model, impl: str = "auto", forward=None):
        self.model = model
        self.impl = impl
        self.forward = forward or hf.forward_logits
        self.cache: RaggedKVCache | None = None
        self.d_len: list[int] = []

    @property
    def vocab_size(self) -> int:
        return self.model.get_output_embeddings().weight.shape[0]

    def start(self, prompts: list[list[int]], max_len: int, device, vocab_size: int) -> None:
        n_layers = self.model.config.get_text_config().num_hidden_layers
        self.cache = RaggedKVCache(len(prompts), max_len, n_layers, device)
        _, self.prefill_passes = hf.prefill(self.model, self.cache, prompts, self.impl)
        self.d_len = [len(p) for p in prompts]

    def propose(self, seqs, k_rows: list[int], k: int, params, generator, policy) -> Proposal:
        B, device = len(seqs), self.cache.lens.device
        keep_fn = getattr(policy, "keep_drafting", None)
        tokens = torch.zeros(B, k, dtype=torch.long, device=device)
        probs_out = [] if params.do_sample else None
        counts = torch.zeros(B, dtype=torch.long, device=device)  # proposed per row
        fed = torch.zeros(B, dtype=torch.long, device=device)  # drafted tokens fed back
        drafting = torch.tensor([kr > 0 for kr in k_rows], device=device)  # bool [B]
        limit = torch.tensor(k_rows, dtype=torch.long, device=device)  # [B]
        self.started = [kr > 0 for kr in k_rows]
        # 1) the pending tokens of every drafting row, ragged
        pending = [s[d:] if kr > 0 else [] for s, d, kr in zip(seqs, self.d_len, k_rows)]
        inputs = pad_rows(pending, bucket_query_len(max(map(len, pending))), device)
        q_lens = torch.tensor([len(p) for p in pending], dtype=torch.int32, device=device)
        last = (q_lens.long() - 1).clamp(min=0)  # [B] index of each row's last real token
        rows = torch.arange(B, device=device)
        self.draft_passes = 0
        hint = [len(s) + 1 for s in seqs]  # auto's length hint: close enough at every j
        for j in range(k):
            # 2) one draft forward pass; rows that stopped drafting bring no tokens
            with length_hint(hint):
                logits = self.forward(self.model, self.cache, inputs, q_lens, self.impl)
            self.cache.commit(q_lens)
            self.draft_passes += 1
            if j > 0:
                fed = fed + q_lens.long()
            tok, probs = choose(logits[rows, last], params, generator, keep_fn is not None)
            if keep_fn is not None:  # per-row early stop: a refused token is not proposed
                drafting = drafting & keep_fn(probs, j).to(device)
            tokens[:, j] = tok
            if probs_out is not None:
                probs_out.append(probs)
            counts = counts + drafting.long()
            drafting = drafting & (counts < limit)
            if j == k - 1 or not bool(drafting.any()):  # host read: stop when nobody drafts
                break
            q_lens = drafting.to(torch.int32)
            inputs = tok[:, None]
            last = torch.zeros_like(last)
        self.fed = fed.tolist()
        probs = torch.stack(probs_out, dim=1) if probs_out else None
        if probs is not None and probs.shape[1] < k:  # everyone stopped early: pad to K
            pad = probs.new_zeros(B, k - probs.shape[1], probs.shape[-1])
            pad[..., 0] = 1.0  # any valid distribution; slots past counts[b] are never read
            probs = torch.cat([probs, pad], dim=1)
        return Proposal(tokens, probs, counts)

    def commit(self, lens_before: list[int], accepted: list[int]) -> None:
        """Rows that drafted fed their pending tokens and ``fed[b]`` drafts; of those,
        everything up to the accepted prefix stays (``len(seq_before) + min(a, fed)``)."""
        for b, (n, a) in enumerate(zip(lens_before, accepted)):
            if self.started[b]:
                self.d_len[b] = n + min(a, self.fed[b])
        lens = torch.tensor(self.d_len, dtype=torch.int32, device=self.cache.lens.device)
        self.cache.set_lens(lens)

    def select_rows(self, keep: list[int]) -> None:
        self.d_len = [self.d_len[i] for i in keep]
        self.cache.select_rows(torch.tensor(keep, dtype=torch.long, device=self.cache.lens.device))


class NGramDrafter:
    """Prompt-lookup drafting: no draft model.

    For each row, find the most recent earlier occurrence of the row's last ``n`` tokens
    (``n`` from ``max_ngram`` down to ``min_ngram``) in its prompt and text so far, and
    propose the tokens that followed it. Its proposals are deterministic, so under
    sampling their draft distribution is one-hot (acceptance probability = p(token)).
    """

    name = "ngram"
    draft_passes = 0

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.vocab_size = None  # works with any vocabulary

    def start(self, prompts, max_len, device, vocab_size: int) -> None:
        self.device, self.vocab = device, vocab_size

    def lookup(self, seq: list[int], k: int) -> list[int]:
        n_tok = len(seq)
        for n in range(min(self.max_ngram, n_tok - 1), self.min_ngram - 1, -1):
            suffix = seq[n_tok - n :]
            for start in range(n_tok - n - 1, -1, -1):  # most recent match first
                if seq[start : start + n] == suffix:
                    follow = seq[start + n : start + n + k]
                    if follow:
                        return follow
        return []

    def propose(self, seqs, k_rows, k, params, generator, policy) -> Proposal:
        found = [self.lookup(s, kr) if kr > 0 else [] for s, kr in zip(seqs, k_rows)]
        tokens = pad_rows(found, k, self.device)
        counts = torch.tensor([len(f) for f in found], dtype=torch.long, device=self.device)
        probs = None
        if params.do_sample:  # a deterministic proposal: its draft distribution is one-hot
            probs = torch.nn.functional.one_hot(tokens, self.vocab).to(torch.float32)
        return Proposal(tokens, probs, counts)

    def commit(self, lens_before, accepted) -> None:
        pass

    def select_rows(self, keep) -> None:
        pass
