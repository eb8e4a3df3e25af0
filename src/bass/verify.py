"""A speculative step's verification: the verify pass's inputs (:func:`verify_pass`) and
the verdict on every active row's drafts (:func:`accept`), plus the checks a drafter's
proposal must pass (:func:`check_proposal`). The engine (:mod:`bass.engine`) calls them
in its step's phases 2-4; the terms are docs/concepts/engine.md's.
"""

from __future__ import annotations

import itertools
import numbers
from dataclasses import dataclass

import torch

from .batch_state import raise_if_nonfinite
from .drafters import nonfinite
from .errors import PluginOutputError
from .hooks import Proposal
from .packing import Extra, PackedPass
from .sampling import (
    Acceptance,
    forced_accept,
    greedy_accept_ids,
    sample_keyed,
    speculative_accept,
    warp_probs,
)

__all__ = [
    "VerifyPass",
    "accept",
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
    tokens."""

    batch: PackedPass
    index: torch.Tensor
    drafted: torch.Tensor
    drafts: torch.Tensor
    keys: torch.Tensor | None
    n: int = 0
    filled: int = 0


def verify_pass(gen, state, slots, prop: Proposal, keyed: bool, seed: int, fill) -> VerifyPass:
    """3) The verify pass's inputs (``gen``: the :class:`bass.Generator`, its passes, main
    model and cache): every active row (cache slots ``slots``, ascending) feeds ``[last,
    d_1..d_n]``, ``n = prop.drafted[r]``; the step's small device tensors ride in the
    pass's one host-to-device copy (:class:`VerifyPass` names them and their shapes).
    ``keyed``: add the sampling keys of each row's positions (keyed draws,
    :func:`bass.sampling.position_keys` with ``seed``). ``fill``: slots of rows just
    admitted (ascending, not in ``slots``) whose whole prompt this pass feeds, from an
    empty cache row (their prefill, riding in the verify pass); only their last token's
    logits are computed, after the verify tokens' (:attr:`VerifyPass.filled`).

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
    for s in fill:  # a new row: its prompt, from position 0
        q_lens[s], lens[s] = len(state.seqs[s]), 0
    last = [state.seqs[s][-1] for s in slots]
    extra = {"index": Extra(index, (R, K + 1)), "drafted": Extra(prop.drafted, (R,))}
    row_of = {s: r for r, s in enumerate(slots)}
    logits_at = None
    if fill:  # the verify tokens' logits, then each new row's last token's
        flat = [0, *itertools.accumulate(q_lens)]
        verify_at = [flat[s] + i for s in slots for i in range(q_lens[s])]
        logits_at = verify_at + [flat[s + 1] - 1 for s in fill]
    if prop.host_tokens is not None:  # drafts on the host (n-grams, or none)
        rows = (
            (last[row_of[s]], *prop.host_tokens[row_of[s]]) if s in row_of else state.seqs[s]
            for s in sorted([*slots, *fill])
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
            prompt_ids = [t for s in fill for t in state.seqs[s]]
            extra["prompts"] = Extra(prompt_ids, (len(prompt_ids),))
    if keyed:  # the sampling keys of the positions each row may emit, one per fed token
        grid = state.keys(seed, slots, K + 1)  # [R, K+1], row-major
        keys = [grid[r * (K + 1) + i] for r in range(R) for i in range(1 + prop.drafted[r])]
        extra["keys"] = Extra(keys, (len(keys),))
    batch = gen.passes.pack(
        gen.main, q_lens, lens, gen.cache.lens.device, ids=ids, logits_at=logits_at, extra=extra
    )
    e = batch.extra
    if ids is None:
        drafts = prop.tokens[:, :K]
        table = torch.cat([e["last"], drafts], dim=1).view(-1)  # [R*(K+1)]: what rows feed
        if fill:
            table = torch.cat([table, e["prompts"]])
        batch.set_input_ids(table[e["gather"]])
    else:
        drafts = e["drafts"]
    return VerifyPass(batch, e["index"], e["drafted"], drafts, e.get("keys"), start, len(fill))


def accept(
    v: VerifyPass,
    logits: torch.Tensor,  # [N or L, V]: the verify pass's logits
    prop: Proposal,
    params,
    generator: torch.Generator,
    forced: float | None,
) -> Acceptance:
    """4) The verdict for every active row, batched on the device (no host read;
    docs/concepts/engine.md); ``forced`` (benchmarks only): each draft kept with that
    probability."""
    if forced is not None:
        best = logits.argmax(dim=-1)[v.index]  # [R, K+1]
        return forced_accept(v.drafted, best, forced, generator)
    if not params.do_sample:
        return greedy_accept_ids(v.drafts, logits.argmax(dim=-1)[v.index], v.drafted)
    if v.keys is not None:  # deterministic drafts: kept while equal to the keyed draws
        # drawn at the pass's real tokens only (the [R, K+1] grid repeats a short row's
        # last token: warping and drawing over the vocabulary there would be wasted)
        n = v.keys.shape[0]
        draws = sample_keyed(warp_probs(logits[:n], params), v.keys)  # [n]
        return greedy_accept_ids(v.drafts, draws[v.index], v.drafted)
    p = warp_probs(logits[v.index], params)  # [R, K+1, V]
    K = v.drafts.shape[1]  # sampled drafts: lossless rejection sampling
    return speculative_accept(v.drafts, prop.probs[:, :K], p, v.drafted, generator)


def check_proposal(
    drafter, prop: Proposal, lengths: list[int], params, vocab: int, coupled: bool
) -> None:
    """A drafter's proposal must fit the lengths it was given, its host tokens be ids in
    ``[0, vocab)`` and its device tokens an integer tensor of the right shape (host lists
    and metadata only: no sync). A stochastic drafter must say what it drew from when
    sampling. Anything else is a :class:`~bass.errors.PluginOutputError` (a ``ValueError``
    and a ``TypeError``) naming the drafter."""
    name = type(drafter).__name__  # the drafter itself (Generator.drafter), not its guard
    if not isinstance(prop, Proposal):
        raise PluginOutputError(
            f"drafter {name}: propose() returned {type(prop).__name__}, expected a "
            "bass.hooks.Proposal"
        )
    drafted = prop.drafted
    if len(drafted) != len(lengths) or any(
        not 0 <= d <= k for d, k in zip(drafted, lengths, strict=True)
    ):
        raise PluginOutputError(
            f"drafter {name} proposed {drafted} tokens for rows allowed {lengths}: each "
            "row's count must be within 0..its length"
        )
    if prop.host_tokens is None and prop.tokens is None:
        raise PluginOutputError(
            f"drafter {name} returned a Proposal with neither tokens nor host_tokens"
        )
    if prop.host_tokens is not None:
        if [len(t) for t in prop.host_tokens] != drafted:
            raise PluginOutputError(
                f"drafter {name}: host_tokens have {[len(t) for t in prop.host_tokens]} tokens "
                f"per row but drafted says {drafted}"
            )
        for t in itertools.chain.from_iterable(prop.host_tokens):
            if isinstance(t, bool) or not isinstance(t, numbers.Integral):
                raise PluginOutputError(f"drafter {name} proposed {t!r}: token ids are ints")
            if not 0 <= t < vocab:
                raise PluginOutputError(
                    f"drafter {name} proposed token id {t}, outside the vocabulary [0, {vocab})"
                )
    if prop.tokens is not None:
        t = prop.tokens
        if (
            not isinstance(t, torch.Tensor)
            or t.is_floating_point()
            or t.is_complex()
            or t.dtype == torch.bool
            or t.dim() != 2
            or t.shape[0] != len(lengths)
            or t.shape[1] < max(drafted, default=0)
        ):
            raise PluginOutputError(
                f"drafter {name}: tokens must be an integer tensor [rows={len(lengths)}, "
                f">= {max(drafted, default=0)}], got "
                + (f"{t.dtype} {list(t.shape)}" if isinstance(t, torch.Tensor) else repr(t))
            )
    if params.do_sample and not coupled and not drafter.deterministic and prop.probs is None:
        raise PluginOutputError(
            f"drafter {name} samples its drafts (deterministic = False) but returned no probs: "
            "rejection sampling needs the distributions the drafts were drawn from"
        )


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
    Returns ``(accepted, rows, confidence, tail)``, ``rows[r]`` what row ``r`` appends:
    its accepted drafts, then the main model's next token."""
    R, K = len(prompts), v.drafts.shape[1]
    read = [acc.accepted, acc.next_tokens, nonfinite(logits)[v.index].any(dim=1).long()]
    device_drafts = prop.host_tokens is None
    if device_drafts:
        bad = prop.bad if prop.bad is not None else torch.zeros_like(acc.accepted)
        read += [bad.long(), v.drafts.reshape(-1)]
    n_tail = 0 if tail is None else tail.shape[0]
    host = torch.cat([*read, *([] if tail is None else [tail])]).tolist()  # the one sync
    host, tail_host = host[: len(host) - n_tail], host[len(host) - n_tail :]
    accepted, where = host[:R], f"step {step}"
    raise_if_nonfinite(host[2 * R : 3 * R], gen.main, "main", prompts, where)
    drafts = prop.host_tokens
    if device_drafts:
        raise_if_nonfinite(host[3 * R : 4 * R], gen.drafter.model, "draft", prompts, where)
        flat = host[4 * R :]
        drafts = [flat[r * K : r * K + a] for r, a in enumerate(accepted)]
    rows = [[*d[:a], t] for d, a, t in zip(drafts, accepted, host[R : 2 * R])]
    confidence = None
    if prop.confidence is not None:  # an early stop's: each drafted token's top-1
        conf = prop.confidence.tolist()
        confidence = [conf[r][: prop.drafted[r]] for r in range(R)]
    return accepted, rows, confidence, tail_host
