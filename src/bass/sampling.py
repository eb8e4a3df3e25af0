"""Token selection: warping, sampling and draft acceptance, batched with no host sync
(terms: docs/concepts/engine.md; guarantees and design: docs/concepts/exactness.md).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import torch

__all__ = [
    "SAMPLING",
    "Acceptance",
    "SamplingParams",
    "as_bits",
    "forced_accept",
    "from_bits",
    "generator_seed",
    "greedy_accept_ids",
    "position_keys",
    "raw_logprobs",
    "row_key",
    "sample",
    "sample_keyed",
    "speculative_accept",
    "token_logprobs",
    "warp_logits",
    "warp_probs",
]


@dataclass
class SamplingParams:
    """How the next token is chosen, by the draft and main models alike: greedy (argmax)
    unless ``do_sample``, else sampled from :func:`warp_probs`. Checked by
    :mod:`bass.options`, not here.
    """

    do_sample: bool = False
    temperature: float = 1.0  # > 0 when do_sample
    top_k: int | None = None  # None (no limit) or >= 1
    top_p: float | None = None  # None (no limit) or 0 < top_p <= 1
    min_p: float | None = None  # None (no limit) or 0 <= min_p <= 1
    repetition_penalty: float | None = None  # None or in [0.001, 1000]: bass.repetition
    frequency_penalty: float | None = None  # None or in [-2, 2]: bass.repetition
    presence_penalty: float | None = None  # None or in [-2, 2]: bass.repetition
    logprobs: str | None = None  # None, "raw" or "processed": :func:`token_logprobs`


#: :class:`SamplingParams`' fields, the options of ``generate`` they come from.
SAMPLING = tuple(SamplingParams.__dataclass_fields__)


def warp_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The sampling distribution ``params`` defines over each row of ``logits``:
    temperature, top-k (ties with the k-th logit kept), top-p (the smallest most likely
    set of mass ``>= top_p``, at least one token, computed as transformers' warper
    computes it: the same tokens kept), min-p (tokens at least ``min_p`` times as likely
    as the likeliest), softmax; ``do_sample`` is not read.

    Args:
        logits: ``[..., V]`` any floating dtype.
        params: the warping to apply.

    Returns:
        ``[..., V]`` probabilities, float32 (float64 if ``logits`` is float64).
    """
    return torch.softmax(warp_logits(logits, params), dim=-1)


def warp_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """:func:`warp_probs` before its softmax: the warped logits, float32 (float64 for
    float64 ``logits``), shifted so each row's largest is 0, ``-inf`` where a token is
    dropped."""
    if not logits.is_floating_point():
        raise TypeError(f"warp_probs needs floating-point logits, got {logits.dtype}")
    if params.temperature <= 0:
        raise ValueError(
            f"warp_probs needs temperature > 0, got {params.temperature!r} "
            "(greedy decoding takes the argmax of the logits)"
        )
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    x = logits.to(dtype)  # [..., V]
    drop_k = None
    if params.top_k is not None and params.top_k < x.shape[-1]:  # on the logits themselves
        kth = torch.topk(x, params.top_k, dim=-1).values[..., -1:]  # [..., 1]
        drop_k = x < kth
    # shifted so the largest logit is 0 before dividing: a tiny temperature sends the
    # others to -inf (a one-hot), never the largest to +inf (inf - inf: NaN)
    # (a temperature below the dtype's smallest normal would round to 0 there: 0 / 0)
    t = max(params.temperature, torch.finfo(dtype).tiny)
    x = (x - x.amax(dim=-1, keepdim=True)) / t
    if drop_k is not None:
        x = x.masked_fill(drop_k, -math.inf)
    if params.top_p is not None and params.top_p < 1:
        # as transformers' TopPLogitsWarper computes it (the same sort, the same sums: the
        # same tokens kept, ties at the edge and rounding included): ascending, a token
        # dropped while the mass up to it (itself included) is <= 1 - top_p
        sorted_x, order = torch.sort(x, dim=-1)  # [..., V] each
        mass_to = torch.softmax(sorted_x, dim=-1).cumsum(dim=-1)  # [..., V]
        drop_sorted = mass_to <= 1 - params.top_p  # [..., V]
        drop_sorted[..., -1] = False  # the most likely token always stays (top_p ~ 0 too)
        drop = torch.empty_like(drop_sorted).scatter_(-1, order, drop_sorted)  # [..., V]
        x = x.masked_fill(drop, -math.inf)
    if params.min_p:  # as transformers' MinPLogitsWarper: a token less likely than min_p
        probs = torch.softmax(x, dim=-1)  # times the likeliest is dropped
        x = x.masked_fill(probs < params.min_p * probs.amax(dim=-1, keepdim=True), -math.inf)
    return x


def token_logprobs(
    logits: torch.Tensor,
    index: torch.Tensor,
    tokens: torch.Tensor,
    params: SamplingParams,
    warped: torch.Tensor | None = None,
) -> torch.Tensor:
    """Each token's log-probability: row ``index`` of ``logits`` ``[N, V]`` at ``tokens``
    (``index`` and ``tokens`` int64 of one shape; returned float64 in that shape, no host
    sync). ``params.logprobs`` ``"raw"``: under the model's own distribution (the logits'
    log-softmax, as a forward pass over the sequence gives it); ``"processed"``: under the
    one tokens are drawn from (:func:`warp_logits`, or ``warped``, its value already
    computed: temperature, top-k, top-p, min-p; greedy decoding: the raw one)."""
    if params.logprobs == "processed" and params.do_sample:
        x = warp_logits(logits, params) if warped is None else warped  # [N, V]
        return (x[index, tokens] - torch.logsumexp(x, dim=-1)[index]).double()
    return raw_logprobs(logits, index, tokens)


def raw_logprobs(logits: torch.Tensor, index: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """:func:`token_logprobs`'s ``"raw"`` ones: under the model's own distribution."""
    # half-precision logits normalised in float32, 256 rows at a time: no [N, V] copy
    dtype = torch.promote_types(logits.dtype, torch.float32)
    lse = torch.cat([torch.logsumexp(c.to(dtype), dim=-1) for c in logits.split(256)])
    return (logits[index, tokens].to(dtype) - lse[index]).double()


def as_bits(x: torch.Tensor) -> torch.Tensor:
    """float64 ``x`` as the int64 of its bits: it rides in a step's int64 host read."""
    return x.view(torch.int64)


def from_bits(host: list[int]) -> np.ndarray:
    """What :func:`as_bits` sent, read back on the host: float64, exact."""
    return np.array(host, dtype=np.int64).view(np.float64)


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Draw one token per row of ``probs`` (need not be normalised) without a host sync:
    the exponential race ``argmax(probs / E)``, ``probs.numel()`` Exp(1) draws.

    Args:
        probs: ``[B, V]`` (or ``[..., V]``) non-negative weights, each row with a
            positive entry.
        generator: source of randomness on ``probs``' device (default: torch's global one).

    Returns:
        int64 ``[B]`` token ids.
    """
    if probs.dtype not in (torch.float32, torch.float64):
        probs = probs.float()
    noise = torch.empty_like(probs).exponential_(1.0, generator=generator)  # [B, V]
    # An Exp(1) draw of exactly 0 would make 0 / 0 = NaN, which argmax would pick.
    noise.clamp_min_(torch.finfo(noise.dtype).tiny)
    return torch.argmax(probs / noise, dim=-1)


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_ROW_MULT = np.uint64(0xD1B54A32D192ED03)
_POS_MULT = np.uint64(0xAEF17502108EF2D9)


def _mix64(z: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer on uint64 arrays (arithmetic wraps modulo 2**64)."""
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


def position_keys(seed: int, rows, starts, width: int) -> list[int]:
    """The 53-bit keys of positions ``starts[r] .. starts[r] + width - 1`` of each row
    ``rows[r]``, row-major Python ints, a hash of ``(seed, row, t)`` computed on the host
    (docs/concepts/exactness.md, "Keyed draws")."""
    with np.errstate(over="ignore"):
        s = np.array([seed & (2**64 - 1)], dtype=np.uint64)
        r = np.asarray(rows, dtype=np.uint64).reshape(-1, 1)
        t = np.asarray(starts, dtype=np.uint64).reshape(-1, 1) + np.arange(width, dtype=np.uint64)
        h = _mix64(s ^ _GOLDEN)
        h = _mix64(h ^ (r * _ROW_MULT))
        h = _mix64(h ^ (t * _POS_MULT))
    return (h >> np.uint64(11)).astype(np.int64).reshape(-1).tolist()


#: :func:`row_key` keeps a prompt's sample index in the low bits: at most this many
#: samples per prompt (and ``2**39`` prompts).
SAMPLE_BITS = 24


def row_key(prompt: int, sample: int) -> int:
    """The row id (``generate(row_ids=...)``) of sample ``sample`` of prompt ``prompt`` in
    a job: a function of the two alone, so a row draws the same samples however the job
    is batched, resumed, split over ranks or given more samples per prompt.

    >>> row_key(0, 0), row_key(0, 1), row_key(2, 1)
    (0, 1, 33554433)
    """
    if not (0 <= sample < 2**SAMPLE_BITS and 0 <= prompt < 2 ** (63 - SAMPLE_BITS)):
        raise ValueError(
            f"row_key({prompt}, {sample}): expected 0 <= sample < 2**{SAMPLE_BITS} and 0 <= "
            f"prompt < 2**{63 - SAMPLE_BITS}"
        )
    return (prompt << SAMPLE_BITS) | sample


def generator_seed(seed: int, row_ids: list[int]) -> int:
    """The seed of a generation's ``torch.Generator`` (rejection sampling): ``seed`` for
    rows ``0..B-1``, else a hash of ``seed`` and ``row_ids``, so a job's batches and ranks
    do not all draw the same stream.

    >>> generator_seed(7, [0, 1, 2]), generator_seed(7, [3, 4]) == generator_seed(7, [3, 4])
    (7, True)
    """
    if list(row_ids) == list(range(len(row_ids))):
        return seed
    return position_keys(seed, [row_ids[0]], [len(row_ids)], 1)[0] & (2**63 - 1)


#: Tokens per block of :func:`sample_keyed`'s race (``bench/results/cpu_coupling.md``).
BLOCK = 64


# splitmix64's constants as signed int64 (torch has no uint64 arithmetic)
_GAMMA, _M1, _M2 = np.array([_GOLDEN, _MIX1, _MIX2]).view(np.int64).tolist()


@functools.cache
def _constants(device: torch.device) -> dict[str, torch.Tensor]:
    """:func:`_uniforms`' constants as int64 tensors on ``device`` (a large Python int
    operand takes a slow path)."""
    ints = {"gamma": _GAMMA, "m1": _M1, "m2": _M2, "one": 0x3FF << 52}
    ints |= {f"mask{k}": (1 << (64 - k)) - 1 for k in (12, 27, 30, 31)}
    return {k: torch.tensor(v, dtype=torch.int64, device=device) for k, v in ints.items()}


def _uniforms(keys: torch.Tensor, count: int) -> torch.Tensor:
    """float64 ``[..., count]`` in ``(0, 1)``: outputs ``1..count`` of each key's
    splitmix64 stream, in integer arithmetic (``>>`` is arithmetic, hence the masks)."""
    c = _constants(keys.device)
    z = keys[..., None] + torch.arange(1, count + 1, device=keys.device) * c["gamma"]
    z = (z ^ ((z >> 30) & c["mask30"])) * c["m1"]
    z = (z ^ ((z >> 27) & c["mask27"])) * c["m2"]
    z = z ^ ((z >> 31) & c["mask31"])
    one_to_two = (((z >> 12) & c["mask12"]) | c["one"]).view(torch.float64)
    return one_to_two - (1.0 - 2.0**-53)


def sample_keyed(probs: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """One token per row of ``probs``, a function of the row's weights and its key only
    (a race over blocks of :data:`BLOCK` tokens, then inverse CDF in the winning block:
    docs/concepts/exactness.md, "Keyed draws").

    Args:
        probs: ``[..., V]`` non-negative weights, each row with a positive entry (need
            not be normalised).
        keys: int64 ``[...]`` (:func:`position_keys`' 53-bit keys).

    Returns:
        int64 ``[...]`` token ids.
    """
    if keys.shape != probs.shape[:-1]:
        raise ValueError(
            f"keys must be {list(probs.shape[:-1])} for probs {list(probs.shape)}, "
            f"got {list(keys.shape)}"
        )
    V = probs.shape[-1]
    pad = -V % BLOCK
    if pad:
        probs = torch.nn.functional.pad(probs, (0, pad))
    blocks = probs.unflatten(-1, (-1, BLOCK))  # [..., C, BLOCK]
    mass = blocks.sum(-1, dtype=torch.float64)  # [..., C]
    C = mass.shape[-1]
    u = _uniforms(keys, C + 1)  # [..., C + 1]: one per block, one within the winner
    race = mass / -torch.log(u[..., :C])  # [..., C]: 0 for an empty block
    c = race.argmax(dim=-1, keepdim=True)  # [..., 1]
    inside = blocks.gather(-2, c[..., None].expand(*c.shape, BLOCK)).squeeze(-2)  # [..., B]
    cdf = inside.to(torch.float64).cumsum(dim=-1)  # [..., BLOCK]
    total = cdf[..., -1:]  # [..., 1]
    x = u[..., C:] * total
    # u * total may round up to total: stay below it, so the pick has positive weight
    x = torch.minimum(x, torch.nextafter(total, torch.zeros_like(total)))
    j = torch.searchsorted(cdf, x, right=True)  # [..., 1]
    return (c * BLOCK + j).squeeze(-1)


@dataclass
class Acceptance:
    """The verifier's verdict for a batch of rows."""

    accepted: torch.Tensor  # int64 [B], 0..draft_lens[b]: accepted draft tokens
    next_tokens: torch.Tensor  # int64 [B]: correction if accepted < draft_lens, else bonus
    # bool [B] (rejection sampling): a drafted token its reported q gives no probability
    unlikely: torch.Tensor | None = None
    # float64 [B, K+1] (params.logprobs): the log-probability of each token a row emits,
    # its accepted drafts then its next token (past those: the next token's, unread)
    logprobs: torch.Tensor | None = None


def _accept_prefix(accept: torch.Tensor) -> torch.Tensor:
    """Length of the all-True prefix of each row: bool ``[B, K]`` -> int64 ``[B]``."""
    return accept.long().cumprod(dim=1).sum(dim=1)


def greedy_accept_ids(
    draft_tokens: torch.Tensor, target_ids: torch.Tensor, draft_lens: torch.Tensor
) -> Acceptance:
    """Keep drafts while they equal the main model's tokens ``target_ids`` int64
    ``[B, K+1]`` (its argmax, or its keyed draws): ``accepted[b]`` the longest agreeing
    prefix ``<= draft_lens[b]``, ``next_tokens[b] = target_ids[b, accepted[b]]``.
    ``draft_tokens`` int64 ``[B, K]`` (padding past ``draft_lens[b]``: any value);
    ``draft_lens`` int32 or int64 ``[B]``, ``<= K`` (not checked: that would sync)."""
    k = draft_tokens.shape[1]
    if target_ids.shape != (draft_tokens.shape[0], k + 1):
        raise ValueError(
            f"target_ids must be [B, K+1] = [{draft_tokens.shape[0]}, {k + 1}], "
            f"got {list(target_ids.shape)}"
        )
    in_draft = torch.arange(k, device=draft_tokens.device) < draft_lens[:, None]  # [B, K]
    accepted = _accept_prefix((draft_tokens == target_ids[:, :k]) & in_draft)  # [B]
    next_tokens = target_ids.gather(1, accepted[:, None]).squeeze(1)  # [B]
    return Acceptance(accepted=accepted, next_tokens=next_tokens)


def speculative_accept(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    draft_lens: torch.Tensor,
    generator: torch.Generator | None = None,
) -> Acceptance:
    """Lossless rejection-sampling verification of sampled drafts (the rule, and the draws
    it consumes: docs/concepts/exactness.md, "Rejection sampling").

    Args:
        draft_tokens: int64 ``[B, K]``, ``draft_tokens[b, i]`` sampled from
            ``draft_probs[b, i]`` for ``i < draft_lens[b]``; other slots are padding.
        draft_probs: ``[B, K, V]`` the warped draft distributions ``q``: weights as
            :func:`sample` takes them (negative ones read as 0), normalised here.
        target_probs: ``[B, K+1, V]`` the warped main-model distributions ``p`` at the
            positions fed ``[last, d_1 .. d_K]``.
        draft_lens: int32 or int64 ``[B]``, ``0 <= draft_lens[b] <= K`` (not checked).
        generator: the draws' source (default: torch's global one).
    """
    if draft_tokens.dim() != 2 or draft_tokens.dtype != torch.int64:
        raise ValueError(
            f"draft_tokens must be int64 [B, K], got {draft_tokens.dtype} "
            f"{list(draft_tokens.shape)}"
        )
    b, k = draft_tokens.shape
    if target_probs.dim() != 3 or target_probs.shape[:2] != (b, k + 1):
        raise ValueError(
            f"target_probs must be [B, K+1, V] = [{b}, {k + 1}, V] for draft_tokens "
            f"{list(draft_tokens.shape)}, got {list(target_probs.shape)}"
        )
    if draft_lens.shape != (b,) or draft_lens.dtype not in (torch.int32, torch.int64):
        raise ValueError(
            f"draft_lens must be int32 or int64 [B] = [{b}], got {draft_lens.dtype} "
            f"{list(draft_lens.shape)}"
        )
    v = target_probs.shape[-1]
    if draft_probs.shape != (b, k, v):
        raise ValueError(
            f"draft_probs must be [B, K, V] = [{b}, {k}, {v}], got {list(draft_probs.shape)}"
        )
    dtype = torch.promote_types(draft_probs.dtype, target_probs.dtype)
    dtype = dtype if dtype == torch.float64 else torch.float32
    p, q = target_probs.to(dtype), draft_probs.to(dtype)  # [B, K+1, V], [B, K, V]
    q = q.clamp_min(0)  # weights as sample() takes them: normalised (a sum of 0 or NaN:
    q = q / q.sum(dim=-1, keepdim=True)  # NaN, every draft rejected, the token drawn from p)
    device = p.device

    in_draft = torch.arange(k, device=device) < draft_lens[:, None]  # [B, K]
    tokens = torch.where(in_draft, draft_tokens, 0)[..., None]  # [B, K, 1], padding -> 0
    p_d = p[:, :k].gather(2, tokens).squeeze(2)  # [B, K] p_i(d_{i+1})
    q_d = q.gather(2, tokens).squeeze(2)  # [B, K] q_i(d_{i+1})
    u = torch.rand((b, k), generator=generator, device=device, dtype=dtype)  # [B, K]
    # u < p/q without dividing: q_d == 0 (never drafted) accepts iff p_d > 0.
    accepted = _accept_prefix((u * q_d < p_d) & in_draft)  # [B]

    # Row b's last token comes from position accepted[b] (<= draft_lens[b] <= K).
    at = accepted[:, None, None].expand(b, 1, v)  # [B, 1, V]
    p_at = p.gather(1, at).squeeze(1)  # [B, V]
    if k > 0:
        q_at = q.gather(1, at.clamp(max=k - 1)).squeeze(1)  # [B, V] (unused for bonus rows)
    else:
        q_at = torch.zeros_like(p_at)
    rejected = (accepted < draft_lens)[:, None]  # [B, 1]
    residual = torch.where(rejected, (p_at - q_at).clamp_min(0), p_at)  # [B, V]
    residual = torch.where(residual.sum(dim=1, keepdim=True) > 0, residual, p_at)
    next_tokens = sample(residual, generator)  # the race needs no normalization
    return Acceptance(accepted=accepted, next_tokens=next_tokens)


def forced_accept(drafted: torch.Tensor, best: torch.Tensor, p: float, gen) -> Acceptance:
    """Benchmark-only acceptance (``forced_acceptance=p``): each of row ``b``'s
    ``drafted[b]`` tokens kept with probability ``p`` until the first failure; the next
    token is ``best[b]`` (the argmax, int64 ``[B, K+1]``) there. ``gen``: the generator."""
    B, K1 = best.shape
    u = torch.rand(B, K1 - 1, generator=gen, device=best.device)  # [B, K]
    ok = (u < p) & (torch.arange(K1 - 1, device=best.device) < drafted[:, None])
    accepted = _accept_prefix(ok)  # [B]
    return Acceptance(accepted, best.gather(1, accepted[:, None]).squeeze(1))
