"""Property tests of the packed ops, ``ragged_attention_packed`` and ``kv_append_packed``.

The oracle is ``bass.testing``'s naive loop over rows, heads and tokens in float64 (one
``torch.softmax`` per query over the explicit slice of keys it may see), sharing no code
or masking trick with any implementation. Tolerances are the padded op's
(``tests/test_ops_reference``: the output is float32 math rounded once to the input
dtype). Bad input and the registry: ``tests/ops/test_ops_packed_errors.py``.

The contract's worked example, used below: rows feeding 3, 0 and 2 tokens give ``N = 5``
and ``cu_q_lens = [0, 3, 3, 5]``; tokens 0-2 are row 0's, 3-4 row 2's; a CUDA-graph
bucket of ``N = 8`` adds tokens 5-7, which belong to no row (their output is 0).

The Triton implementation ``fused`` is checked in Triton's interpreter, in
``tests/ops/test_triton_fused.py`` (a subprocess); ``flex`` on the shapes it runs (head dim
>= 32, not float64) in ``tests/ops/test_ops_flex.py``.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from profiles import examples
from test_ops_reference import TOLERANCES

import bass
from bass.ops import reference, sdpa
from bass.testing import naive_kv_append_packed, naive_ragged_attention_packed

CUDA = pytest.param(
    "cuda",
    marks=[
        pytest.mark.gpu,
        pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    ],
)
CPU_IMPLS = ["reference", "sdpa", "flex", "auto"]  # flex: float64 and D < 32 run the reference


# --------------------------------------------------------------------------- cases


def offsets(q_lens) -> list[int]:
    return [0, *itertools.accumulate(q_lens)]


@dataclasses.dataclass(frozen=True)
class PackedCase:
    Hkv: int
    group: int
    S: int
    D: int
    q_lens: tuple[int, ...]  # tokens each row brings (cu_q_lens is their offsets)
    kv_lens: tuple[int, ...]
    pad: int = 0  # tokens past cu_q_lens[B] (a CUDA-graph bucket)
    seed: int = 0
    magnitude: float = 1.0
    scale: float | None = None  # None: D ** -0.5
    transposed: bool = True  # q [1, N, Hq, D] / k, v [B, S, Hkv, D] buffers seen as HF's

    @property
    def B(self) -> int:
        return len(self.q_lens)

    @property
    def Hq(self) -> int:
        return self.Hkv * self.group

    @property
    def N(self) -> int:
        return sum(self.q_lens) + self.pad

    def tensors(self, dtype: torch.dtype, device: str = "cpu"):
        g = torch.Generator().manual_seed(self.seed)

        def rand(B, H, L):
            shape = (B, L, H, self.D) if self.transposed else (B, H, L, self.D)
            x = torch.randn(*shape, generator=g, dtype=torch.float64) * self.magnitude
            x = x.to(dtype).to(device)
            return x.transpose(1, 2) if self.transposed else x

        q = rand(1, self.Hq, self.N)
        k, v = rand(self.B, self.Hkv, self.S), rand(self.B, self.Hkv, self.S)
        cu = torch.tensor(offsets(self.q_lens), dtype=torch.int32, device=device)
        kv = torch.tensor(self.kv_lens, dtype=torch.int32, device=device)
        scale = self.D**-0.5 if self.scale is None else self.scale
        return q, k, v, cu, kv, scale


@st.composite
def packed_cases(draw) -> PackedCase:
    """Random shapes and lengths, biased towards the contract's edges: empty rows, rows
    whose every key is new (q_len == kv_len), full caches, all rows empty, padding
    tokens, and passes where every row decodes one token or brings as many tokens as
    the others (the CPU's batched paths)."""
    B = draw(st.integers(1, 4))
    S = draw(st.integers(1, 12))
    mode = draw(st.sampled_from(["any", "any", "decode", "uniform", "empty"]))
    n = min(S, draw(st.integers(1, 3)))  # every row's q_len in a "uniform" pass
    q_lens, kv_lens = [], []
    for _ in range(B):
        low = n if mode == "uniform" else 0
        kv_len = draw(st.sampled_from([low, S]) | st.integers(low, S))
        top = min(kv_len, 6)
        if mode == "empty":
            q_len = 0
        elif mode == "decode":
            q_len = min(1, kv_len)
        elif mode == "uniform":
            q_len = n
        else:
            q_len = draw(st.sampled_from([0, top]) | st.integers(0, top))
        q_lens.append(q_len)
        kv_lens.append(kv_len)
    return PackedCase(
        Hkv=draw(st.integers(1, 3)),
        group=draw(st.integers(1, 4)),
        S=S,
        D=draw(st.integers(1, 16)),
        q_lens=tuple(q_lens),
        kv_lens=tuple(kv_lens),
        pad=draw(st.sampled_from([0, 0, 1, 3])),
        seed=draw(st.integers(0, 2**32 - 1)),
        magnitude=draw(st.sampled_from([1.0, 0.1, 4.0])),
        scale=draw(st.sampled_from([None, 1.0, 0.0, -0.5])),
        transposed=draw(st.booleans()),
    )


EDGE = {
    # the worked example, padded to a bucket of N = 8
    "worked_example": PackedCase(
        Hkv=2, group=2, S=8, D=4, q_lens=(3, 0, 2), kv_lens=(7, 4, 2), pad=3
    ),
    # q_len == kv_len == S (prefill: every key is new), GQA group 3
    "prefill": PackedCase(Hkv=1, group=3, S=4, D=8, q_lens=(4, 4), kv_lens=(4, 4)),
    # every row empty, a padded pass: all output 0
    "all_empty": PackedCase(Hkv=2, group=2, S=4, D=2, q_lens=(0, 0), kv_lens=(0, 4), pad=2),
    # B = 1, MQA, contiguous (not transposed) tensors
    "one_row_mqa": PackedCase(
        Hkv=1, group=4, S=6, D=3, q_lens=(2,), kv_lens=(6,), transposed=False
    ),
    # every row decodes one token with close lengths: one batched SDPA call on CPU
    "decode_all": PackedCase(Hkv=2, group=2, S=9, D=8, q_lens=(1, 1, 1), kv_lens=(9, 8, 9)),
    # every row brings 3 tokens (a verify pass), scale 0: one batched call
    "verify_uniform": PackedCase(
        Hkv=1, group=3, S=10, D=4, q_lens=(3, 3, 3), kv_lens=(10, 9, 10), pad=2, scale=0.0
    ),
    # decode rows among a verify row and an empty row: the batched call gathers them
    "decode_mixed": PackedCase(
        Hkv=1, group=2, S=9, D=4, q_lens=(1, 3, 1, 0, 1), kv_lens=(8, 9, 9, 0, 8), pad=1
    ),
    # no rows, only padding tokens (a bucketed pass after every row finished; D >= 32 so
    # that flex runs its own path, which indexed the rows' starts)
    "padding_only": PackedCase(Hkv=2, group=2, S=6, D=32, q_lens=(), kv_lens=(), pad=3),
    # large scores (softmax stability), kv_len 0 rows
    "large_scores": PackedCase(
        Hkv=2, group=4, S=7, D=16, q_lens=(3, 0, 1), kv_lens=(7, 0, 3), magnitude=6.0
    ),
}


def with_edge_cases(**other):
    def decorate(test):
        for case in reversed(EDGE.values()):
            test = example(case=case, **other)(test)
        return test

    return decorate


def attend(case_args, impl):
    return torch.ops.bass.ragged_attention_packed(*case_args, impl)


def check_against_naive(out, case: PackedCase, args, dtype, tolerances=TOLERANCES) -> None:
    q, k, v, cu, kv, scale = args
    assert out.shape == (1, case.Hq, case.N, case.D)
    assert out.dtype == dtype and out.device == q.device
    assert out.transpose(1, 2).is_contiguous(), "the output is not stored token-major"
    out = out.cpu()
    assert (out[:, :, sum(case.q_lens) :] == 0).all(), "padding tokens are not 0"
    expected = naive_ragged_attention_packed(q, k, v, cu, kv, scale)
    rtol, atol = tolerances[dtype]
    vmax = float(v.abs().max()) if v.numel() else 1.0
    torch.testing.assert_close(out.to(torch.float64), expected, rtol=rtol, atol=atol * vmax)


# --------------------------------------------------------------------------- attention


@pytest.mark.parametrize("impl", CPU_IMPLS)
@settings(max_examples=examples(300))
@with_edge_cases()
@given(case=packed_cases())
def test_packed_attention_float64_matches_naive_loop(case, impl):
    args = case.tensors(torch.float64)
    check_against_naive(attend(args, impl), case, args, torch.float64)


@pytest.mark.parametrize("impl", ["reference", "sdpa"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@settings(max_examples=examples(150))
@example(case=EDGE["worked_example"])
@example(case=EDGE["decode_all"])
@example(case=EDGE["decode_mixed"])
@example(case=EDGE["verify_uniform"])
@example(case=EDGE["large_scores"])
@given(case=packed_cases())
def test_packed_attention_low_precision_matches_naive_loop(case, dtype, impl):
    args = case.tensors(dtype)
    check_against_naive(attend(args, impl), case, args, dtype)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("impl", ["reference", "auto", "flex", "fused"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@settings(max_examples=examples(150))
@with_edge_cases()
@given(case=packed_cases())
def test_packed_attention_on_cuda_matches_naive_loop(case, dtype, impl):
    from test_ops_reference import KERNEL_TOLERANCES

    if impl not in ("auto", *bass.ops.implementations("cuda")):
        pytest.skip(f"impl {impl} is not available in this process")
    args = case.tensors(dtype, "cuda")
    tolerances = TOLERANCES if impl == "reference" else KERNEL_TOLERANCES
    check_against_naive(attend(args, impl), case, args, dtype, tolerances)


@settings(max_examples=examples(150))
@with_edge_cases(garbage_seed=0)
@given(case=packed_cases(), garbage_seed=st.integers(0, 2**32 - 1))
def test_packed_attention_never_reads_past_kv_len_or_padding_tokens(case, garbage_seed):
    """NaN/Inf in cache slots past kv_len and garbage in padding tokens' queries change
    nothing (a cache from torch.empty is fine): bit for bit in the reference; in ``sdpa``
    up to rounding, as NaN sends batched rows back to one call each. (``flex`` needs a
    finite cache past ``kv_len``: its module docstring says why.)"""
    args = case.tensors(torch.float32)
    q, k, v, cu, kv, scale = args
    g = torch.Generator().manual_seed(garbage_seed)
    q2, k2, v2 = q.clone(), k.clone(), v.clone()
    q2[:, :, sum(case.q_lens) :] = torch.randn(q2[:, :, sum(case.q_lens) :].shape, generator=g)
    for b, kv_len in enumerate(case.kv_lens):
        k2[b, :, kv_len:] = math.nan
        v2[b, :, kv_len:] = math.inf if garbage_seed % 2 else math.nan
    for impl in ("reference", "sdpa", "auto"):
        out = attend(args, impl)
        out2 = attend((q2, k2, v2, cu, kv, scale), impl)
        assert not out2.isnan().any(), impl
        if impl == "reference":
            assert torch.equal(out2, out)
        else:
            torch.testing.assert_close(out2, out, rtol=1e-6, atol=1e-6, msg=impl)


@settings(max_examples=examples(150))
@with_edge_cases()
@given(case=packed_cases())
def test_packed_equals_padded_ragged_attention(case):
    """The packed op on a packed batch equals the padded ``ragged_attention`` on the same
    rows padded to the longest ``q_len`` (and padding tokens give 0)."""
    q, k, v, cu, kv, scale = case.tensors(torch.float32)
    T = max((1, *case.q_lens))
    q_pad = torch.zeros(case.B, case.Hq, T, case.D)
    for b, (start, n) in enumerate(zip(offsets(case.q_lens), case.q_lens)):
        q_pad[b, :, :n] = q[0, :, start : start + n]
    q_lens = torch.tensor(case.q_lens, dtype=torch.int32)
    rtol, atol = TOLERANCES[torch.float32]  # float32 sums in another order
    atol *= float(v.abs().max()) if v.numel() else 1.0
    for impl in ("reference", "sdpa", "flex"):
        padded = torch.ops.bass.ragged_attention(q_pad, k, v, q_lens, kv, scale, impl)
        out = attend((q, k, v, cu, kv, scale), impl)
        for b, (start, n) in enumerate(zip(offsets(case.q_lens), case.q_lens)):
            torch.testing.assert_close(
                out[0, :, start : start + n], padded[b, :, :n], rtol=rtol, atol=atol
            )
        assert (out[:, :, sum(case.q_lens) :] == 0).all()


def test_worked_example_from_the_docs():
    """cu_q_lens = [0, 3, 3, 5], kv_lens = [7, 4, 2], N = 8: row 0's tokens sit at
    positions 4, 5, 6, row 2's at 0, 1; tokens 5-7 are padding."""
    case = EDGE["worked_example"]
    q, k, v, cu, kv, scale = case.tensors(torch.float64)
    out = torch.ops.bass.ragged_attention_packed(q, k, v, cu, kv, scale)
    # token 3 is row 2's first query (position 0): it sees key 0 only, for every head
    torch.testing.assert_close(out[0, :, 3], v[2].repeat_interleave(2, 0)[:, 0])
    assert (out[0, :, 5:] == 0).all()
    # key 5 of row 0 is seen by tokens 1 and 2 (positions 5, 6), not by token 0
    k2 = k.clone()
    k2[0, :, 5] += 1.0
    out2 = torch.ops.bass.ragged_attention_packed(q, k2, v, cu, kv, scale)
    assert torch.equal(out2[0, :, 0], out[0, :, 0]) and torch.equal(out2[0, :, 3:], out[0, :, 3:])
    assert not torch.equal(out2[0, :, 1], out[0, :, 1])


def test_reference_chunks_of_tokens_agree(monkeypatch):
    """The reference gathers keys in chunks of tokens; any chunking gives the same."""
    case = EDGE["decode_mixed"]
    q, k, v, cu, kv, scale = args = case.tensors(torch.float64)
    rows = (cu[:-1], cu.diff(), kv)
    whole = reference.attention(q, k, v, *rows, scale)
    monkeypatch.setattr(reference, "GATHER_BUDGET", case.Hkv * case.S * case.D * 2)  # 2 tokens
    torch.testing.assert_close(reference.attention(q, k, v, *rows, scale), whole)
    check_against_naive(whole, case, args, torch.float64)


def test_sdpa_batches_the_rows_it_should():
    """Which rows share a call (the plan), for the edge cases that name it."""

    def plan(name):
        case = EDGE[name]
        starts = offsets(case.q_lens)[:-1]
        return sdpa.SdpaPlan(starts, list(case.q_lens), list(case.kv_lens), case.N)

    assert plan("decode_all").batch.uniform and not plan("decode_all").rows
    assert plan("verify_uniform").batch.uniform and plan("verify_uniform").batch.n == 3
    assert plan("prefill").batch.uniform  # q_len == kv_len rows batch too
    mixed = plan("decode_mixed")  # rows 0, 2, 4 decode; row 1 alone; row 3 is empty
    assert not mixed.batch.uniform and mixed.batch.chosen == {0, 2, 4}
    assert [row[0] for row in mixed.rows] == [1]
    assert plan("worked_example").batch is None
    long = 2 * sdpa.ROW_CALL_POSITIONS + 10  # padding the short row costs more than a call
    spread = sdpa.SdpaPlan([0, 1], [1, 1], [long, 9], 2)
    assert spread.batch is None and len(spread.rows) == 2
    near = sdpa.SdpaPlan([0, 1], [1, 1], [long - 20, 9], 2)  # within a call's cost: shared
    assert near.batch is not None and near.batch.chosen == {0, 1} and not near.rows


def test_sdpa_plans_follow_lengths_changed_in_place():
    """The CPU kernel plans per set of length values: lengths edited in place (as an
    engine reuses its buffers) are never mistaken for the old ones."""
    case = EDGE["decode_all"]
    q, k, v, cu, kv, scale = case.tensors(torch.float64)
    first = attend((q, k, v, cu, kv, scale), "sdpa")
    cu.copy_(torch.tensor([0, 2, 2, 3], dtype=torch.int32))
    kv.copy_(torch.tensor([9, 3, 4], dtype=torch.int32))
    second = attend((q, k, v, cu, kv, scale), "sdpa")
    assert not torch.equal(first, second)
    torch.testing.assert_close(second, naive_ragged_attention_packed(q, k, v, cu, kv, scale))


def test_batched_rows_fall_back_to_one_call_each_on_nonfinite_cache_tails():
    """The batched call pads rows to the longest; NaN stored past a shorter row's length
    would leak through its zero weight, so those rows are redone one call each."""
    for name in ("decode_all", "decode_mixed", "verify_uniform"):
        q, k, v, cu, kv, scale = EDGE[name].tensors(torch.float64)
        clean = attend((q, k, v, cu, kv, scale), "sdpa")
        for b, kv_len in enumerate(EDGE[name].kv_lens):
            k[b, :, kv_len:], v[b, :, kv_len:] = math.nan, math.nan
        out = attend((q, k, v, cu, kv, scale), "sdpa")
        assert out.isfinite().all(), name
        torch.testing.assert_close(out, clean, rtol=1e-12, atol=1e-14, msg=name)


# --------------------------------------------------------------------------- kv append


@dataclasses.dataclass(frozen=True)
class AppendCase:
    H: int
    S: int
    D: int
    cache_lens: tuple[int, ...]
    q_lens: tuple[int, ...]
    pad: int = 0
    seed: int = 0
    transposed: bool = True  # new keys [1, N, H, D] buffers seen as [1, H, N, D]

    @property
    def N(self) -> int:
        return sum(self.q_lens) + self.pad

    def tensors(self, dtype: torch.dtype, device: str = "cpu"):
        g = torch.Generator().manual_seed(self.seed)
        B, H, S, D, N = len(self.q_lens), self.H, self.S, self.D, self.N

        def rand(*shape):
            return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype).to(device)

        k_cache, v_cache = rand(B, H, S, D), rand(B, H, S, D)
        if self.transposed:
            k_new, v_new = rand(1, N, H, D).transpose(1, 2), rand(1, N, H, D).transpose(1, 2)
        else:
            k_new, v_new = rand(1, H, N, D), rand(1, H, N, D)
        real = sum(self.q_lens)
        k_new[:, :, real:], v_new[:, :, real:] = math.nan, math.nan  # must never be written
        cu = torch.tensor(offsets(self.q_lens), dtype=torch.int32, device=device)
        cache_lens = torch.tensor(self.cache_lens, dtype=torch.int32, device=device)
        return k_cache, v_cache, k_new, v_new, cu, cache_lens


@st.composite
def append_cases(draw) -> AppendCase:
    B = draw(st.integers(1, 4))
    S = draw(st.integers(1, 10))
    empty = draw(st.integers(0, 7)) == 7
    cache_lens, q_lens = [], []
    for _ in range(B):
        cache_len = draw(st.sampled_from([0, S]) | st.integers(0, S))
        room = S - cache_len
        q_lens.append(0 if empty else draw(st.sampled_from([0, room]) | st.integers(0, room)))
        cache_lens.append(cache_len)
    return AppendCase(
        H=draw(st.integers(1, 3)),
        S=S,
        D=draw(st.integers(1, 8)),
        cache_lens=tuple(cache_lens),
        q_lens=tuple(q_lens),
        pad=draw(st.sampled_from([0, 0, 1, 3])),
        seed=draw(st.integers(0, 2**32 - 1)),
        transposed=draw(st.booleans()),
    )


APPEND_EDGE = [
    AppendCase(H=2, S=8, D=4, cache_lens=(4, 4, 0), q_lens=(3, 0, 2), pad=3),  # the example
    AppendCase(H=1, S=5, D=2, cache_lens=(2, 4, 0), q_lens=(3, 1, 5)),  # ends at S
    AppendCase(H=2, S=4, D=3, cache_lens=(0, 4), q_lens=(0, 0), pad=2),  # nothing real
    AppendCase(H=3, S=6, D=1, cache_lens=(5,), q_lens=(1,), transposed=False),  # B = 1
]

APPEND_CALLS = {
    "op": torch.ops.bass.kv_append_packed,
    "wrapper": bass.ops.kv_append_packed,
    "reference": lambda kc, vc, kn, vn, cu, lens: reference.append(
        kc, vc, kn, vn, cu[:-1], cu.diff(), lens
    ),
    "planned": lambda kc, vc, kn, vn, cu, lens: reference.append_at(
        kc, vc, kn, vn, reference.append_index(cu.diff().tolist(), lens.tolist(), "cpu")
    ),
}


@pytest.mark.parametrize("call", list(APPEND_CALLS))
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16], ids=str)
@settings(max_examples=examples(150))
@example(case=APPEND_EDGE[0])
@example(case=APPEND_EDGE[1])
@example(case=APPEND_EDGE[2])
@example(case=APPEND_EDGE[3])
@given(case=append_cases())
def test_kv_append_packed_writes_only_its_slots(case, dtype, call):
    """In place, bit-exact: the rows' tokens land in their slots, nothing else changes
    (NaN in the padding tokens would show anywhere they were written)."""
    k_cache, v_cache, k_new, v_new, cu, cache_lens = case.tensors(dtype)
    k_expected, v_expected = naive_kv_append_packed(k_cache, v_cache, k_new, v_new, cu, cache_lens)
    pointers = k_cache.data_ptr(), v_cache.data_ptr()
    assert APPEND_CALLS[call](k_cache, v_cache, k_new, v_new, cu, cache_lens) is None
    assert (k_cache.data_ptr(), v_cache.data_ptr()) == pointers
    assert torch.equal(k_cache, k_expected)
    assert torch.equal(v_cache, v_expected)


@settings(max_examples=examples(100))
@example(case=APPEND_EDGE[0])
@given(case=append_cases())
def test_append_then_attend_sees_the_new_keys(case):
    k_cache, v_cache, k_new, v_new, cu, cache_lens = case.tensors(torch.float64)
    k_expected, v_expected = naive_kv_append_packed(k_cache, v_cache, k_new, v_new, cu, cache_lens)
    torch.ops.bass.kv_append_packed(k_cache, v_cache, k_new, v_new, cu, cache_lens)
    kv_lens = cache_lens + (cu[1:] - cu[:-1])
    q = torch.randn(1, case.N, 2 * case.H, case.D, dtype=torch.float64).transpose(1, 2)
    for impl in CPU_IMPLS:
        out = torch.ops.bass.ragged_attention_packed(q, k_cache, v_cache, cu, kv_lens, 0.5, impl)
        expected = naive_ragged_attention_packed(q, k_expected, v_expected, cu, kv_lens, 0.5)
        torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-12)
