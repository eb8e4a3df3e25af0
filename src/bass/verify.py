"""A speculative step's verification: the verify pass's inputs (:func:`verify_pass`) and
the verdict on every active row's drafts (:func:`accept`), plus the checks a drafter's
proposal must pass (:func:`check_proposal`). The engine (:mod:`bass.engine`) calls them
in its step's phases 2-4; the terms are docs/concepts/engine.md's.
"""

from __future__ import annotations

import dataclasses
import itertools
import numbers
import operator
from dataclasses import dataclass

import numpy as np
import torch

from . import passes, plugins
from .batch_state import raise_if_nonfinite
from .drafters import nonfinite
from .errors import PluginOutputError
from .hooks import Offer, Proposal
from .packing import Extra, PackedPass
from .sampling import (
    Acceptance,
    as_bits,
    forced_accept,
    from_bits,
    greedy_accept_ids,
    sample_keyed,
    speculative_accept,
    token_logprobs,
    warp_logits,
    warp_probs,
)

__all__ = [
    "VerifyPass",
    "accept",
    "check_offer",
    "check_proposal",
    "draft_keys",
    "read_step",
    "verify_pass",
]


@dataclass
class VerifyPass:
    """The verify pass of a step, with its inputs as named device views (one copy).

    ``index`` int64 ``[R, K+1]``: position ``i`` of active row ``r`` -> its row of the
    pass's logits (clamped to the row's last); ``drafted`` int64 ``[R]``; ``drafts``
    int64 ``[R, K]`` (padding past a row's count); ``keys`` int64 ``[n]``: the sampling
    key of each verify token of the pass (the position it may emit; keyed draws), else
    ``None``. ``filled``: the rows just admitted whose prefill rides in this pass (their
    logits follow the verify tokens': rows ``n .. n + filled - 1``), ``n`` the verify
    tokens. ``outside`` bool ``[R, K]``: device drafts outside the vocabulary (``drafts``
    holds them clamped), else ``None``."""

    batch: PackedPass
    index: torch.Tensor
    drafted: torch.Tensor
    drafts: torch.Tensor
    keys: torch.Tensor | None
    n: int = 0
    filled: int = 0
    outside: torch.Tensor | None = None
    copies: tuple = ()  # (src, dst, length): rows of equal prompts that rode, to copy


def verify_pass(gen, state, slots, prop: Proposal, keyed: bool, seed: int, fill) -> VerifyPass:
    """3) The verify pass's inputs (``gen``: the :class:`bass.Generator`, its passes, main
    model and cache): every active row (cache slots ``slots``, ascending) feeds ``[last,
    d_1..d_n]``, ``n = prop.drafted[r]``; the step's small device tensors ride in the
    pass's one host-to-device copy (:class:`VerifyPass` names them and their shapes).
    ``keyed``: add the sampling keys of each row's positions (keyed draws,
    :func:`bass.sampling.position_keys` with ``seed``). ``fill``: slots of rows just
    admitted (ascending, not in ``slots``) whose prompt this pass feeds, from an empty
    cache row or from the tokens copied into it (their prefill, riding in the verify
    pass; rows of equal prompts feed it once and copy it after the pass:
    :attr:`VerifyPass.copies`); only their last token's logits are computed, after the
    verify tokens' (:attr:`VerifyPass.filled`).

    Worked example: two rows that drafted 2 and 0 tokens (``K = 2``) feed ``[last_0,
    d_1, d_2, last_1]``; ``index = [[0, 1, 2], [3, 3, 3]]``.
    """
    R, K = len(slots), max(prop.drafted)
    q_lens, lens = [0] * gen.cache.batch_size, state.cache_lens()
    index: list[int] = []  # [R, K+1]: row r's position i -> its logits row (clamped)
    start = 0
    for r, s in enumerate(slots):
        q_lens[s] = n = 1 + prop.drafted[r]
        index += [start + min(i, n - 1) for i in range(K + 1)]
        start += n
    # a new row: its prompt, from position 0; rows whose prompts are equal (a prompt's
    # samples) share the first one's prefill: the others feed none and copy its cache row
    lead = [fill[k] for k in passes.leaders([state.seqs[s] for s in fill])]
    for s, first in zip(fill, lead):  # (from the tokens copied from a running row's)
        lens[s] = state.start(s)
        q_lens[s] = len(state.seqs[s]) - lens[s] if first == s else 0
    copies = [(first, s) for s, first in zip(fill, lead) if first != s]
    if copies:  # (src, dst, the longest of their prompts)
        copies = (*map(list, zip(*copies)), max(len(state.seqs[d]) for _, d in copies))
    last = [state.seqs[s][-1] for s in slots]
    extra = {"index": Extra(index, (R, K + 1)), "drafted": Extra(prop.drafted, (R,))}
    row_of = {s: r for r, s in enumerate(slots)}
    logits_at = None
    if fill:  # the verify tokens' logits, then each new row's last token's
        flat = [0, *itertools.accumulate(q_lens)]
        verify_at = [flat[s] + i for s in slots for i in range(q_lens[s])]
        logits_at = verify_at + [flat[first + 1] - 1 for first in lead]
    if prop.host_tokens is not None:  # drafts on the host (n-grams, or none)
        rows = (
            (last[row_of[s]], *prop.host_tokens[row_of[s]])
            if s in row_of
            else state.seqs[s][lens[s] :]
            for s in sorted([*slots, *fill])
            if q_lens[s]
        )
        ids = [t for row in rows for t in row]
        pad = [t for d in prop.host_tokens for t in (*d, *[0] * (K - len(d)))]
        extra["drafts"] = Extra(pad, (R, K))
    else:  # drafts on the device: gathered into the packed order there (new rows'
        ids, flat_ix, after = None, [], R * (K + 1)  # prompts after the [R, K+1] table,
        for s in sorted([*slots, *fill]):  # in the order of fill, ascending)
            if s in row_of:
                at = row_of[s] * (K + 1)
            else:
                at, after = after, after + q_lens[s]
            flat_ix += range(at, at + q_lens[s])
        extra["last"] = Extra(last, (R, 1))
        extra["gather"] = Extra(flat_ix, (len(flat_ix),))
        if fill:
            prompt_ids = [t for s in fill if q_lens[s] for t in state.seqs[s][lens[s] :]]
            extra["prompts"] = Extra(prompt_ids, (len(prompt_ids),))
    if keyed:  # the sampling keys of the positions each row may emit, one per fed token
        grid = state.keys(seed, slots, K + 1)  # [R, K+1], row-major
        keys = [grid[r * (K + 1) + i] for r in range(R) for i in range(1 + prop.drafted[r])]
        extra["keys"] = Extra(keys, (len(keys),))
    batch = gen.passes.pack(
        gen.main, q_lens, lens, gen.cache.lens.device, ids=ids, logits_at=logits_at, extra=extra
    )
    e = batch.extra
    outside = None
    if ids is None:
        drafts = prop.tokens[:, :K]
        if not plugins.is_builtin(gen.drafter):  # another's ids outside the vocabulary:
            drafted = torch.arange(K, device=drafts.device) < e["drafted"][:, None]  # clamped
            outside = ((drafts < 0) | (drafts >= gen.vocab)) & drafted  # for the pass, and
            drafts = drafts.clamp(0, gen.vocab - 1)  # the step's host read raises (read_step)
        table = torch.cat([e["last"], drafts], dim=1).view(-1)  # [R*(K+1)]: what rows feed
        if fill:
            table = torch.cat([table, e["prompts"]])
        batch.set_input_ids(table[e["gather"]])
    else:
        drafts = e["drafts"]
    keys = e.get("keys")
    return VerifyPass(
        batch, e["index"], e["drafted"], drafts, keys, start, len(fill), outside, copies
    )


def accept(
    v: VerifyPass,
    logits: torch.Tensor,  # [N or L, V]: the verify pass's logits
    prop: Proposal,
    params,
    generator: torch.Generator,
    forced: float | None,
    scores: torch.Tensor | None = None,
) -> Acceptance:
    """4) The verdict for every active row, batched on the device (no host read;
    docs/concepts/engine.md); ``forced`` (benchmarks only): each draft kept with that
    probability; ``scores``: the verify tokens' logits ``[n, V]`` the choice reads where
    they are not the model's own (penalties: :mod:`bass.repetition`). With
    ``params.logprobs``, the log-probabilities of the tokens each row emits
    (:attr:`Acceptance.logprobs`)."""
    raw = logits[: v.n]
    scores = raw if scores is None else scores  # [n, V]
    warped = None  # the verify tokens' warped logits, where keyed draws or logprobs take them
    keyed = forced is None and v.keys is not None
    if params.do_sample and (keyed or params.logprobs == "processed"):
        warped = warp_logits(scores, params)  # [n, V]
    acc = _verdict(v, scores, prop, params, generator, forced, warped)
    if params.logprobs is not None:  # [R, K+1]: d_1..d_a, then the next token (and past it)
        pos = torch.arange(v.index.shape[1], device=v.index.device)
        nxt = acc.next_tokens[:, None]
        emitted = torch.cat([v.drafts.long(), nxt], 1)
        emitted = torch.where(pos < acc.accepted[:, None], emitted, nxt)
        lp_of = raw if params.logprobs == "raw" else scores
        acc.logprobs = token_logprobs(lp_of, v.index, emitted, params, warped)
    return acc


def _verdict(v: VerifyPass, logits, prop: Proposal, params, generator, forced, warped):
    if forced is not None:
        best = logits.argmax(dim=-1)[v.index]  # [R, K+1]
        return forced_accept(v.drafted, best, forced, generator)
    if not params.do_sample:
        return greedy_accept_ids(v.drafts, logits.argmax(dim=-1)[v.index], v.drafted)
    if v.keys is not None:  # deterministic drafts: kept while equal to the keyed draws
        # drawn at the pass's real tokens only (the [R, K+1] grid repeats a short row's
        # last token: warping and drawing over the vocabulary there would be wasted)
        draws = sample_keyed(torch.softmax(warped, dim=-1), v.keys)  # [n]
        return greedy_accept_ids(v.drafts, draws[v.index], v.drafted)
    p = warp_probs(logits[v.index], params)  # [R, K+1, V]
    K = v.drafts.shape[1]  # sampled drafts: lossless rejection sampling
    q = prop.probs[:, :K]
    acc = speculative_accept(v.drafts, q, p, v.drafted, generator)
    # a token drawn from q has 0 < q <= 1 there: else q is not what it was drawn from
    # (log-probabilities, logits, inf) and every draft would be rejected, unseen
    at = v.drafts.clamp(0, q.shape[-1] - 1).unsqueeze(-1)
    live = torch.arange(K, device=q.device) < v.drafted.unsqueeze(-1)
    q_at = q.gather(-1, at).squeeze(-1)
    broken = ~torch.isfinite(q.sum(dim=-1))  # NaN or inf for another token (every draft
    acc.unlikely = (live & (broken | ~((q_at > 0) & (q_at <= 1)))).any(dim=1)  # rejected)
    return acc


def who(drafter) -> str:
    """How errors name ``drafter`` (the engine's: another package's is guarded, with its
    entry point's name and package): ``drafter 'mine' (Mine, from my-pkg 1.0)``."""
    return getattr(drafter, "who", None) or plugins.describe(
        "drafter", drafter, getattr(drafter, "name", None)
    )


def _fail(drafter, hook: str, message: str) -> PluginOutputError:
    name = who(drafter)
    return PluginOutputError(f"{name}{message}", plugin=name, hook=hook)


def _counts(drafter, hook: str, got, rows: int, what: str) -> list[int]:
    """``got`` (a sequence of ``rows`` non-negative integers: Python's, numpy's, a
    tensor's) as a list of ints; anything else is the drafter's error."""
    try:
        if isinstance(got, torch.Tensor):
            got = got.tolist()
        if isinstance(got, (str, bytes)) or len(got) != rows:
            raise TypeError
        out = []
        for n in got:
            if isinstance(n, (bool, np.bool_)):
                raise TypeError
            out.append(operator.index(n))
    except TypeError:
        raise _fail(
            drafter,
            hook,
            f" returned {what} = {got!r}: expected {rows} integers, one per active row",
        ) from None
    return out


def check_passes(drafter, hook: str, n) -> int:
    """What a drafter's ``start`` or ``admit`` returned: the forward passes it ran, an int
    >= 0 (counted in the statistics); anything else is the drafter's error."""
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, numbers.Integral) or n < 0:
        raise _fail(
            drafter,
            hook,
            f": {hook}() returned {n!r}: expected the number of forward passes it ran, an "
            "int >= 0 (return 0 when it ran none)",
        )
    return int(n)


def check_offer(drafter, offer, rows: int) -> tuple[list[int], list[int]] | None:
    """A drafter's :meth:`~bass.hooks.Drafter.offer` must be ``None`` or an
    :class:`~bass.hooks.Offer` with one continuation and one match length (an int >= 0)
    per active row; anything else is a
    :class:`~bass.errors.PluginOutputError` naming the drafter (host lists only). Returns
    what the policy sees: the continuations' lengths and the match lengths, or ``None``."""
    if offer is None:
        return None
    if not isinstance(offer, Offer):
        what = f": offer() returned {type(offer).__name__}, expected a bass.hooks.Offer or None"
        raise _fail(drafter, "offer", what)
    R, tokens = rows, offer.tokens
    try:
        found = [len(t) for t in tokens] if not isinstance(tokens, (str, bytes)) else None
    except TypeError:
        found = None
    if found is None or len(found) != R:
        what = f": Offer.tokens = {tokens!r}: expected one list of token ids per active row ({R})"
        raise _fail(drafter, "offer", what)
    match = _counts(drafter, "offer", offer.match_len, R, "Offer.match_len")
    if min(match, default=0) < 0:
        raise _fail(drafter, "offer", f": Offer.match_len = {match}: each must be >= 0")
    return found, match


def check_proposal(
    drafter, prop: Proposal, lengths: list[int], params, vocab: tuple[int, int], coupled: bool
) -> Proposal:
    """A drafter's proposal must fit the lengths it was given, its host tokens be ids in
    ``[0, vocab[0])`` (the ids the main model takes), its device tokens an integer tensor
    of the right shape (their range is checked in the step's one host read,
    :func:`read_step`) and its ``probs`` one distribution over the main model's
    ``vocab[1]`` logits per drafted token (host lists and metadata only: no sync). A
    stochastic drafter must say what it drew from when sampling. Anything else is a
    :class:`~bass.errors.PluginOutputError` (a ``ValueError`` and a ``TypeError``) naming
    the drafter. Returns ``prop`` with ``drafted`` as a list of ints."""
    vocab, width = vocab
    if not isinstance(prop, Proposal):
        raise _fail(
            drafter,
            "propose",
            f": propose() returned {type(prop).__name__}, expected a bass.hooks.Proposal",
        )
    drafted = _counts(drafter, "propose", prop.drafted, len(lengths), "Proposal.drafted")
    if any(not 0 <= d <= k for d, k in zip(drafted, lengths, strict=True)):
        raise _fail(
            drafter,
            "propose",
            f" proposed {drafted} tokens for rows allowed {lengths}: each "
            "row's count must be within 0..its length",
        )
    if prop.host_tokens is None and prop.tokens is None:
        raise _fail(drafter, "propose", " returned a Proposal with neither tokens nor host_tokens")
    if prop.host_tokens is not None and prop.tokens is not None:  # which would be verified?
        raise _fail(
            drafter,
            "propose",
            " returned a Proposal with both tokens and host_tokens: give one (host_tokens "
            "for ids on the host, tokens for a device tensor)",
        )
    if prop.host_tokens is not None:
        if [len(t) for t in prop.host_tokens] != drafted:
            raise _fail(
                drafter,
                "propose",
                f": host_tokens have {[len(t) for t in prop.host_tokens]} "
                f"tokens per row but drafted says {drafted}",
            )
        for t in itertools.chain.from_iterable(prop.host_tokens):
            if isinstance(t, bool) or not isinstance(t, numbers.Integral):
                raise _fail(drafter, "propose", f" proposed {t!r}: token ids are ints")
            if not 0 <= t < vocab:
                raise _fail(
                    drafter,
                    "propose",
                    f" proposed token id {t}, outside the vocabulary [0, {vocab})",
                )
    K = max(drafted, default=0)
    if prop.tokens is not None:
        t = prop.tokens
        if (
            not isinstance(t, torch.Tensor)
            or t.is_floating_point()
            or t.is_complex()
            or t.dtype == torch.bool
            or t.dim() != 2
            or t.shape[0] != len(lengths)
            or t.shape[1] < K
        ):
            raise _fail(
                drafter,
                "propose",
                f": tokens must be an integer tensor [rows={len(lengths)}, "
                f">= {K}], got "
                + (f"{t.dtype} {list(t.shape)}" if isinstance(t, torch.Tensor) else repr(t)),
            )
    sampled = params.do_sample and not coupled
    if sampled and not drafter.deterministic and prop.probs is None:
        raise _fail(
            drafter,
            "propose",
            " samples its drafts (deterministic = False) but returned no "
            "probs: rejection sampling needs the distributions the drafts were drawn from",
        )
    if sampled and drafter.deterministic and prop.probs is not None:  # would bias the rows
        raise _fail(
            drafter,
            "propose",
            " is deterministic (deterministic = True, the Drafter default) but returned "
            "probs: rejection sampling would take its drafts as drawn from them; set "
            "deterministic = False if it samples its drafts from probs, else return probs=None",
        )
    q = prop.probs
    if (
        sampled
        and q is not None
        and K
        and (
            not isinstance(q, torch.Tensor)
            or not q.is_floating_point()
            or q.dim() != 3
            or q.shape[0] != len(lengths)
            or q.shape[1] < K
            or q.shape[2] != width
        )
    ):
        raise _fail(
            drafter,
            "propose",
            f": probs must be a float tensor [rows={len(lengths)}, >= {K}, {width}] (over the "
            "main model's logits), the distribution each draft token was drawn from, got "
            + (f"{q.dtype} {list(q.shape)}" if isinstance(q, torch.Tensor) else repr(q)),
        )
    R = len(lengths)
    for name, t, shape, ok in (
        ("bad", prop.bad, f"a bool tensor [rows={R}]", lambda t: t.dim() == 1 and len(t) == R),
        (
            "confidence",
            prop.confidence,
            f"a float tensor [rows={R}, >= {K}]",
            lambda t: (
                t.is_floating_point() and t.dim() == 2 and t.shape[0] == R and t.shape[1] >= K
            ),
        ),
    ):  # read in the step's one host read, at fixed offsets: a wrong shape would shift it
        if t is not None and not (isinstance(t, torch.Tensor) and not t.is_complex() and ok(t)):
            raise _fail(
                drafter,
                "propose",
                f": Proposal.{name} must be None or {shape}, got "
                + (f"{t.dtype} {list(t.shape)}" if isinstance(t, torch.Tensor) else repr(t)),
            )
    if type(prop.drafted) is not list or drafted != prop.drafted:
        prop = dataclasses.replace(prop, drafted=drafted)
    return prop


def draft_keys(state, slots: list[int], K: int, seed: int, main) -> torch.Tensor:
    """int64 ``[R, K]`` on ``main``'s device: the keys of each active row's next ``K``
    positions (coupled drafting: a draft token is drawn with its position's key)."""
    keys = torch.tensor(state.keys(seed, slots, K), dtype=torch.int64)
    return keys.view(len(slots), K).to(main.device, non_blocking=True)


def read_step(acc: Acceptance, logits, v: VerifyPass, prop: Proposal, prompts, step, gen, tail):
    """The step's one host read: accepted counts, next tokens, the non-finite flags of
    ``gen``'s main and draft models (raised as
    :class:`~bass.batch_state.NonFiniteLogitsError`), device drafts, the drafted tokens'
    confidences and ``tail`` (an int64 tensor, e.g. new rows' first tokens; else none).
    Returns ``(accepted, rows, confidence, tail, logprobs)``, ``rows[r]`` what row ``r``
    appends: its accepted drafts, then the main model's next token; ``logprobs[r]`` their
    log-probabilities (``None`` unless asked for: :attr:`Acceptance.logprobs`)."""
    R, K = len(prompts), v.drafts.shape[1]
    read = [acc.accepted, acc.next_tokens, nonfinite(logits)[v.index].any(dim=1).long()]
    n_lp = 0 if acc.logprobs is None else R * (K + 1)  # float64 read as int64 bits
    if n_lp:
        read.append(as_bits(acc.logprobs.reshape(-1)))
    device_drafts = prop.host_tokens is None
    if device_drafts:  # their non-finite flags, then as proposed (ids outside: negative)
        bad = prop.bad if prop.bad is not None else torch.zeros_like(acc.accepted)
        drafts = v.drafts.long()  # (-1 in a uint8 drafter's own type would read as 255)
        drafts = drafts if v.outside is None else torch.where(v.outside, -1, drafts)
        read += [bad.long(), drafts.reshape(-1)]
    n_tail = 0 if tail is None else tail.shape[0]
    unlikely = [] if acc.unlikely is None else [acc.unlikely.long()]
    host = torch.cat([*read, *unlikely, *([] if tail is None else [tail])]).tolist()  # the sync
    host, tail_host = host[: len(host) - n_tail], host[len(host) - n_tail :]
    lp_bits, host = host[3 * R : 3 * R + n_lp], host[: 3 * R] + host[3 * R + n_lp :]
    n_q = R if unlikely else 0
    host, unlikely = host[: len(host) - n_q], host[len(host) - n_q :]
    accepted, where = host[:R], f"step {step}"
    raise_if_nonfinite(host[2 * R : 3 * R], gen.main, "main", prompts, where)
    drafts = prop.host_tokens
    if device_drafts:
        model = getattr(gen.drafter, "model", None)  # a drafter of its own: named as one
        model = who(gen._drafting) if model is None else model
        raise_if_nonfinite(host[3 * R : 4 * R], model, "draft", prompts, where)
        flat = host[4 * R :]
        if min(flat, default=0) < 0:
            r = flat.index(-1) // K
            raise _fail(
                gen._drafting,
                "propose",
                f" proposed token ids outside the vocabulary [0, {gen.vocab}) for the row "
                f"of prompt {prompts[r]} ({where}): {prop.tokens[r, : prop.drafted[r]].tolist()}",
            )
        drafts = [flat[r * K : r * K + a] for r, a in enumerate(accepted)]
    if any(unlikely):
        r = unlikely.index(1)
        raise _fail(
            gen._drafting,
            "propose",
            f" reported probs that are no probability (0 or less, over 1, or NaN) for a "
            f"token it drafted, or NaN or inf for another, for the row of prompt {prompts[r]} "
            f"(step {step}): probs must "
            "be the distribution each draft token was drawn from (probabilities, not "
            "log-probabilities or logits)",
        )
    rows = [[*d[:a], t] for d, a, t in zip(drafts, accepted, host[R : 2 * R])]
    confidence = None
    if prop.confidence is not None:  # an early stop's: each drafted token's top-1
        conf = prop.confidence.tolist()
        confidence = [conf[r][: prop.drafted[r]] for r in range(R)]
    logprobs = None
    if n_lp:
        lp = from_bits(lp_bits).reshape(R, K + 1).tolist()
        logprobs = [row[: a + 1] for row, a in zip(lp, accepted)]
    return accepted, rows, confidence, tail_host, logprobs
