"""Continuous batching: which prompts run at once, in which cache slots, and when.

At most :func:`rows_at_once` rows generate at once, each in a *slot* (a row of the caches,
allocated once per job); a finished row's slot goes to the next waiting prompt
(:class:`Queue`), prefilled in the other rows' next verify pass or by a :func:`prefill`
pass of its own (:func:`admit_waiting`). Why, and what it guarantees:
docs/guides/generation.md, "Jobs of any size: continuous batching".
"""

from __future__ import annotations

import collections
import itertools
import math
import time
from collections.abc import Iterator
from typing import NamedTuple

import torch

from . import hf, options, passes, verify
from . import models as models_
from .batch_state import (
    BatchState,
    NonFiniteLogitsError,
    as_prompts,
    check_prompts,
    raise_if_nonfinite,
)
from .cache import RaggedKVCache
from .drafters import nonfinite
from .sampling import (
    SAMPLE_BITS,
    SAMPLING,
    SamplingParams,
    as_bits,
    from_bits,
    row_key,
    sample_keyed,
    token_logprobs,
    warp_logits,
)
from .stats import FinishedRow
from .stopping import StopStrings

__all__ = [
    "Job",
    "Queue",
    "admit_rows",
    "admit_waiting",
    "first_read",
    "hand_over",
    "prefill",
    "rows_at_once",
    "take_first",
]


class Job(NamedTuple):
    """One generate call's checked arguments (:meth:`check`)."""

    prompts: list[list[int]]
    kw: dict  # bass.options.generation_kwargs
    params: SamplingParams
    stops: tuple  # eos ids, stop sequences, stop strings
    row_ids: list[int]
    need: int  # the longest prompt + max_new_tokens
    max_len: int  # the caches' length
    keep: bool = True  # False (stream()): a row's tokens are released once handed over
    call: str = "generate"  # the method its errors name

    @classmethod
    def check(cls, prompts, given, defaults, models, keywords, call="generate") -> Job:
        """Every argument of a generate call checked before any work (:mod:`bass.options`;
        ``defaults``, the config's, under the explicit ones): types, ranges, ids within the
        main model's logits, prompts within the models' contexts."""
        unknown = sorted(set(given) - keywords)
        if unknown:
            raise TypeError(f"{call}() got unexpected keyword arguments: {unknown}")
        given = {k: given.get(k) for k in keywords}
        ids = given.pop("row_ids")
        vocab = models[0].get_output_embeddings().weight.shape[0]
        kw = options.generation_kwargs(given, defaults, vocab=vocab, call=call)
        if given.get("do_sample") is None and defaults.get("do_sample") is None:
            models_.warn_greedy(models[0], call)  # its generation_config may sample
        params = SamplingParams(**{k: kw[k] for k in SAMPLING})
        prompts = as_prompts(prompts)
        need = check_prompts(prompts, kw["max_new_tokens"], models)
        ids = options.row_ids(ids, len(prompts), call)
        if kw["n"] is not None:  # each prompt's samples one after another, keyed (prompt,
            prompts, ids = samples(prompts, ids, kw["n"], call)  # sample) as the CLI keys them
        texts = StopStrings(kw["stop_strings"], kw["tokenizer"]) if kw["stop_strings"] else None
        max_len = -(-need // 8) * 8  # a multiple of 8 (gpt-fast): fewer distinct shapes
        windows = [w for w in map(hf.sliding_window, models) if w is not None]
        if any(need - 1 <= w < max_len for w in windows):  # a model whose window the
            max_len = need - 1  # generation stays within runs the ops' own attention
            # (bass.hf.needs): no rounding past it (a row's last new token is never fed
            # back, so its cache holds one token less than prompt + new ones)
        stops = (kw["eos_token_id"], kw["stop_sequences"], texts)
        return cls(prompts, kw, params, stops, ids, need, max_len, call=call)

    def new_state(self, slots: int) -> BatchState:
        """The generation's host state, ``slots`` cache rows (row ids key each prompt's
        sampled draws)."""
        prompts = [list(p) for p in self.prompts]
        return BatchState(
            prompts, self.kw["max_new_tokens"], *self.stops, slots=slots,
            row_ids=self.row_ids, logprobs=self.params.logprobs is not None,
            prompt_logprobs=bool(self.kw.get("prompt_logprobs")),
        )  # fmt: skip


#: The most rows one call with ``n`` makes (``bass generate``'s bound on a job, too).
MAX_ROWS_N = 10_000_000


def named_by_prompt(job: Job, work):
    """``work`` (a generation of ``job``), its :class:`NonFiniteLogitsError` naming the
    caller's prompt where ``n`` made several rows of each."""
    try:
        return (yield from work)
    except NonFiniteLogitsError as e:
        if job.kw["n"] in (None, 1):
            raise
        raise e.at(e.prompt // job.kw["n"]) from None


def samples(prompts: list, ids: list[int], n: int, call: str) -> tuple[list, list[int]]:
    """``n`` rows per prompt, one after another, and their row ids: sample ``j`` of the
    prompt of row id ``i`` is keyed by :func:`bass.sampling.row_key` ``(i, j)``, as ``bass
    generate`` keys it (``--n`` or not). At most :data:`MAX_ROWS_N` rows."""
    if len(prompts) * n > MAX_ROWS_N:
        why = (
            f"at most {MAX_ROWS_N:,} rows a call: {len(prompts)} prompts x n={n} is "
            f"{len(prompts) * n:,}; split the job over calls (row_ids: each prompt's index)"
        )
        raise options.fail("n", n, why, where=f"{call}()")
    if ids and max(ids) >= 2 ** (63 - SAMPLE_BITS):
        why = f"ints < 2**{63 - SAMPLE_BITS} with n (each keys its samples: row_key)"
        raise options.fail("row_ids", max(ids), why, where=f"{call}()")
    rows = [p for p in prompts for _ in range(n)]
    return rows, [row_key(i, j) for i in ids for j in range(n)]


def rows_at_once(job: Job, models, device, share, stats) -> int:
    """The rows generating at once (``max_rows``, and what the KV budget holds), also set
    in ``stats`` with the budget in bytes (0: none known) and the KV cache bytes of one
    slot. ``share``: a TP group's agreement (its leader's memory decides)."""
    per_row = job.max_len * sum(RaggedKVCache.bytes_per_token(m) for m in models)
    given = job.kw["kv_budget_gib"]
    budget = int(given * 2**30) if given is not None else RaggedKVCache.default_budget(device)
    rows = min(len(job.prompts), job.kw["max_rows"] or options.MAX_ROWS)
    if budget is not None:
        rows = min(rows, budget // per_row)
    rows = share([rows])[0]
    if rows >= 1:
        stats.max_rows, stats.kv_budget_bytes, stats.kv_bytes_per_row = rows, budget or 0, per_row
        return rows
    rounded = ", rounded up to a multiple of 8" if job.max_len != job.need else ""
    one = f"one row of {job.max_len} positions (the longest prompt plus max_new_tokens{rounded})"
    if given is not None:
        raise budget_refusal(given, per_row, one, f"{job.call}()")
    raise MemoryError(
        f"{one} needs {_gib_up(per_row)} GiB of KV cache, more than the default budget of "
        f"{budget / 2**30:.3g} GiB (a share of the free memory on {device}); lower "
        "max_new_tokens, free memory, or pass kv_budget_gib"
    )


def budget_refusal(given: float, per_row: int, one: str, where: str):
    """The :class:`~bass.errors.OptionError` for a ``kv_budget_gib`` of ``given`` that does
    not hold ``one`` row (described) of ``per_row`` bytes."""
    why = (
        f"at least {_gib_up(per_row)} GiB: {one} needs that much KV cache; raise it or "
        "lower max_new_tokens"
    )
    return options.fail("kv_budget_gib", given, why, where=where)


def _gib_up(nbytes: int) -> str:
    """``nbytes`` in GiB to 3 significant digits, rounded up: a budget of the number
    shown holds them (rounded to nearest, a minimum quoted back was refused again)."""
    x = nbytes / 2**30
    step = 10.0 ** (math.floor(math.log10(x)) - 2)
    up = f"{math.ceil(x / step - 1e-9) * step:.3g}"
    return up if float(up) * 2**30 >= nbytes else f"{float(up) + step:.3g}"


class Queue:
    """The prompts waiting for a slot, in the caller's order, and when each row started
    (its time budget's origin), on the generation's own clock: wall time less ``paused``,
    the seconds it waited for its caller (a stream's loop body, ``on_finish``,
    ``on_step``), which no row's budget counts."""

    def __init__(self, n: int):
        self.waiting = collections.deque(range(n))
        self.started = [0.0] * n
        self.paused = 0.0

    def clock(self) -> float:
        return time.perf_counter() - self.paused

    def __bool__(self) -> bool:
        return bool(self.waiting)

    def admit(self, state) -> tuple[list[int], list[int]]:
        """Place waiting prompts into ``state``'s free slots, in the caller's order (every
        free slot is taken while prompts wait). Returns the slots (ascending) and their
        prompts."""
        free = state.free()
        new = [self.waiting.popleft() for _ in range(min(len(free), len(self.waiting)))]
        now = self.clock()
        for s, p in zip(free, new):
            state.admit(s, p)
            self.started[p] = now
        return free[: len(new)], new

    def expire(self, state, slots: list[int], budget: float | None, share) -> list[int]:
        """Rows of ``slots`` past ``budget`` seconds since they started end (``"time"``);
        returns the others. ``share``: a TP group's agreement (its leader's clock)."""
        if budget is None or not slots:
            return slots
        now = self.clock()
        late = share([int(now - self.started[state.prompt_of[s]] > budget) for s in slots])
        for s, over in zip(slots, late):
            if over:
                state.finish(s, "time")
        return [s for s, over in zip(slots, late) if not over]


def admit_waiting(gen, state, queue: Queue, sampling, stats) -> list[int]:
    """Waiting prompts into the free slots (:meth:`Queue.admit`): prefilled at once, or
    left to ride in the next verify pass (returned: the step's ``fill``) where other rows
    are running, the passes are eager with unpadded shapes (compiled passes and CUDA
    graphs keep their prefill apart) and the prompts fit in one pass (and no prompt
    log-probabilities are asked for: a prefill of its own computes them)."""
    if not queue:
        return []
    slots, _ = queue.admit(state)  # none while no slot is free
    share_prompts(gen, state, slots)
    p = gen.passes
    if slots and not p.compiled and p.bucket is None and state.prompt_logprobs is None:
        tokens = prompt_tokens(state, slots)
        if tokens <= p.chunk_tokens and any(s not in slots for s in state.active()):
            admit_rows(gen, state, slots, stats)
            return slots
    prefill(gen, state, slots, sampling, stats)
    return []


def prefill(gen, state, slots: list[int], sampling, stats, admitted: bool = False) -> None:
    """Fill the caches' rows ``slots`` with the prompts just admitted there (the main
    model's prefill, then the drafter's, unless :func:`admit_rows` did it), and append each
    row's first token (:func:`first_read`)."""
    if not slots:  # none admitted (no free slot)
        return
    t = time.perf_counter()
    seqs = [state.seqs[s] for s in slots]
    scores = None if state.prompt_logprobs is None else []  # per prompt, float64 [len - 1]
    starts = [state.start(s) for s in slots]
    logits, passes = gen.passes.prefill(gen.main, gen.cache, seqs, slots, scores, starts)
    if scores is not None:  # (before the first token: it may end the row); one host read
        host, nan = iter(torch.cat(scores).tolist()), []
        for s, seq in zip(slots, seqs, strict=True):
            lps = [None, *itertools.islice(host, len(seq) - 1)]
            nan.append(any(x != x for x in lps[1:]))  # NaN logits (or +inf) at a prompt token
            state.prompt_logprobs[state.prompt_of[s]] = lps
        prompts = [state.prompt_of[s] for s in slots]
        raise_if_nonfinite(nan, gen.main, "main", prompts, "a prompt token (prompt_logprobs)")
    host = first_read(state, slots, logits, sampling).tolist()  # host read
    stats.main_passes += passes
    stats.prefill_passes += passes
    if not admitted:
        admit_rows(gen, state, slots, stats)
    take_first(gen.main, state, slots, host)
    stats.prefill_seconds += time.perf_counter() - t


def share_prompts(gen, state, slots: list[int]) -> None:
    """New rows ``slots`` whose prompt a running row holds (another sample of it, admitted
    earlier) take that row's cache positions of all its prompt tokens but the last (the
    main model's here, a draft model's in its ``admit``) and feed the last one only
    (:attr:`~bass.batch_state.BatchState.copied`); rows of one wave with equal prompts
    share its prefill (:func:`bass.passes.prefill`). Not with prompt log-probabilities:
    a prefill of its own scores every prompt token."""
    state.copied = {}
    if state.prompt_logprobs is not None or not slots:
        return
    new, held = set(slots), {}
    for s in state.active():  # running rows, by their prompt's hash
        if s not in new:
            held.setdefault(state.prompt_hash[state.prompt_of[s]], []).append(s)
    for s in slots:
        prompt = state.seqs[s]
        for r in held.get(state.prompt_hash[state.prompt_of[s]], []):
            tokens = len(state.seqs[r]) - len(state.outputs[state.prompt_of[r]])
            if len(prompt) > 1 and tokens == len(prompt) and state.seqs[r][:tokens] == prompt:
                state.copied[s] = r
                break
    if state.copied:
        gen.cache.copy_prefix(*state.copies())


def prompt_tokens(state, slots: list[int]) -> int:
    """The tokens a prefill of rows ``slots`` computes: rows of equal prompts (a prompt's
    samples) share one (:func:`bass.passes.leaders`), rows whose prompt a running row
    holds feed their last token only (:func:`share_prompts`)."""
    seqs = [state.seqs[s] for s in slots]
    lead = passes.leaders(seqs)
    return sum(len(seqs[j]) - state.start(slots[j]) for j, k in enumerate(lead) if k == j)


def admit_rows(gen, state, slots: list[int], stats) -> None:
    """An admission wave's bookkeeping and the drafter's prefill of its rows (a prompt
    riding in the verify pass gets only this before the pass)."""
    fed = prompt_tokens(state, slots)
    stats.prefill_tokens += fed
    stats.shared_prompt_tokens += sum(len(state.seqs[s]) for s in slots) - fed
    stats.admissions += 1
    if gen.drafter is not None:
        n = gen._drafting.admit(state, slots)
        stats.draft_passes += verify.check_passes(gen._drafting, "admit", n)


def first_read(state, fill: list[int], logits, sampling) -> torch.Tensor | None:
    """The first tokens (the argmax, or a keyed draw) and non-finite flags (int64
    ``[2F]``, for a host read) of the rows ``fill`` just prefilled (in a verify pass they
    rode in, or their own), from their prompts' last logits ``[F, V]``; ``None`` without
    such rows."""
    if not fill:
        return None
    params, _, seed, seen = sampling
    scores = logits if seen is None else seen.first_scores(logits, state, fill)  # penalised
    warped = None
    if not params.do_sample:
        first = scores.argmax(dim=-1)
    else:  # drawn with the key of (seed, row id, position 0), as any other draw
        keys = torch.tensor(state.keys(seed, fill, 1, first=True), dtype=torch.int64)
        keys_t = keys.to(logits.device, non_blocking=True)
        warped = warp_logits(scores, params)  # (its log-probabilities read it too)
        first = sample_keyed(torch.softmax(warped, dim=-1), keys_t)
    read = [first, nonfinite(logits).long()]
    if params.logprobs is not None:  # float64, read as int64 bits
        at = torch.arange(len(fill), device=logits.device)
        lp_of = logits if params.logprobs == "raw" else scores
        read.append(as_bits(token_logprobs(lp_of, at, first, params, warped)))
    return torch.cat(read)


def take_first(main, state, fill: list[int], host: list[int]) -> None:
    """Append the new rows' first tokens (``host``: :func:`first_read` read back, with
    their log-probabilities where asked for); non-finite logits raise, naming their
    prompts."""
    F = len(fill)
    prompts = [state.prompt_of[s] for s in fill]
    raise_if_nonfinite(host[F : 2 * F], main, "main", prompts, "the prefill")
    state.copied = {}  # the wave's rows are filled: their copies are done
    lps = None
    if state.logprobs is not None:
        lps = from_bits(host[2 * F : 3 * F])[:, None].tolist()
    state.append(fill, [[t] for t in host[:F]], lps)


def hand_over(state, keep: bool = True) -> Iterator[FinishedRow]:
    """The rows finished since the last hand-over, as :class:`bass.FinishedRow` s; without
    ``keep`` (a stream) nothing of a row is kept once handed over."""
    done, state.finished = state.finished, []
    for p in done:
        out = state.outputs[p]
        lp = None if state.logprobs is None else state.logprobs[p]
        plp = None if state.prompt_logprobs is None else state.prompt_logprobs[p]
        state.tokens += len(out)
        if not keep:  # a stream's row is the caller's now
            state.outputs[p] = state.by_prompt[p] = None
            if lp is not None:
                state.logprobs[p] = None
            if plp is not None:
                state.prompt_logprobs[p] = None
        else:
            lp, plp = (None if x is None else list(x) for x in (lp, plp))
        yield FinishedRow(p, list(out) if keep else out, state.reasons[p], lp, plp)
