"""Hypothesis strategies for bass's inputs: ragged prompt batches and op arguments.

Length patterns are drawn by name (:data:`LENGTH_PATTERNS`; why: docs/reference/testing.md);
:data:`EXAMPLE_LENGTHS` holds one concrete batch shape per pattern for ``@example``-pinned
tests. Needs ``hypothesis`` (the ``testing`` extra).

>>> from hypothesis import given
>>> from bass.testing.strategies import ragged_prompts
>>> @given(ragged_prompts(vocab_size=64))
... def test_mine(prompts): ...
"""

from __future__ import annotations

import itertools

import torch
from hypothesis import strategies as st

__all__ = [
    "EXAMPLE_LENGTHS",
    "LENGTH_PATTERNS",
    "attention_inputs",
    "example_batches",
    "kv_append_inputs",
    "lengths",
    "packed_attention_inputs",
    "packed_kv_append_inputs",
    "ragged_prompts",
]

EXAMPLE_LENGTHS: dict[str, list[int]] = {
    "near_equal_unsorted": [17, 17, 18, 13, 16],
    "sorted": [2, 5, 9, 14],
    "descending": [14, 9, 5, 2],
    "long_outlier": [3, 4, 40, 2, 5],
    "bimodal": [3, 30, 4, 28, 2, 31],
    "duplicates": [7, 7, 7, 7],
    "single_row": [11],
}

LENGTH_PATTERNS = tuple(EXAMPLE_LENGTHS)


#: what a pattern needs: (rows, longest length); the others need (2, 1)
_PATTERN_NEEDS = {"near_equal_unsorted": (2, 2), "bimodal": (2, 2), "single_row": (1, 1)}


def _check_sizes(where: str, **sizes) -> None:
    """Each of ``sizes`` an int >= 1, else a ``ValueError`` naming it."""
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{where}: {name} must be an int >= 1, got {value!r}")


def _fitting(patterns, max_rows: int, max_len: int, where: str) -> tuple[str, ...]:
    """The ``patterns`` that ``max_rows`` rows of at most ``max_len`` tokens can follow
    (all but ``single_row`` need two rows; unsorted and bimodal need two lengths)."""
    for pattern in patterns:
        if pattern not in LENGTH_PATTERNS:
            raise ValueError(
                f"{where}: unknown length pattern {pattern!r}; known: {LENGTH_PATTERNS}"
            )
    needs = {p: _PATTERN_NEEDS.get(p, (2, 1)) for p in patterns}
    fit = tuple(p for p, (rows, n) in needs.items() if max_rows >= rows and max_len >= n)
    if not fit:
        raise ValueError(
            f"{where}: no length pattern of {list(patterns)} fits max_rows={max_rows}, "
            f"max_len={max_len} (all but 'single_row' need max_rows >= 2; "
            "'near_equal_unsorted' and 'bimodal' need max_len >= 2)"
        )
    return fit


def lengths(pattern: str | None = None, *, max_rows: int = 6, max_len: int = 24):
    """A strategy for a list of prompt lengths following ``pattern`` (any of
    :data:`LENGTH_PATTERNS` that fits when ``None``), at most ``max_rows`` of them, each in
    ``1..max_len``. A pattern the sizes cannot follow raises ``ValueError``."""
    _check_sizes("lengths()", max_rows=max_rows, max_len=max_len)
    patterns = LENGTH_PATTERNS if pattern is None else (pattern,)
    return _lengths(_fitting(patterns, max_rows, max_len, "lengths()"), max_rows, max_len)


@st.composite
def _lengths(draw, patterns: tuple[str, ...], max_rows: int, max_len: int):
    pattern = patterns[0] if len(patterns) == 1 else draw(st.sampled_from(patterns))
    if pattern == "single_row":
        return [draw(st.integers(1, max_len))]
    n = draw(st.integers(2, max(2, max_rows)))
    if pattern == "near_equal_unsorted":  # max_len >= 2: two lengths to descend between
        base = draw(st.integers(1, max_len))
        out = [min(max_len, max(1, base + draw(st.integers(-3, 3)))) for _ in range(n)]
        if out == sorted(out):  # make it unsorted (a descent somewhere)
            if len(set(out)) == 1:
                out[0] = out[0] + 1 if out[0] < max_len else out[0] - 1
            out = sorted(out, reverse=True)
        return out
    if pattern in ("sorted", "descending"):
        out = sorted(draw(st.lists(st.integers(1, max_len), min_size=n, max_size=n)))
        return out if pattern == "sorted" else out[::-1]
    if pattern == "long_outlier":
        short = draw(st.lists(st.integers(1, max(1, max_len // 4)), min_size=n - 1, max_size=n - 1))
        at = draw(st.integers(0, n - 1))
        return [*short[:at], max_len, *short[at:]]
    if pattern == "bimodal":  # max_len >= 2
        lo, hi = max(1, max_len // 6), max(2, max_len - max_len // 6)
        return [
            draw(st.integers(1, lo)) if draw(st.booleans()) else draw(st.integers(hi, max_len))
            for _ in range(n)
        ]
    return [draw(st.integers(1, max_len))] * n  # duplicates


@st.composite
def ragged_prompts(
    draw,
    vocab_size: int,
    *,
    max_rows: int = 6,
    max_len: int = 24,
    patterns: tuple[str, ...] = LENGTH_PATTERNS,
):
    """A batch of prompts (lists of token ids in ``0..vocab_size-1``) whose lengths follow
    one of ``patterns``; ``duplicates`` repeats one prompt."""
    _check_sizes("ragged_prompts()", vocab_size=vocab_size, max_rows=max_rows, max_len=max_len)
    pattern = draw(st.sampled_from(_fitting(patterns, max_rows, max_len, "ragged_prompts()")))
    lens = draw(lengths(pattern, max_rows=max_rows, max_len=max_len))
    token = st.integers(0, vocab_size - 1)
    if pattern == "duplicates":
        prompt = draw(st.lists(token, min_size=lens[0], max_size=lens[0]))
        return [list(prompt) for _ in lens]
    return [draw(st.lists(token, min_size=n, max_size=n)) for n in lens]


def example_batches(vocab_size: int, seed: int = 0) -> dict[str, list[list[int]]]:
    """One concrete prompt batch per pattern (:data:`EXAMPLE_LENGTHS`), random tokens from
    ``seed``: for ``@example`` or ``parametrize``."""
    _check_sizes("example_batches()", vocab_size=vocab_size)
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, lens in EXAMPLE_LENGTHS.items():
        if name == "duplicates":
            one = torch.randint(0, vocab_size, (lens[0],), generator=g).tolist()
            out[name] = [list(one) for _ in lens]
        else:
            out[name] = [torch.randint(0, vocab_size, (n,), generator=g).tolist() for n in lens]
    return out


# --------------------------------------------------------------------------- op inputs


HEAD_DIMS = (4, 8, 16)  # the op strategies' default head dims (``head_dims=`` for others)


def _tensor(draw, shape, dtype, device, nan_past=None, magnitude=1.0, layout=None):
    """Random values of ``shape`` (times ``magnitude``), NaN in slots past each row's
    length ``nan_past`` (dimension 2), stored as drawn (``layout``: ``"contiguous"``,
    ``"transposed"``: dims 1 and 2 swapped in memory, as transformers hands q over, or
    ``"strided"``: rows of a wider buffer), or as given."""
    if dtype not in (torch.float64, torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(  # (an int tensor would hold no NaN, or fail deep in torch)
            f"bass.testing.strategies: dtype={dtype!r}; the ops' inputs take a floating "
            "dtype: torch.float64 (the default), float32, bfloat16 or float16"
        )
    seed = draw(st.integers(0, 2**16))
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(*shape, generator=g, dtype=torch.float64) * magnitude
    if nan_past is not None:  # NaN in cache slots past each row's length: must never leak
        for b, n in enumerate(nan_past):
            t[b, :, n:] = float("nan")
    t = t.to(dtype).to(device)
    layout = layout or draw(st.sampled_from(["contiguous", "transposed", "strided"]))
    if layout == "transposed":
        return t.transpose(1, 2).contiguous().transpose(1, 2)
    if layout == "strided":  # each row of the last dim inside a wider one (garbage past it)
        wide = torch.full((*t.shape[:-1], t.shape[-1] + 3), float("nan"), dtype=dtype)
        wide = wide.to(device)
        wide[..., : t.shape[-1]] = t
        return wide[..., : t.shape[-1]]
    return t


@st.composite
def _op_lengths(draw, B: int, S: int, T: int):
    """Per row (q_len, kv_len) with q_len <= min(T, kv_len) <= S, covering zero-length
    rows, q_len == kv_len and full caches; most draws random lengths (a row with keys has
    a query) or long ones (within T of S: queries that see past a kernel's key tile)."""
    kinds = ["random", "random", "long", "long", "zero_rows", "q_eq_kv", "empty", "full"]
    kind = draw(st.sampled_from(kinds))
    rows = []
    for _ in range(B):
        kv = draw(st.integers(0, S))
        if kind == "long":
            kv = S - draw(st.integers(0, min(T, S)))
        q = draw(st.integers(min(1, kv), min(T, kv)))
        if kind == "zero_rows" and draw(st.booleans()):
            q = 0
        elif kind == "q_eq_kv":
            kv = q = draw(st.integers(0, min(T, S)))
        elif kind == "empty":
            q = 0
        elif kind == "full":
            kv, q = S, draw(st.integers(0, min(T, S)))
        rows.append((q, kv))
    return rows


def _cache_len(draw, least: int, most: int) -> int:
    """A cache length in ``[least, most]``: half the draws ``most`` (long rows reach past
    a kernel's key tiles only in long caches; hypothesis favours small integers)."""
    return most if draw(st.booleans()) else draw(st.integers(least, most))


def _check_op_sizes(where: str, head_dims=HEAD_DIMS, max_pad=0, **sizes) -> None:
    """``sizes`` ints >= 1 (``max_s >= max_t`` for the padded forms), ``max_pad`` >= 0,
    ``head_dims`` ints >= 1; else a ``ValueError`` naming the argument."""
    _check_sizes(where, **sizes)
    if "max_t" in sizes and sizes["max_s"] < sizes["max_t"]:
        raise ValueError(
            f"{where}: max_s={sizes['max_s']} < max_t={sizes['max_t']}: the cache holds at "
            "least the T query slots (S >= T); raise max_s or lower max_t"
        )
    if isinstance(max_pad, bool) or not isinstance(max_pad, int) or max_pad < 0:
        raise ValueError(f"{where}: max_pad must be an int >= 0, got {max_pad!r}")
    dims = list(head_dims) if not isinstance(head_dims, (str, bytes)) else []
    if not dims or any(isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in dims):
        raise ValueError(f"{where}: head_dims must be ints >= 1, got {head_dims!r}")


def _heads(draw, head_dims):
    """``(Hq, Hkv, D)``: most draws group several query heads on each of several key/value
    heads (a kernel that maps query head ``h`` to ``h % Hkv`` instead of ``h // group`` is
    right only when one of the two is 1)."""
    Hkv = draw(st.sampled_from([1, 2, 4]))
    return Hkv * draw(st.sampled_from([1, 2, 4])), Hkv, draw(st.sampled_from(list(head_dims)))


def _scale(draw, D: int) -> tuple[float, float]:
    """The softmax scale (``D**-0.5`` or another) and the queries' magnitude: with
    ``D**-0.5``, sometimes 8 (logits of a few tens, where a softmax without its max
    subtracted overflows in float16 and bfloat16; larger ones would put a correct float32
    kernel's rounding past ``assert_close``'s float32 tolerance)."""
    scale = draw(st.sampled_from([D**-0.5, D**-0.5, 1.0, 0.1]))
    return scale, draw(st.sampled_from([1.0, 1.0, 8.0])) if scale == D**-0.5 else 1.0


@st.composite
def attention_inputs(
    draw, dtype=torch.float64, device="cpu", max_batch=4, max_t=5, max_s=40, head_dims=HEAD_DIMS
):
    """``(q, k, v, q_lens, kv_lens, scale)`` for ``ragged_attention``: ``q [B, Hq, T, D]``,
    ``k, v [B, Hkv, S, D]`` with NaN past each row's ``kv_len`` (and NaN in q's padding
    slots), int32 lengths; any of them in memory transposed or as rows of a wider buffer;
    ``scale`` ``D**-0.5`` or another, queries sometimes large."""
    _check_op_sizes("attention_inputs()", head_dims, max_batch=max_batch, max_t=max_t, max_s=max_s)
    Hq, Hkv, D = _heads(draw, head_dims)
    B, T = draw(st.integers(1, max_batch)), draw(st.integers(1, max_t))
    S = _cache_len(draw, T, max_s)
    rows = draw(_op_lengths(B, S, T))
    scale, big = _scale(draw, D)
    q_lens, kv = [r[0] for r in rows], [r[1] for r in rows]
    q = _tensor(draw, (B, Hq, T, D), dtype, device, nan_past=q_lens, magnitude=big)
    k = _tensor(draw, (B, Hkv, S, D), dtype, device, nan_past=kv)
    v = _tensor(draw, (B, Hkv, S, D), dtype, device, nan_past=kv)
    lens = [torch.tensor(x, dtype=torch.int32, device=device) for x in (q_lens, kv)]
    return q, k, v, lens[0], lens[1], scale


@st.composite
def packed_attention_inputs(
    draw,
    dtype=torch.float64,
    device="cpu",
    max_batch=4,
    max_q=5,
    max_s=40,
    max_pad=3,
    head_dims=HEAD_DIMS,
):
    """``(q, k, v, cu_q_lens, kv_lens, scale)`` for ``ragged_attention_packed``: packed
    ``q [1, Hq, N, D]`` (a transposed view, as a decoder hands it over, with up to
    ``max_pad`` padding tokens past ``cu_q_lens[B]``, NaN), ``k, v [B, Hkv, S, D]`` with
    NaN past each row's ``kv_len`` (any of their layouts); ``scale`` as
    :func:`attention_inputs`'. A row brings at most ``max_q`` queries and ``max_s`` keys:
    set both past a kernel's query and key tiles."""
    where = "packed_attention_inputs()"
    _check_op_sizes(where, head_dims, max_pad, max_batch=max_batch, max_q=max_q, max_s=max_s)
    Hq, Hkv, D = _heads(draw, head_dims)
    B = draw(st.integers(1, max_batch))
    S = _cache_len(draw, 1, max_s)
    rows = draw(_op_lengths(B, S, max_q))
    scale, big = _scale(draw, D)
    cu = [0, *itertools.accumulate(q_len for q_len, _ in rows)]
    N = cu[-1] + draw(st.integers(0, max_pad))
    kv = [r[1] for r in rows]
    q = _tensor(draw, (1, N, Hq, D), dtype, device, magnitude=big, layout="contiguous")
    q[:, cu[-1] :] = float("nan")  # tokens of no row (CUDA-graph bucket padding)
    q = q.transpose(1, 2)
    k = _tensor(draw, (B, Hkv, S, D), dtype, device, nan_past=kv)
    v = _tensor(draw, (B, Hkv, S, D), dtype, device, nan_past=kv)
    cu_t = torch.tensor(cu, dtype=torch.int32, device=device)
    kv_t = torch.tensor(kv, dtype=torch.int32, device=device)
    return q, k, v, cu_t, kv_t, scale


def _value_dim(draw, D: int) -> int:
    """Values as wide as keys, or narrower (multi-head latent attention)."""
    return draw(st.sampled_from([D, D, max(1, D // 2)]))


@st.composite
def kv_append_inputs(
    draw, dtype=torch.float64, device="cpu", max_batch=4, max_t=5, max_s=24, head_dims=(4, 8)
):
    """``(k_cache, v_cache, k_new, v_new, cache_lens, new_lens)`` for ``kv_append`` (values
    sometimes narrower than keys; any layouts). Run the oracle on clones of the caches,
    or before the op: both write in place."""
    _check_op_sizes("kv_append_inputs()", head_dims, max_batch=max_batch, max_t=max_t, max_s=max_s)
    Hkv, D = draw(st.sampled_from([1, 2])), draw(st.sampled_from(list(head_dims)))
    Dv = _value_dim(draw, D)
    B, T = draw(st.integers(1, max_batch)), draw(st.integers(1, max_t))
    S = draw(st.integers(T, max_s))
    new = [draw(st.integers(0, T)) for _ in range(B)]
    start = [draw(st.integers(0, S - n)) for n in new]
    kc, vc = (_tensor(draw, (B, Hkv, S, d), dtype, device) for d in (D, Dv))
    kn, vn = (_tensor(draw, (B, Hkv, T, d), dtype, device) for d in (D, Dv))
    lens = [torch.tensor(x, dtype=torch.int32, device=device) for x in (start, new)]
    return kc, vc, kn, vn, lens[0], lens[1]


@st.composite
def packed_kv_append_inputs(
    draw,
    dtype=torch.float64,
    device="cpu",
    max_batch=4,
    max_q=5,
    max_s=24,
    max_pad=3,
    head_dims=(4, 8),
):
    """``(k_cache, v_cache, k_new, v_new, cu_q_lens, cache_lens)`` for
    ``kv_append_packed``: packed ``k_new [1, Hkv, N, D]`` (transposed views) with up to
    ``max_pad`` padding tokens (values sometimes narrower than keys). Run the oracle on
    clones of the caches, or before the op: both write in place."""
    where = "packed_kv_append_inputs()"
    _check_op_sizes(where, head_dims, max_pad, max_batch=max_batch, max_q=max_q, max_s=max_s)
    Hkv, D = draw(st.sampled_from([1, 2])), draw(st.sampled_from(list(head_dims)))
    Dv = _value_dim(draw, D)
    B, S = draw(st.integers(1, max_batch)), draw(st.integers(1, max_s))
    q_lens = [draw(st.integers(0, min(max_q, S))) for _ in range(B)]
    start = [draw(st.integers(0, S - n)) for n in q_lens]
    cu = [0, *itertools.accumulate(q_lens)]
    N = cu[-1] + draw(st.integers(0, max_pad))
    kc, vc = (_tensor(draw, (B, Hkv, S, d), dtype, device) for d in (D, Dv))
    kn, vn = (
        _tensor(draw, (1, N, Hkv, d), dtype, device, layout="contiguous").transpose(1, 2)
        for d in (D, Dv)
    )
    cu_t = torch.tensor(cu, dtype=torch.int32, device=device)
    return kc, vc, kn, vn, cu_t, torch.tensor(start, dtype=torch.int32, device=device)
