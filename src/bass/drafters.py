"""Draft sources: a small draft model with its own ragged cache, or n-gram prompt lookup.

A drafter proposes up to ``k_rows[r]`` tokens for every active row ``r`` of the batch
(the engine's per-row draft lengths) and returns a :class:`Proposal`:

* ``counts`` (host ``list[int]``): how many tokens each row actually proposed;
* ``tokens``: int64 ``[R, K]`` on the device (``K = max(k_rows)``; slots past a row's
  count are padding), or ``host_tokens`` (``list[list[int]]``) when the drafter works on
  the host (n-grams: the engine then builds the device copy with the pass's other
  inputs);
* ``probs`` ``[R, K, V]``: the (warped) distribution each token was drawn from, needed by
  lossless speculative sampling; ``None`` when decoding greedily (and for n-grams, whose
  deterministic proposals the engine verifies against its own keyed draws:
  :func:`bass.sampling.keyed_accept`);
* ``bad`` bool ``[R]`` on the device: rows whose draft logits were not finite (read with
  the step's one host read).

Before the policy decides, :meth:`NGramDrafter.signals` reports what the drafter can
offer per row (the continuation it found and the length of the matched suffix), so a
policy can give each row the length its match supports. After the main model has verified
the drafts, ``commit`` tells the drafter how many of its proposals each row kept, so it
can roll its state back.
"""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass

import torch

from . import hf
from .cache import RaggedKVCache
from .packing import pack
from .sampling import SamplingParams, sample, warp_probs


@dataclass
class Proposal:
    counts: list[int]  # per active row, 0..k_rows[r]
    tokens: torch.Tensor | None = None  # int64 [R, K] on the device (model drafts)
    host_tokens: list[list[int]] | None = None  # per active row (n-gram drafts)
    probs: torch.Tensor | None = None  # [R, K, V] or None
    bad: torch.Tensor | None = None  # bool [R]: non-finite draft logits
    passes: int = 0  # draft-model forward passes
    pass_tokens: tuple[int, ...] = ()  # tokens each draft pass computed
    forward_seconds: float = 0.0


@dataclass
class Signals:
    """What a drafter can offer each active row before the policy decides."""

    available: list[int]  # tokens it found to propose (n-gram continuation length)
    match_len: list[int]  # length of the matched suffix (0: no match)


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


def nonfinite(logits: torch.Tensor) -> torch.Tensor:
    """bool ``[...]``: positions of ``logits`` ``[..., V]`` that are unusable: any NaN or
    +Inf, or every logit -Inf (a single -Inf is a masked token and fine). One reduction
    (``amax`` propagates NaN) and no host sync."""
    return ~torch.isfinite(logits.amax(dim=-1))


class ModelDrafter:
    """Drafting with a small causal LM that shares the main model's vocabulary.

    ``tokens``: the ids the draft may propose (default: all of its logits) and
    ``out_vocab``: the width of the distributions it hands the verifier (the main model's
    logits; default: its own). They differ for a tokenizer whose embedding matrices were
    padded to different sizes (Qwen2.5 7B+ and 0.5B-3B: 152064 and 151936 rows, 151665
    tokens): the draft then proposes only real tokens, its distribution is zero elsewhere,
    and a main-model token the draft cannot embed (a padding id, which a trained model
    never emits) is fed to it as id 0: a wrong context only makes its drafts worse, and
    verification keeps the output exact either way.

    Bookkeeping (DESIGN.md's invariant, draft side): before a step the draft cache holds
    ``seq[:d_len]`` of each row, and ``seq[d_len:]`` (the *pending* tokens, usually one,
    two after a row accepted everything) are fed first. It then feeds each drafted token
    but the last. With ``a`` accepted of ``fed`` fed drafts, ``len(seq_before) +
    min(a, fed)`` entries stay valid; lowering the length is the whole rollback.

    Every draft pass is packed (:mod:`bass.packing`): only the rows still drafting bring
    tokens, so a row whose draft length is reached costs the pass nothing.
    """

    name = "model"

    def __init__(
        self,
        model,
        impl: str = "auto",
        forward=None,
        tokens: int | None = None,
        out_vocab: int | None = None,
    ):
        self.model = model
        rows = _vocab_size(model)
        self.tokens = rows if tokens is None else tokens
        self.out_vocab = rows if out_vocab is None else out_vocab
        self.in_vocab = model.get_input_embeddings().weight.shape[0]
        self.impl = impl
        self.forward = forward or hf.forward_packed
        self.cache: RaggedKVCache | None = None
        self.d_len: list[int] = []  # per cache row: committed draft-cache length (host)
        self.bucket = None  # a token bucket set: static shapes (CUDA graphs)
        self.logits_slots: int | None = None
        self.separate = False  # standalone tensors per pass (compiled forward)
        self.logits_multiple: int | None = None  # pack()'s; 1 with a calibrated lm head
        self.route = True  # linear layers in their bass.cpu_linear layouts (if installed)

    @property
    def vocab_size(self) -> int:
        """The width of the draft distributions it proposes from (the main model's)."""
        return self.out_vocab

    def start(self, prompts: list[list[int]], max_len: int, device, chunk_tokens: int) -> int:
        """Prefill the draft model; returns its number of passes."""
        n_layers = self.model.config.get_text_config().num_hidden_layers
        self.cache = RaggedKVCache(len(prompts), max_len, n_layers, device)
        _, passes = hf.prefill(
            self.model, self.cache, prompts, self.impl, chunk_tokens=chunk_tokens, route=self.route
        )
        self.d_len = [len(p) for p in prompts]
        self.prefill_passes = passes
        return passes

    def _pass(self, q_lens, ids, logits_at):
        """One packed draft pass; ``ids`` a host list or an int64 device tensor."""
        host = not isinstance(ids, torch.Tensor)
        batch = pack(
            q_lens,
            self.d_len,
            self.cache.lens.device,
            ids=ids if host else None,
            logits_at=logits_at,
            logits_multiple=self.logits_multiple,
            bucket=self.bucket,
            logits_slots=self.logits_slots,
            separate=self.separate,
        )
        if not host:
            batch.set_input_ids(ids)
        logits = hf.run_packed(self.forward, self.model, self.cache, batch, self.impl, self.route)
        for b, n in enumerate(q_lens):  # the pass's tokens are committed (host lengths)
            self.d_len[b] += n
        return logits[: len(logits_at)], batch.tokens

    def propose(
        self, slots: list[int], seqs, k_rows: list[int], params, generator, policy
    ) -> Proposal:
        """Draft for the active rows in cache rows ``slots`` (ascending; ``seqs[r]`` is
        active row ``r``'s prompt plus committed tokens), at most ``k_rows[r]`` tokens
        each."""
        R, K = len(slots), max(k_rows)
        device = self.cache.lens.device
        keep_fn = getattr(policy, "keep_drafting", None)
        # a keep_drafting(probs, index, rows=...) learns which active row each probs row is
        keep_rows = keep_fn is not None and "rows" in inspect.signature(keep_fn).parameters
        tokens = torch.zeros(R, K, dtype=torch.long, device=device)
        probs_out = None  # [R, K, V] when sampling, allocated at the first pass
        bad = torch.zeros(R, dtype=torch.bool, device=device)
        counts = [0] * R
        self.fed = [0] * R  # drafted tokens fed back per active row
        self.before = [len(s) for s in seqs]
        self.started = [k > 0 for k in k_rows]
        live = [r for r in range(R) if k_rows[r] > 0]  # rows drafting this pass
        # 1) the first pass feeds each drafting row's pending tokens (1, or 2 after the
        #    row accepted every draft: the draft never fed its last one). Active rows'
        #    cache slots ascend, so the packed tokens follow the cache's row order.
        q_lens = [0] * self.cache.batch_size
        ids: list[int] | torch.Tensor = []
        last: list[int] = []
        for r in live:
            pending = seqs[r][self.d_len[slots[r]] :]
            if self.in_vocab < self.out_vocab:  # a main-model id the draft cannot embed
                pending = [t if t < self.in_vocab else 0 for t in pending]
            q_lens[slots[r]] = len(pending)
            ids += pending
            last.append(len(ids) - 1)
        order = live
        passes, pass_tokens, fwd = 0, [], 0.0
        tok = None
        for j in range(K):
            # 2) one packed draft pass over the rows still drafting
            t0 = time.perf_counter()
            logits, computed = self._pass(q_lens, ids, last)  # [len(order), V]
            fwd += time.perf_counter() - t0
            passes += 1
            pass_tokens.append(computed)
            index = torch.tensor(order, dtype=torch.long).to(device, non_blocking=True)
            if logits.shape[-1] > self.tokens:  # padding rows: never proposed
                logits = logits[..., : self.tokens]
            bad[index] |= nonfinite(logits)
            tok, probs = choose(logits, params, generator, keep_fn is not None)
            if params.do_sample:
                if probs_out is None:  # the main model's width (zero past the draft's)
                    probs_out = probs.new_zeros(R, K, self.out_vocab)
                probs_out[index, j, : probs.shape[-1]] = probs
            tokens[index, j] = tok
            if keep_fn is not None:  # per-row early stop: a refused token is not proposed
                keep = keep_fn(probs, j, rows=order) if keep_rows else keep_fn(probs, j)
                keep = keep.to(device)
                ok = keep.tolist()  # host read: which rows go on (only with keep_drafting)
            else:
                ok = [True] * len(order)
            nxt, sel = [], []
            for i, r in enumerate(order):
                if not ok[i]:
                    continue
                counts[r] += 1
                if counts[r] < k_rows[r]:
                    nxt.append(r)
                    sel.append(i)
            if not nxt or j == K - 1:
                break
            # 3) rows still drafting feed the token they just drafted
            q_lens = [0] * self.cache.batch_size
            for r in nxt:
                q_lens[slots[r]] = 1
                self.fed[r] += 1
            ids = tok[torch.tensor(sel, dtype=torch.long).to(device, non_blocking=True)]
            order, last = nxt, list(range(len(nxt)))
        if probs_out is not None:
            # slots past a row's count are never read, but must hold a valid distribution
            probs_out[..., 0] += (probs_out.sum(-1) == 0).to(probs_out.dtype)
        return Proposal(
            counts=counts,
            tokens=tokens,
            probs=probs_out,
            bad=bad,
            passes=passes,
            pass_tokens=tuple(pass_tokens),
            forward_seconds=fwd,
        )

    def commit(self, slots: list[int], accepted: list[int]) -> None:
        """Rows that drafted fed their pending tokens and ``fed[r]`` drafts; of those,
        everything up to the accepted prefix stays (``len(seq_before) + min(a, fed)``)."""
        for r, a in enumerate(accepted):
            if self.started[r]:
                self.d_len[slots[r]] = self.before[r] + min(a, self.fed[r])

    def compact(self, keep: list[int]) -> None:
        self.d_len = [self.d_len[b] for b in keep]
        self.cache.compact(keep)


class NGramDrafter:
    """Prompt-lookup drafting: no draft model.

    For each row, find the most recent earlier occurrence of the row's last ``n`` tokens
    (``n`` from ``max_ngram`` down to ``min_ngram``) in its prompt and text so far, and
    propose the tokens that followed it. With ``siblings=True`` (the default) rows that
    share a prompt (``n`` samples of one prompt, the multi-response case BASS exists for)
    also search each other's generated text (the ``max_siblings`` nearest ones, finished
    rows included) when their own text offers a shorter continuation. Its proposals are
    deterministic (a one-hot draft distribution: a token is accepted with probability
    ``p(token)``), and under sampling the engine verifies them against the main model's
    keyed draws (:func:`bass.sampling.keyed_accept`), so they never change a sample.

    Matching uses a per-row index from each token to the positions where it occurs, kept
    up to date as rows grow, so a lookup costs the occurrences of one token, not a scan of
    the row.
    """

    name = "ngram"

    def __init__(
        self, max_ngram: int = 3, min_ngram: int = 1, siblings: bool = True, max_siblings: int = 8
    ):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        if max_siblings < 0:
            raise ValueError(f"max_siblings must be >= 0, got {max_siblings}")
        self.max_ngram, self.min_ngram, self.siblings = max_ngram, min_ngram, siblings
        self.max_siblings = max_siblings
        self.vocab_size = None  # works with any vocabulary
        self.found: list[list[int]] = []

    def start(self, prompts, seqs) -> None:
        """``seqs[p]``: prompt ``p``'s growing sequence (prompt + output), one list per
        prompt that the engine extends in place."""
        self.seqs = seqs
        self.prompt_len = [len(p) for p in prompts]
        groups: dict[tuple, list[int]] = {}
        for p, prompt in enumerate(prompts):
            groups.setdefault(tuple(prompt), []).append(p)
        # each row searches max_siblings siblings next to it in prompt order, so a batch of
        # thousands of copies of one prompt stays linear, not quadratic
        self.siblings_of: list[list[int]] = [[] for _ in prompts]
        m = self.max_siblings if self.siblings else 0
        for members in groups.values():
            for i, p in enumerate(members):
                lo = max(0, min(i - m // 2, len(members) - 1 - m))
                window = members[lo : lo + m + 1]
                self.siblings_of[p] = [o for o in window if o != p][:m]
        self.index: list[dict[int, list[int]]] = [{} for _ in prompts]
        self.indexed = [0] * len(prompts)

    def _positions(self, p: int) -> dict[int, list[int]]:
        seq, idx = self.seqs[p], self.index[p]
        if self.indexed[p] > len(seq):  # the row was cut (a stop string): rebuild
            idx.clear()
            self.indexed[p] = 0
        for i in range(self.indexed[p], len(seq)):
            idx.setdefault(seq[i], []).append(i)
        self.indexed[p] = len(seq)
        return idx

    def _search(self, p: int, suffix: list[int], k: int, lo: int, hi: int) -> list[int]:
        """The continuation after the most recent occurrence of ``suffix`` in
        ``seqs[p]`` that starts in ``[lo, hi)`` (up to ``k`` tokens; ``[]`` if none)."""
        seq, n = self.seqs[p], len(suffix)
        for end in reversed(self._positions(p).get(suffix[-1], ())):
            start = end - n + 1
            if start >= hi:
                continue
            if start < lo:
                break
            if seq[start : end + 1] == suffix and end + 1 < len(seq):
                return seq[end + 1 : end + 1 + k]
        return []

    def lookup(self, p: int, k: int) -> tuple[list[int], int]:
        """Up to ``k`` draft tokens for prompt ``p``'s row and the matched suffix length."""
        seq = self.seqs[p]
        n_tok = len(seq)
        for n in range(min(self.max_ngram, n_tok - 1), self.min_ngram - 1, -1):
            suffix = seq[n_tok - n :]
            best = self._search(p, suffix, k, 0, n_tok - n)  # an earlier occurrence
            if len(best) < k:
                for o in self.siblings_of[p]:
                    # the shared prompt was searched in the row itself: only the
                    # sibling's own text (and matches reaching into it) is new
                    lo = max(0, self.prompt_len[o] - n + 1)
                    found = self._search(o, suffix, k, lo, len(self.seqs[o]))
                    if len(found) > len(best):
                        best = found
            if best:
                return best, n
        return [], 0

    def signals(self, rows: list[int], k_max: list[int]) -> Signals:
        """Look up every active row (``rows``: prompt indices) once, for the policy;
        :meth:`propose` then truncates these continuations."""
        found = [self.lookup(p, k) if k > 0 else ([], 0) for p, k in zip(rows, k_max)]
        self.found = [f for f, _ in found]
        return Signals([len(f) for f, _ in found], [n for _, n in found])

    def propose(self, rows: list[int], k_rows: list[int]) -> Proposal:
        if len(self.found) != len(rows):  # signals() was not called this step
            self.signals(rows, k_rows)
        out = [f[:k] for f, k in zip(self.found, k_rows)]
        self.found = []
        return Proposal(counts=[len(o) for o in out], host_tokens=out)


def make_drafter(draft, main, impl: str, shared_vocab: int | None = None):
    """The drafter that a :class:`bass.Generator`'s ``draft`` argument names: ``None``,
    ``"ngram"`` (an :class:`NGramDrafter`, or one configured by the caller) or a draft
    model sharing ``main``'s vocabulary (a :class:`ModelDrafter` running ``impl``).
    ``shared_vocab``: where the two models' logit counts differ, the number of tokens of
    the tokenizer they share (padded embedding matrices); the draft proposes only those."""
    if draft is None:
        return None
    if isinstance(draft, NGramDrafter):  # one configured by the caller
        return draft
    if isinstance(draft, str):
        if draft != "ngram":
            raise ValueError(
                f"draft must be a model, 'ngram' or None, got the string {draft!r}; "
                "load models by name with Generator.from_pretrained"
            )
        return NGramDrafter()
    if not isinstance(draft, torch.nn.Module) or not hasattr(draft, "get_output_embeddings"):
        raise TypeError(
            f"draft must be a causal LM (a transformers model), 'ngram' or None, got "
            f"{type(draft).__name__}"
        )
    v_main, v_draft = _vocab_size(main), _vocab_size(draft)
    if shared_vocab is not None:
        if not isinstance(shared_vocab, int) or not 1 <= shared_vocab <= min(v_main, v_draft):
            raise ValueError(
                f"shared_vocab must be an int in [1, {min(v_main, v_draft)}] (the tokenizer's "
                f"length, within both models' logits: main {v_main}, draft {v_draft}), got "
                f"{shared_vocab!r}"
            )
    elif v_main != v_draft:
        raise ValueError(
            f"draft and main vocabularies differ: the draft model {hf.model_name(draft)} has "
            f"{v_draft} logits, the main model {hf.model_name(main)} has {v_main}. "
            "Speculative decoding needs a draft that shares the main model's tokenizer; if "
            "both do and only their embedding matrices were padded to different sizes (as "
            "Qwen2.5 7B+ and 0.5B-3B are), pass shared_vocab=len(tokenizer) "
            "(Generator.from_pretrained and the CLI check the tokenizers and do it for you)"
        )
    tokens = shared_vocab if shared_vocab is not None else v_draft
    return ModelDrafter(draft, impl=impl, tokens=tokens, out_vocab=v_main)


def _vocab_size(model) -> int:
    return model.get_output_embeddings().weight.shape[0]
