"""A Generator's packed passes (docs/concepts/design.md, "transformers integration"): one
forward over every row's new tokens (:func:`forward_packed`), how a Generator runs it
(:class:`Passes`), and the chunked prefill of ragged prompts (:func:`prefill`, with each
prompt token's log-probability where asked).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch
from transformers import PreTrainedModel

from . import compat, sampling
from .cache import LayerReadsLength, RaggedKVCache
from .errors import UnsupportedModelError
from .hf import ATTN_NAME, LengthsDropped, model_name, pass_impl, planned
from .ops.plan import Plan, resolve
from .packing import PackedPass, pack

SCORED_LOGITS = 2**25  # the most logits (128 MiB of float32) a scored prefill pass makes


def forward_packed(
    model: PreTrainedModel,
    cache,  # RaggedKVCache
    input_ids: torch.Tensor,  # int64 [1, N]: every row's new tokens, packed
    positions: torch.Tensor,  # int64 [1, N]
    cu_q_lens: torch.Tensor,  # int32 [B+1]: row b owns tokens cu_q_lens[b]..cu_q_lens[b+1]-1
    lens: torch.Tensor,  # int32 [B]: committed cache lengths before the pass
    impl: str = "auto",
    logits_index: torch.Tensor | None = None,  # int64 [L]: tokens whose logits are needed
    plan: Plan | None = None,  # the pass's attention, planned on the host
) -> torch.Tensor:  # [1, N, V] (or [1, L, V])
    """One packed forward pass (see :mod:`bass.packing`): appends the tokens to ``cache``
    (uncommitted) and returns their logits (only at ``logits_index`` when given: the lm
    head is the largest matmul of a pass and most positions' logits are never read).
    ``plan``: the pass's attention, planned on the host (:mod:`bass.ops.plan`).
    """
    # With any other attention the whole (unmasked) cache buffer would be attended to.
    # The top config's is read first (one attribute a pass); a multimodal model's may
    # keep another where its text config switched (compat shim 9)
    if model.config._attn_implementation != ATTN_NAME and (
        (now := compat.attn_implementation(model)) != ATTN_NAME
    ):
        raise RuntimeError(
            f"{model_name(model)} is set to attn_implementation={now!r}, not 'bass'; call "
            "bass.hf.prepare(model) (models sharing a config object with another model "
            "change together)"
        )
    kv_lens = cache.begin_packed(cu_q_lens, lens, plan)
    extra = {} if plan is None else {"bass_plan": plan}
    out = model(
        input_ids=input_ids,
        position_ids=positions,
        **compat.forward_cache_kwargs(model, cache),
        use_cache=True,
        bass_cu_q_lens=cu_q_lens,
        bass_kv_lens=kv_lens,
        bass_impl=impl,
        logits_to_keep=0 if logits_index is None else logits_index,
        **extra,
    )
    return out.logits


@dataclass
class Passes:
    """How a Generator runs its packed passes, decided once when it is built, and shared
    by the engine and a draft model's drafter."""

    forward: Callable = forward_packed  # a decoding pass (compiled or not; Backend.wrap'ped)
    eager: Callable = forward_packed  # the same uncompiled, for the prefill (widths vary)
    compiled: bool = False  # whether forward is (with bucket: CUDA graphs' static shapes)
    impl: str = "auto"  # the attention implementation
    bucket: Sequence[int] | None = None  # token buckets of static-shape passes, or None
    separate: bool = False  # each small tensor its own allocation (compiled: guards on views)
    logits_multiple: Callable[[torch.nn.Module], int] = lambda model: 1  # Backend's
    chunk_tokens: int = 8192  # the most tokens one prefill pass feeds

    @property
    def pass_kind(self) -> str:
        """What its attention is planned for (:data:`bass.ops.PASS_KINDS`)."""
        if not self.compiled:
            return "eager"
        return "graphs" if self.bucket is not None else "compiled"

    def attention(self, device, model=None) -> dict[str, str]:
        """The attention implementation its passes run on ``device`` per pass kind
        (prefill passes are eager), and why: for ``res.stats`` and ``bass ops``; for
        ``model``'s passes where given (:func:`needs`)."""
        picks, beyond = {}, None
        if model is not None:  # as prepare planned it (bass ops: not prepared)
            beyond = planned(model)
        device = torch.device(device)
        name, how = pass_impl(self.impl, beyond, device.type)
        for kind in dict.fromkeys(("eager", self.pass_kind)):
            impl, why = resolve(name, device, kind)
            if beyond is not None:
                why = f"the model's {beyond.need}, beyond the ops' contract ({how})"
            picks[kind] = f"{impl.name}: {why}"
        return picks

    def pack(self, model, q_lens: Sequence[int], lens: Sequence[int], device, **kw) -> PackedPass:
        """:func:`bass.packing.pack` with this Generator's settings for ``model``; ``kw``:
        its ``ids``, ``logits_at``, ``logits_slots`` and ``extra``."""
        multiple = self.logits_multiple(model)
        kw.update(bucket=self.bucket, logits_multiple=multiple, separate=self.separate)
        return pack(q_lens, lens, device, **kw)

    def run(self, model, cache, batch: PackedPass) -> torch.Tensor:
        """Run ``batch`` through ``model`` (appending to ``cache``); returns ``[N or L,
        V]`` logits. The pass's attention is planned here, once for every layer."""
        beyond = planned(model)
        window = beyond and beyond.window  # planned for, where it hides keys the cache holds
        window = window if window and window < cache.max_len else None
        plan = Plan.for_pass(
            pass_impl(self.impl, beyond, batch.cu_q_lens.device.type)[0],
            batch.q_lens,
            batch.host_lens,
            batch.tokens,
            batch.cu_q_lens,
            batch.lens,
            batch.kv_lens,
            cache.max_len,
            self.pass_kind,
            beyond.cap if beyond is not None else None,
            window,
        )
        logits = self.forward(
            model,
            cache,
            batch.input_ids,
            batch.positions,
            batch.cu_q_lens,
            batch.lens,
            self.impl,
            batch.logits_index,
            plan,
        )
        if window is not None and plan.kind == "eager" and not plan.windowed:
            raise UnsupportedModelError(
                f"{model_name(model)}'s config sets a sliding window of {window} tokens, "
                "shorter than this generation, but none of its layers passed one to its "
                "attention function, so bass cannot see which layers slide (if any: this "
                "model may ignore it) and does not guess: keep the longest prompt plus "
                f"max_new_tokens within {window + 1} tokens, or remove sliding_window from "
                "the config if the model attends to every earlier token"
            )
        return logits[0]

    def prefill(self, model, cache, prompts, slots=None, scores=None, starts=None):
        """:func:`prefill` with these settings, eager (its widths vary) and unpadded."""
        eager = replace(self, forward=self.eager, compiled=False, bucket=None, separate=False)
        return prefill(model, cache, prompts, eager, slots=slots, scores=scores, starts=starts)


def prefill(
    model,
    cache,
    prompts: list[list[int]],
    passes: Passes | None = None,
    *,
    slots: Sequence[int] | None = None,
    chunk_tokens=None,
    scores: list | None = None,
    starts: Sequence[int] | None = None,
):
    """Prefill rows ``slots`` (ascending; default: one row per prompt, all of them) of
    ``cache`` with ragged ``prompts`` in packed passes, and commit them; return each
    prompt's last logits ``[len(prompts), V]`` and the number of passes.

    Each row starts empty (a finished row's slot is refilled), or holding its first
    ``starts`` tokens; the other rows bring no token. Rows whose prompts are equal (the
    samples of one prompt) share one prefill: the first is computed, the others get a
    copy of its cache row, logits and scores (:func:`leaders`). Passes feed at most
    ``chunk_tokens`` tokens (default ``passes.chunk_tokens``), a long prompt spanning
    several. ``passes``: how passes run (default: eager, ``impl="auto"``). ``scores``: a
    list that gets each prompt's tokens' log-probabilities but the first's (float64
    ``[len - 1]``, on the device; the passes then feed at most :data:`SCORED_LOGITS`
    logits' worth of tokens). ``starts``: each prompt's tokens its row already holds
    (copied from another row's: fed from there; default none; not with ``scores``)."""
    passes = passes or Passes()
    if chunk_tokens is None:
        chunk_tokens = passes.chunk_tokens
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    slots = list(range(len(prompts))) if slots is None else list(slots)
    if len(slots) != len(prompts) or any(b <= a for a, b in itertools.pairwise(slots)):
        raise ValueError(f"prefill needs one ascending slot per prompt, got {slots}")
    starts = [0] * len(prompts) if starts is None else list(starts)
    if scores is not None and any(starts):
        raise ValueError("prefill scores every prompt token: it takes no starts")
    lead = leaders(prompts)
    first = [j for j, k in enumerate(lead) if k == j]
    computed = None if scores is None else []
    out, n_passes = _fill(model, cache, [prompts[j] for j in first], passes,
                          [slots[j] for j in first], chunk_tokens, computed,
                          [starts[j] for j in first])  # fmt: skip
    if len(first) < len(prompts):  # the others copy their leader's
        at = {j: i for i, j in enumerate(first)}
        copies = [j for j, k in enumerate(lead) if k != j]
        src, dst = [slots[lead[j]] for j in copies], [slots[j] for j in copies]
        cache.copy_prefix(src, dst, max(len(prompts[j]) for j in copies))
        cache.lens[dst] = cache.lens[src]  # committed, as the first's
        pick = [at[k] for k in lead]
        out = out[pick]
        computed = None if computed is None else [computed[i] for i in pick]
    if scores is not None:
        scores += computed
    return out, n_passes


def leaders(prompts: Sequence[Sequence[int]]) -> list[int]:
    """Each prompt's first equal prompt's index (its own where it is the first): rows that
    share one prefill."""
    first: dict[tuple, int] = {}
    return [first.setdefault(tuple(p), j) for j, p in enumerate(prompts)]


def _fill(model, cache, prompts: list[list[int]], passes: Passes, slots: list[int],
          chunk_tokens: int, scores: list | None, starts: list[int]):  # fmt: skip
    """:func:`prefill` of distinct prompts."""
    if scores is not None:  # every token's logits: [N, V] floats per pass
        most = SCORED_LOGITS // model.get_output_embeddings().weight.shape[0]
        chunk_tokens, scored = max(1, min(chunk_tokens, most)), [[] for _ in prompts]
    P = len(prompts)
    rows = cache.batch_size
    done = starts  # prompt tokens already in the cache, per prompt
    out, n_passes, i = None, 0, 0
    while i < P:
        budget = chunk_tokens
        feed: list[list[int]] = [[] for _ in range(P)]
        ends: list[int] = []  # prompts that end in this pass
        while i < P and budget > 0:
            take = min(budget, len(prompts[i]) - done[i])
            feed[i] = prompts[i][done[i] : done[i] + take]
            budget -= take
            if done[i] + take == len(prompts[i]):
                ends.append(i)
                i += 1
        cum = list(itertools.accumulate(map(len, feed)))
        last = [cum[j] - 1 for j in ends]  # each ending prompt's last token in the flat pass
        q_lens, lens = [0] * rows, [0] * rows  # per cache row; rows not refilled bring none
        for j, s in enumerate(slots):
            q_lens[s], lens[s] = len(feed[j]), done[j]
        ids = [t for toks in feed for t in toks]
        at = last if scores is None else list(range(len(ids)))
        batch = passes.pack(model, q_lens, lens, cache.lens.device, ids=ids, logits_at=at)
        logits = _first_run(passes, model, cache, batch)[: len(at)]
        if scores is not None:  # token t's logits score the prompt's token t + 1
            score_next(logits, prompts, feed, done, cum, scored)
            logits = logits[last]
        for j in range(P):
            done[j] += len(feed[j])
        cache.commit(cache.q_lens)
        n_passes += 1
        if out is None:
            out = logits.new_empty(P, logits.shape[-1])
        if ends:
            out[ends[0] : ends[-1] + 1] = logits  # prompts end in order: a contiguous block
    if scores is not None:
        scores += [torch.cat(parts) for parts in scored]
    return out, n_passes


def _first_run(passes: Passes, model, cache, batch: PackedPass) -> torch.Tensor:
    """``passes.run`` for a prefill, the first pass a model sees in bass (eager): a model
    whose forward reads parts of transformers' ``Cache`` bass's cache lacks, or whose
    layers drop the attention keyword arguments, is refused by name."""
    try:
        return passes.run(model, cache, batch)
    except AttributeError as exc:
        if not isinstance(getattr(exc, "obj", None), RaggedKVCache):
            raise
        raise UnsupportedModelError(
            f"{model_name(model)} reads {exc.name!r} of transformers' Cache, which bass's "
            "ragged KV cache does not provide: this model cannot run through bass"
        ) from exc
    except LayerReadsLength as exc:
        raise LayerReadsLength(exc.layer_idx, model_name(model)) from exc
    except LengthsDropped as exc:
        raise UnsupportedModelError(
            f"{model_name(model)} does not hand the keyword arguments of its forward down to "
            f"{exc.module}'s attention function (bass passes each row's lengths that way: "
            "a forward or a layer on the way drops them): this model cannot run through bass"
        ) from exc


# (read when a prefill runs: set it to change the bound)


def score_next(logits, prompts, feed, done, cum, scored) -> None:
    """A prefill pass's log-probabilities of its prompts' tokens (:func:`prefill`
    with ``scores``): each fed token's ``logits`` score the next token of its prompt, where
    there is one (:func:`bass.sampling.raw_logprobs`); appended to ``scored``, per prompt."""
    index, tokens, owner = [], [], []
    for j, toks in enumerate(feed):
        start, nxt = cum[j] - len(toks), prompts[j][done[j] + 1 : done[j] + len(toks) + 1]
        index += range(start, start + len(nxt))
        tokens += nxt
        owner.append(len(nxt))
    as_long = dict(dtype=torch.int64, device=logits.device)
    lps = sampling.raw_logprobs(
        logits, torch.tensor(index, **as_long), torch.tensor(tokens, **as_long)
    )
    for j, part in enumerate(lps.split(owner)):  # (a prompt not fed, or fed its last
        scored[j].append(part)  # token only: an empty part)
