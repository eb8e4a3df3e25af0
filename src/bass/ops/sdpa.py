"""CPU implementations on ``F.scaled_dot_product_attention``: per row, and padded.

For ``ragged_attention`` (padded queries ``[B, Hq, T, D]``) and, at the end of this
module, for ``ragged_attention_packed`` (packed queries ``[1, Hq, N, D]``,
:func:`sdpa_attention_packed`).

``impl="sdpa"``: ragged attention as one SDPA call per row, on that row's own slices.

Row ``b`` attends with its ``q_lens[b]`` real queries to its first ``kv_lens[b]`` keys, so
nothing past a row's length is ever read (NaN left in an uninitialised cache slot cannot
leak) and no padded work is done; the causal mask is bottom-right aligned (query ``i`` sees
keys ``0..kv_len - q_len + i``). The loop over rows reads the lengths on the host, which
costs nothing on CPU: this implementation is registered for CPU only.

``impl="sdpa_padded"``: one SDPA call over every row padded to the batch's longest
``kv_len``, with a mask built from the lengths: the CPU analogue of BASS-PAD, as
``sdpa`` is of BASS-SPLIT. It wins when the rows' lengths are close (one large call
instead of ``B`` small ones) and loses when they spread (it computes the padding).
Padding slots get zero weights, but a NaN or Inf there would still leak into the result,
and only as a non-finite output value (0 * NaN is NaN); to keep the contract (nothing past
``kv_len`` can change the result) a batch whose output is not finite is redone per row.

``auto`` chooses between them on CPU from measured data (bench/results/cpu_kernels.md,
the rule in ``bass/ops/auto_rules/cpu.json``). Both compute fp16/bf16 in float32 and
round once, as the reference does.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F


def ragged_attention(q, k, v, q_lens, kv_lens, scale: float) -> torch.Tensor:
    Hq, Hkv = q.shape[1], k.shape[1]  # q: [B, Hq, T, D]; k, v: [B, Hkv, S, D]
    cdt = torch.float64 if q.dtype == torch.float64 else torch.float32
    out = q.new_zeros(q.shape)  # padding slots stay 0
    for b, (ql, kl) in enumerate(zip(q_lens.tolist(), kv_lens.tolist())):
        if ql == 0:
            continue
        qb = q[b : b + 1, :, :ql].to(cdt)  # [1, Hq, ql, D]
        kb, vb = k[b : b + 1, :, :kl].to(cdt), v[b : b + 1, :, :kl].to(cdt)  # [1, Hkv, kl, D]
        mask = None
        if ql > 1:  # query i sits at position kl - ql + i
            i = torch.arange(ql, device=q.device)[:, None]
            mask = torch.arange(kl, device=q.device)[None] <= i + (kl - ql)  # [ql, kl]
        ob = F.scaled_dot_product_attention(
            qb, kb, vb, attn_mask=mask, scale=scale, enable_gqa=Hq != Hkv
        )
        out[b : b + 1, :, :ql] = ob.to(q.dtype)
    return out


def ragged_attention_padded(q, k, v, q_lens, kv_lens, scale: float) -> torch.Tensor:
    B, Hq, T, _ = q.shape
    Hkv = k.shape[1]
    S = max(kv_lens.tolist(), default=0)
    if B == 0 or T == 0 or S == 0:
        return q.new_zeros(q.shape)
    cdt = torch.float64 if q.dtype == torch.float64 else torch.float32
    t = torch.arange(T, device=q.device)
    live = t < q_lens[:, None]  # [B, T]: real (not padding) query slots
    pos = (kv_lens - q_lens)[:, None] + t  # [B, T]: each query's position
    mask = torch.arange(S, device=q.device) <= pos[:, :, None]  # [B, T, S]
    mask &= live[:, :, None]
    mask[:, :, 0] |= ~live  # padding slots attend to key 0 (zeroed below)
    out = F.scaled_dot_product_attention(
        q.to(cdt),
        k[:, :, :S].to(cdt),
        v[:, :, :S].to(cdt),
        attn_mask=mask[:, None],
        scale=scale,
        enable_gqa=Hq != Hkv,
    )
    out.masked_fill_(~live[:, None, :, None], 0.0)
    # Padding slots get zero weight, but NaN/Inf stored there would still reach the output
    # (0 * NaN = NaN), and only as a non-finite value: then redo the batch row by row,
    # which never reads past kv_len. One reduction over the small output.
    if not bool(out.isfinite().all()):
        return ragged_attention(q, k, v, q_lens, kv_lens, scale)
    return out.to(q.dtype)


# --------------------------------------------------------------------------- packed


def _empty_out(q: torch.Tensor, zero: bool) -> torch.Tensor:
    """A ``[1, Hq, N, D]`` output in q's dtype stored token-major."""
    _, Hq, N, D = q.shape
    out = q.new_zeros(1, N, Hq, D) if zero else q.new_empty(1, N, Hq, D)
    return out.transpose(1, 2)


def _remember(cache: dict, key: tuple, value):
    if len(cache) >= 256:  # bounded: a long run sees many signatures and lengths
        cache.clear()
    cache[key] = value
    return value


_PLANS: dict[tuple, SdpaPlan] = {}  # lengths -> sdpa_attention_packed's plan


# Rows share ONE SDPA call over the cache padded to the longest of them (a length mask
# over a view of the cache buffers) when their lengths fill at least BATCH_MIN_FILL of
# the longest and either every row brings the same number of tokens (a verify pass of
# equal draft lengths, or a decode pass) or at least half the rows, BATCH_MIN_ROWS or
# more, decode one token. Attention here is bound by reading the cache, so the padding
# computed must stay small to beat a call per row (measured on CPU: a batch of 4-16 rows
# of a 135M model takes 20-40% less time than its calls per row).
BATCH_MIN_ROWS = 2
BATCH_MIN_FILL = 0.8


class SdpaPlan:
    """What ``sdpa_attention_packed`` does for one set of lengths, built once and shared
    by every layer of a pass (FlashInfer's plan/run split): from the host lengths the
    engine already holds (:class:`bass.ops.plan.PackedPlan`), or from the length tensors
    read once per distinct set of lengths (the op called directly, CPU).

    ``sizes``: q.split sizes (each row's tokens, then the padding tail); ``batch``: the
    rows run in one padded call (:class:`_Batch`), ``None`` if none; ``rows``: the others,
    one call each, ``(b, kv_len, mask, is_causal)``; ``real``: ``cu_q_lens[B]``. Masks
    and indices live on ``device``. ``check_finite``: whether a batched call checks its
    result for NaN leaking from past a row's length (a host read: free on a CPU, a device
    sync elsewhere, where bass's zero-initialised caches hold nothing non-finite past a
    length unless a model produced it, which the engine reports as an error).
    """

    def __init__(
        self, cu: list[int], kv: list[int], N: int, device=None, check_finite: bool = True
    ):
        device = torch.device("cpu") if device is None else torch.device(device)
        self.check_finite = check_finite
        B = len(kv)
        q_lens = [cu[b + 1] - cu[b] for b in range(B)]
        self.sizes = [*q_lens, N - cu[B]]
        self.real = cu[B]
        self.batch = None
        if B >= BATCH_MIN_ROWS and q_lens[0] > 0 and q_lens.count(q_lens[0]) == B:
            chosen = list(range(B))  # every row, n tokens each
        else:
            chosen = [b for b in range(B) if q_lens[b] == 1]
            if len(chosen) < BATCH_MIN_ROWS or 2 * len(chosen) < B:
                chosen = []
        if chosen:
            top = max(kv[b] for b in chosen)
            if sum(kv[b] for b in chosen) >= BATCH_MIN_FILL * top * len(chosen):
                self.batch = _Batch(chosen, cu, kv, top, device)
        self.rows = []
        for b in range(B):
            n, L = q_lens[b], kv[b]
            if n == 0 or (self.batch is not None and b in self.batch.chosen):
                continue
            self.rows.append((b, L, _causal_mask(n, L, device), n > 1 and n == L))

    def run(self, q, k, v, scale: float) -> torch.Tensor:
        """The attention of one layer: q ``[1, Hq, N, D]``, k, v ``[B, Hkv, S, D]``;
        returns ``[1, Hq, N, D]`` token-major."""
        N = q.shape[2]
        gqa = q.shape[1] != k.shape[1]
        out = _empty_out(q, zero=False)
        if self.real < N:
            out.narrow(2, self.real, N - self.real).zero_()  # padding tokens: 0
        rows = self.rows
        if self.batch is not None and not _run_batch(
            self.batch, q, k, v, out, scale, gqa, self.check_finite
        ):
            rows = rows + self.batch.fallback
        if rows:
            qs, outs = q.split(self.sizes, 2), out.split(self.sizes, 2)
            for b, L, mask, causal in rows:
                kb, vb = k.narrow(0, b, 1).narrow(2, 0, L), v.narrow(0, b, 1).narrow(2, 0, L)
                outs[b].copy_(_sdpa(qs[b], kb, vb, mask, causal, scale, gqa))
        return out


def _causal_mask(n: int, L: int, device=None) -> torch.Tensor | None:
    """``[n, L]``: query ``i`` sits at position ``L - n + i`` (bottom-right causal); None
    where no mask is needed (one query) or ``is_causal`` does it (``n == L``)."""
    if n == 1 or n == L:
        return None
    keys, queries = torch.arange(L, device=device), torch.arange(n, device=device)
    return keys[None] <= queries[:, None] + (L - n)


class _Batch:
    """Rows in one SDPA call. Every cache row joins (a view: nothing is copied), padded to
    the longest chosen row ``top`` with a mask of each row's own causal window.

    ``uniform``: every row brings ``n`` tokens, so the queries ``[B, Hq, n, D]`` and the
    output are views of the packed ones. Otherwise the chosen rows decode (``n == 1``):
    their tokens are gathered, the other rows attend to key 0 and are dropped.
    """

    def __init__(self, chosen: list[int], cu: list[int], kv: list[int], top: int, device):
        B = len(kv)
        self.chosen, self.top = set(chosen), top
        self.uniform = len(chosen) == B
        self.n = n = cu[1] - cu[0] if self.uniform else 1
        self._fallback = (chosen, kv, n, device)
        lens = [kv[b] if b in self.chosen else 1 for b in range(B)]
        i = torch.arange(n)[:, None]  # query i of a row of length L sits at L - n + i
        pos = torch.tensor(lens)[:, None, None] - n + i  # [B, n, 1]
        query = [cu[b] if b in self.chosen else 0 for b in range(B)]
        # the small index tensors, built on the host, reach the device in one copy
        flat = torch.cat(
            [(torch.arange(top) <= pos).flatten().long(), torch.tensor([*query, *chosen])]
        ).to(device, non_blocking=True)
        m = B * n * top
        self.mask = flat[:m].view(B, 1, n, top).bool()  # [B, 1, n, top]
        self.query = flat[m : m + B]
        self.picked = flat[m + B :]
        self.tokens = self.query.index_select(0, self.picked)

    @functools.cached_property
    def fallback(self) -> list:
        """The chosen rows as one call each (``(row, kv_len, mask, causal)``), for when
        the batched call's output was not finite: built only then."""
        chosen, kv, n, device = self._fallback
        return [(b, kv[b], _causal_mask(n, kv[b], device), 1 < n == kv[b]) for b in chosen]


def _sdpa(q, k, v, mask, causal: bool, scale: float, gqa: bool) -> torch.Tensor:
    if q.dtype in (torch.float16, torch.bfloat16):  # float32 math, rounded once
        q, k, v = q.float(), k.float(), v.float()
    if causal and scale <= 0.0:  # torch 2.13's CPU kernel: is_causal, scale <= 0 gives NaN
        n = q.shape[2]
        mask, causal = torch.ones(n, n, dtype=torch.bool).tril(), False
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=gqa
    )


def _run_batch(plan: _Batch, q, k, v, out, scale, gqa, check_finite: bool = True) -> bool:
    """Run the batched rows into ``out``; False (nothing written) when the result is not
    finite: NaN/Inf stored past a row's length reached it through a zero weight
    (0 * NaN is NaN), and the caller redoes those rows one call each (``check_finite``
    off: not checked, see :class:`SdpaPlan`)."""
    ks, vs = k.narrow(2, 0, plan.top), v.narrow(2, 0, plan.top)
    if plan.uniform:
        B, n = k.shape[0], plan.n
        qs = q[0].narrow(1, 0, B * n).unflatten(1, (B, n)).transpose(0, 1)  # [B, Hq, n, D]
        ob = _sdpa(qs, ks, vs, plan.mask, False, scale, gqa)  # [B, Hq, n, D]
        if check_finite and not bool(ob.sum().isfinite()):  # NaN/Inf survive a sum
            return False
        out[0].narrow(1, 0, B * n).unflatten(1, (B, n)).transpose(0, 1).copy_(ob)
        return True
    qs = q[0].index_select(1, plan.query).transpose(0, 1)[:, :, None]  # [B, Hq, 1, D]
    ob = _sdpa(qs, ks, vs, plan.mask, False, scale, gqa)[:, :, 0]  # [B, Hq, D]
    picked = ob.index_select(0, plan.picked)  # [n, Hq, D]: the decode rows only
    if check_finite and not bool(picked.sum().isfinite()):
        return False
    out[0].transpose(0, 1).index_copy_(0, plan.tokens, picked.to(out.dtype))
    return True


def sdpa_attention_packed(q, k, v, cu_q_lens, kv_lens, scale: float) -> torch.Tensor:
    """``scaled_dot_product_attention`` on each row's own slices, so nothing past a
    row's ``kv_len`` is read. Rows of several queries use ``is_causal`` when they attend
    only to their own new tokens, else a bottom-right causal mask; decode rows (one
    query) need no mask. Rows of similar lengths that all bring the same number of
    tokens, or decode rows that are most of the batch, share one call over the cache
    padded to the longest of them (see :data:`BATCH_MIN_FILL`; NaN stored past a length
    sends them back to one call each). fp16/bf16 compute in float32 and round once, as
    the reference.

    Called as the op, it reads the lengths on the host (free on a CPU; a device sync on a
    GPU) and plans once per distinct set of lengths; the engine's passes plan once per
    pass from the lengths they hold on the host instead (:class:`SdpaPlan`), on any device.

    Shapes: q ``[1, Hq, N, D]``; k, v ``[B, Hkv, S, D]``; cu_q_lens int32 ``[B+1]``;
    kv_lens int32 ``[B]``; returns ``[1, Hq, N, D]`` token-major.
    """
    cu, kv = cu_q_lens.tolist(), kv_lens.tolist()
    N = q.shape[2]
    key = (N, q.device, *cu, -1, *kv)
    plan = _PLANS.get(key)
    if plan is None:
        plan = _remember(_PLANS, key, SdpaPlan(cu, kv, N, q.device))
    return plan.run(q, k, v, scale)
