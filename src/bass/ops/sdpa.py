"""``sdpa``: ``F.scaled_dot_product_attention`` on each row's own slices, bottom-right causal
(rows alike may share one call), planned once per pass from host lengths. Design and
measurements: docs/reference/ops.md, "sdpa"."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from .contract import token_major

# when rows share one padded call (the rule and its measurements: the docs' "sdpa")
BATCH_MIN_ROWS = 2
ROW_CALL_POSITIONS = 300


class SdpaPlan:
    """One pass's attention from host lists ``starts``, ``q_lens``, ``kv_lens`` (``[B]``).
    ``batch``: the rows of one padded call (:class:`_Batch`) or ``None``; ``rows``: the
    others, one call each (:func:`_row`). ``check_finite``: check a batched result for NaN
    leaking from past a row's length (a host read: free on a CPU).
    """

    def __init__(self, starts, q_lens, kv_lens, N: int, device=None, check_finite=True):
        device = torch.device("cpu") if device is None else torch.device(device)
        B = len(kv_lens)
        self.zero = sum(q_lens) < N  # tokens of no row: their output must be 0
        self.batch = None
        n0 = q_lens[0] if B else 0
        uniform = (
            B >= BATCH_MIN_ROWS
            and n0 > 0
            and all(n == n0 and s == b * n0 for b, (n, s) in enumerate(zip(q_lens, starts)))
        )
        if uniform:
            chosen = list(range(B))  # every row, n0 tokens each, back to back
        else:
            chosen = [b for b in range(B) if q_lens[b] == 1]
            if len(chosen) < BATCH_MIN_ROWS or 2 * len(chosen) < B:
                chosen = []
        if chosen:
            top = max(kv_lens[b] for b in chosen)
            own = sum(kv_lens[b] for b in chosen)  # the call spans all B rows of the cache
            if top * B <= own + ROW_CALL_POSITIONS * len(chosen):
                n = n0 if uniform else 1
                self.batch = _Batch(chosen, starts, kv_lens, n, uniform, top, device, check_finite)
        done = self.batch.chosen if self.batch is not None else ()
        self.rows = [
            _row(b, starts[b], n, L, device)
            for b, (n, L) in enumerate(zip(q_lens, kv_lens))
            if n > 0 and b not in done
        ]

    def run(self, q, k, v, scale: float) -> torch.Tensor:
        gqa = q.shape[1] != k.shape[1]
        out = token_major(q, zero=self.zero)
        rows = self.rows
        if self.batch is not None and not self.batch.run(q, k, v, out, scale, gqa):
            rows = rows + self.batch.fallback
        for b, start, n, L, mask, causal in rows:
            kb, vb = k.narrow(0, b, 1).narrow(2, 0, L), v.narrow(0, b, 1).narrow(2, 0, L)
            o = _sdpa(q.narrow(2, start, n), kb, vb, mask, causal, scale, gqa)
            out.narrow(2, start, n).copy_(o)
        return out


def _row(b: int, start: int, n: int, L: int, device) -> tuple:
    """Row ``b`` in a call of its own: ``(b, start, n, L, mask, is_causal)``, the mask ``[n,
    L]`` putting query ``i`` at position ``L - n + i`` (bottom-right causal); None where no
    mask is needed (one query) or ``is_causal`` does it (``n == L``)."""
    if n == 1 or n == L:
        return b, start, n, L, None, n > 1
    keys, queries = torch.arange(L, device=device), torch.arange(n, device=device)
    return b, start, n, L, keys[None] <= queries[:, None] + (L - n), False


def _sdpa(q, k, v, mask, causal: bool, scale: float, gqa: bool) -> torch.Tensor:
    if q.dtype in (torch.float16, torch.bfloat16):  # float32 math, rounded once
        q, k, v = q.float(), k.float(), v.float()
    if causal and scale <= 0.0:  # torch 2.13's CPU kernel: is_causal, scale <= 0 gives NaN
        mask = torch.ones(q.shape[2], q.shape[2], dtype=torch.bool, device=q.device).tril()
        causal = False
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=gqa
    )


class _Batch:
    """Rows in one SDPA call over every cache row padded to ``top``, each masked to its
    causal window. ``uniform``: every row brings ``n`` tokens back to back (views of the
    flat queries); else the chosen rows decode one token, gathered (the others see key 0,
    dropped)."""

    def __init__(self, chosen, starts, kv, n: int, uniform: bool, top: int, device, check_finite):
        B = len(kv)
        self.chosen, self.top, self.n, self.uniform = set(chosen), top, n, uniform
        self.check_finite = check_finite
        self._fallback = (chosen, starts, kv, device)
        lens = [kv[b] if b in self.chosen else 1 for b in range(B)]
        i = torch.arange(n)[:, None]  # query i of a row of length L sits at L - n + i
        pos = torch.tensor(lens)[:, None, None] - n + i  # [B, n, 1]
        query = [starts[b] if b in self.chosen else 0 for b in range(B)]
        # the small index tensors, built on the host, reach the device in one copy
        flat = torch.cat(
            [(torch.arange(top) <= pos).flatten().long(), torch.tensor([*query, *chosen])]
        ).to(device, non_blocking=True)
        m = B * n * top
        self.mask = flat[:m].view(B, 1, n, top).bool()  # [B, 1, n, top]
        self.query, self.picked = flat[m : m + B], flat[m + B :]
        self.tokens = self.query.index_select(0, self.picked)

    @functools.cached_property
    def fallback(self) -> list:
        """The chosen rows as one call each (a batched result was not finite)."""
        chosen, starts, kv, device = self._fallback
        return [_row(b, starts[b], self.n, kv[b], device) for b in chosen]

    def run(self, q, k, v, out, scale, gqa) -> bool:
        """Run the batched rows into ``out``; False (nothing written) when the result is not
        finite: then one call per row."""
        ks, vs = k.narrow(2, 0, self.top), v.narrow(2, 0, self.top)
        if self.uniform:
            B, n = k.shape[0], self.n
            qs = q[0].narrow(1, 0, B * n).unflatten(1, (B, n)).transpose(0, 1)  # [B, Hq, n, D]
            ob = _sdpa(qs, ks, vs, self.mask, False, scale, gqa)  # [B, Hq, n, D]
            if self.check_finite and not bool(ob.sum().isfinite()):  # NaN/Inf survive a sum
                return False
            out[0].narrow(1, 0, B * n).unflatten(1, (B, n)).transpose(0, 1).copy_(ob)
            return True
        qs = q[0].index_select(1, self.query).transpose(0, 1)[:, :, None]  # [B, Hq, 1, D]
        ob = _sdpa(qs, ks, vs, self.mask, False, scale, gqa)[:, :, 0]  # [B, Hq, D]
        picked = ob.index_select(0, self.picked)  # [n, Hq, D]: the decode rows only
        if self.check_finite and not bool(picked.sum().isfinite()):
            return False
        out[0].transpose(0, 1).index_copy_(0, self.tokens, picked.to(out.dtype))
        return True


def prepare(plan) -> SdpaPlan:
    """The pass's :class:`SdpaPlan` (NaN checks on a CPU only: elsewhere they sync)."""
    cpu = plan.device.type == "cpu"
    host = plan.host
    return SdpaPlan(host.starts, host.q_lens, host.kv_lens, plan.num_tokens, plan.device, cpu)


run = SdpaPlan.run
