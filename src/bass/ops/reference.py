"""``reference``: the pure-PyTorch implementation (the fallback: docs/reference/ops.md,
"reference"), and the helpers of the one layout that other implementations share (row
gathers, the KV append)."""

from __future__ import annotations

import torch

from .contract import token_major

# Elements of K (and as many of V) the reference gathers per chunk of tokens
GATHER_BUDGET = 1 << 25


def token_rows(starts: torch.Tensor, q_lens: torch.Tensor, n: int):
    """For each of ``n`` flat tokens: its row (int64 ``[n]``, clamped to ``0..B-1``), its
    index within the row, and whether it belongs to a row: the last row starting at or
    before it (rows are disjoint and in order; an empty row shares the next one's start)."""
    j = torch.arange(n, device=starts.device)
    s = starts.to(torch.long)
    if s.shape[0] == 0:  # no rows: every token belongs to none
        return torch.zeros_like(j), torch.zeros_like(j), torch.zeros_like(j, dtype=torch.bool)
    row = (torch.searchsorted(s, j, right=True) - 1).clamp(min=0)
    i = j - s.index_select(0, row)
    live = (i >= 0) & (i < q_lens.to(torch.long).index_select(0, row))
    return row, i, live


def row_slots(starts, q_lens, T: int, N: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The gather into rows of ``T`` slots, for implementations that take padded rows:
    ``src`` int64 ``[B, T]``, the token row ``b``'s slot ``t`` reads (past ``q_len``: the
    row's last, clamped into ``0..N-1``); ``back`` int64 ``[N]``, each token's slot ``b * T
    + t``, or ``B * T`` (one slot past the end, which :func:`from_rows` makes 0) for a token
    of no row."""
    t = torch.arange(T, device=starts.device)
    last = (q_lens.to(torch.long)[:, None] - 1).clamp(min=0)
    src = (starts.to(torch.long)[:, None] + torch.minimum(t, last)).clamp(0, max(N - 1, 0))
    row, i, live = token_rows(starts, q_lens, N)
    return src, torch.where(live, row * T + i, starts.shape[0] * T)


def to_rows(q: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """Flat queries ``[1, Hq, N, D]`` gathered into rows ``[B, Hq, T, D]`` (token-major
    storage) by :func:`row_slots`' ``src``."""
    B, T = src.shape
    _, Hq, N, D = q.shape
    if N == 0:  # no token to gather (src points at token 0)
        return q.new_zeros(B, T, Hq, D).transpose(1, 2)
    return q[0].transpose(0, 1).index_select(0, src.flatten()).view(B, T, Hq, D).transpose(1, 2)


def from_rows(o: torch.Tensor, back: torch.Tensor) -> torch.Tensor:
    """Rows ``[B, Hq, T, D]`` back to flat tokens ``[1, Hq, N, D]`` token-major, by
    :func:`row_slots`' ``back`` (tokens of no row get 0)."""
    B, Hq, T, D = o.shape
    o = o.transpose(1, 2).reshape(B * T, Hq, D)
    return torch.cat([o, o.new_zeros(1, Hq, D)]).index_select(0, back)[None].transpose(1, 2)


def attention(q, k, v, starts, q_lens, kv_lens, scale: float, softcap: float | None = None,
              sinks=None, window: int | None = None) -> torch.Tensor:  # fmt: skip
    """Each token's row of ``k``/``v`` gathered next to it, one masked softmax per (token,
    head) over all ``S`` slots, in chunks of tokens under :data:`GATHER_BUDGET`.

    Shapes: q ``[1, Hq, N, D]``; k, v ``[B, Hkv, S, D]``; starts, q_lens, kv_lens int32
    ``[B]``; returns ``[1, Hq, N, D]`` token-major, q's dtype (v's last dim where it differs:
    multi-head latent attention, also outside the contract). ``softcap``: scores become
    ``softcap * tanh(scores / softcap)`` before the mask (Gemma 2); ``sinks`` ``[Hq]``: one
    logit per query head that joins every softmax and takes its share of the weight
    without a value (gpt-oss); ``window``: a sliding window, the token at position ``p``
    sees keys ``p - window + 1 .. p`` only (transformers' sliding-window layers: Mistral,
    Gemma 2/3, gpt-oss). None of them is part of the ops' contract: bass's attention
    function calls this directly for models that need them.
    """
    _, Hq, N, D = q.shape
    B, Hkv, S, _ = k.shape
    Dv = v.shape[-1]  # D, but for models whose values are narrower (MLA: DeepSeek V2/V3)
    G = Hq // Hkv  # HF's repeat_kv order: query head h uses KV head h // G
    out = token_major(q, zero=True) if Dv == D else q.new_zeros(1, N, Hq, Dv).transpose(1, 2)
    if N == 0 or B == 0 or S == 0:
        return out
    cdt = torch.float64 if q.dtype == torch.float64 else torch.float32
    row, i, live = token_rows(starts, q_lens, N)
    pos = (kv_lens - q_lens).to(torch.long).index_select(0, row) + i  # absolute position
    # token j sees keys 0..pos[j] of its row; value slots past kv_len are zeroed (0 * NaN)
    slot = torch.arange(S, device=q.device)
    allowed = (slot <= pos[:, None]) & live[:, None]  # [N, S]
    if window is not None:  # transformers' sliding_window_overlay: kv > q - window
        allowed &= slot > pos[:, None] - window
    zero = torch.zeros((), dtype=cdt, device=q.device)
    in_row = (slot < kv_lens.to(torch.long)[:, None])[:, None, :, None]  # [B, 1, S, 1]
    v = torch.where(in_row, v.to(cdt), zero)
    qt = q[0].transpose(0, 1).reshape(N, Hkv, G, D)  # [N, Hkv, G, D]
    flat = out.transpose(1, 2)[0]  # [N, Hq, D], the output's storage
    # shapes only: the same chunks on every call; traced, one chunk
    chunk = max(1, GATHER_BUDGET // (Hkv * S * D))
    spans = (
        [(0, N)]
        if torch.compiler.is_compiling()
        else [(start, min(start + chunk, N)) for start in range(0, N, chunk)]
    )
    for start, stop in spans:
        rows, seen = row[start:stop], allowed[start:stop, None, None, :]  # [n, 1, 1, S]
        kt = k.index_select(0, rows).to(cdt)  # [n, Hkv, S, D]
        scores = torch.matmul(qt[start:stop].to(cdt), kt.transpose(-1, -2)) * scale
        if softcap is not None:
            scores = torch.tanh(scores / softcap) * softcap
        scores = scores.masked_fill(~seen, float("-inf"))  # [n, Hkv, G, S]
        if sinks is None:
            probs = torch.softmax(scores, dim=-1)
        else:  # each head's sink: one more logit in the softmax, no value
            sink = sinks.to(cdt).view(1, Hkv, G, 1).expand(stop - start, Hkv, G, 1)
            probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :S]
        # a padding token sees no key: softmax gives NaN there; the contract says 0
        probs = torch.where(seen, probs, zero)
        o = torch.matmul(probs, v.index_select(0, rows))  # [n, Hkv, G, D]
        flat[start:stop] = o.reshape(stop - start, Hq, Dv).to(q.dtype)
    return out


def append(k_cache, v_cache, k_new, v_new, starts, q_lens, cache_lens) -> None:
    """Token ``j`` of row ``b`` to slot ``cache_lens[b] + j - starts[b]``: one index_put per
    cache, no host read (a padding token repeats the first real token's write; with none,
    every token writes back its slot's value).

    Shapes: k_cache, v_cache ``[B, Hkv, S, D]`` (mutated); k_new, v_new ``[1, Hkv, N,
    D]``; starts, q_lens, cache_lens int32 ``[B]``.
    """
    B, _, S, _ = k_cache.shape
    N = k_new.shape[2]
    if N == 0 or B == 0:
        return
    row, i, live = token_rows(starts, q_lens, N)
    src = torch.where(live, torch.arange(N, device=live.device), live.int().argmax())
    row, i = row.index_select(0, src), i.index_select(0, src)
    slots = (cache_lens.to(torch.long).index_select(0, row) + i).clamp(0, S - 1)
    keep_old = ~live.any().expand(N)[:, None, None]  # no real token: write back the old
    for cache, new in ((k_cache, k_new), (v_cache, v_new)):
        vals = new[0].transpose(0, 1).index_select(0, src).to(cache.dtype)  # [N, Hkv, D]
        cache[row, :, slots] = torch.where(keep_old, cache[row, :, slots], vals)


def append_index(q_lens: list[int], cache_lens: list[int], device) -> tuple[torch.Tensor, ...]:
    """The real tokens' (row, slot) pairs of a packed pass from host lengths (once per
    pass), moved to ``device`` in one copy."""
    rows = [b for b, n in enumerate(q_lens) for _ in range(n)]
    slots = [s for n, c in zip(q_lens, cache_lens) for s in range(c, c + n)]
    pairs = torch.tensor([rows, slots], dtype=torch.long).reshape(2, -1)
    pairs = pairs.to(device, non_blocking=True)
    return pairs[0], pairs[1]


def append_at(k_cache, v_cache, k_new, v_new, index: tuple[torch.Tensor, torch.Tensor]) -> None:
    """Write the first ``len(rows)`` packed tokens at ``(rows, slots)`` (from
    :func:`append_index`): one index_put per cache."""
    rows, slots = index
    real = rows.shape[0]
    if real == 0:
        return
    for cache, new in ((k_cache, k_new), (v_cache, v_new)):  # no call a layer can skip
        vals = new[0] if real == new.shape[2] else new[0].narrow(1, 0, real)  # [Hkv, real, D]
        vals = vals.transpose(0, 1)  # [real, Hkv, D]: the shape cache[rows, :, slots] has
        cache[rows, :, slots] = vals if vals.dtype == cache.dtype else vals.to(cache.dtype)
