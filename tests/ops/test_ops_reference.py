"""Property tests of the padded ops, ``torch.ops.bass.ragged_attention`` and ``kv_append``,
through every implementation that runs on the CPU.

The oracle here is a deliberately naive loop over rows, heads and query slots in float64,
using ``torch.softmax`` on explicit key slices: it shares no code (and no masking trick)
with the vectorised implementations in :mod:`bass.ops.reference`.

Tolerances (op output vs. the float64 loop run on the *same* inputs upcast to float64,
``vmax`` = the largest ``|v|`` of the case):

* float64: ``rtol=1e-10, atol=1e-12 * vmax`` (only summation order differs).
* float32: ``rtol=1e-5, atol=1e-5 * vmax`` (float32 accumulation over <= 16 keys).
* float16: ``rtol=2**-10, atol=1e-4 * vmax`` (the output is float32 math rounded once
  to float16, relative error <= 2**-11).
* bfloat16: ``rtol=2**-7, atol=1e-4 * vmax`` (float32 math rounded once to bfloat16,
  relative error <= 2**-8).
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from profiles import examples

import bass
from bass import testing

CPU_IMPLS = ["reference", "sdpa", "flex", "auto"]  # flex: float64 and D < 32 run the reference

CUDA = pytest.param(
    "cuda",
    marks=[
        pytest.mark.gpu,
        pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    ],
)
DEVICES = ["cpu", CUDA]

# dtype -> (rtol, atol relative to max |v|); see the module docstring.
TOLERANCES = {
    torch.float64: (1e-10, 1e-12),
    torch.float32: (1e-5, 1e-5),
    torch.float16: (2**-10, 1e-4),
    torch.bfloat16: (2**-7, 1e-4),
}
# What the GPU kernels guarantee (tests/ops/test_triton_fused.py, tests/ops/test_cutlass.py): they
# round the probabilities to the input dtype before the second product, as flash attention
# does. impl="auto" on CUDA may run one of them once a CUDA rule is calibrated.
KERNEL_TOLERANCES = {
    torch.float64: TOLERANCES[torch.float64],
    torch.float32: (1e-4, 1e-4),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1e-2, 1e-2),
}


def tolerances_for(impl: str, device: str) -> dict:
    return KERNEL_TOLERANCES if impl == "auto" and device != "cpu" else TOLERANCES


# --------------------------------------------------------------------------- naive oracles

# bass.testing's: a loop over rows, heads and query slots in float64, one softmax per
# query over the explicit slice of keys it may see
naive_ragged_attention = testing.naive_ragged_attention
naive_kv_append = testing.naive_kv_append


# --------------------------------------------------------------------------- attention cases


@dataclasses.dataclass(frozen=True)
class AttentionCase:
    Hkv: int
    group: int
    T: int
    S: int
    D: int
    q_lens: tuple[int, ...]
    kv_lens: tuple[int, ...]
    seed: int = 0
    magnitude: float = 1.0
    scale: float | None = None  # None: D ** -0.5
    transposed: bool = False  # q/k/v are [B, T or S, H, D] buffers seen as [B, H, ., D]

    @property
    def B(self) -> int:
        return len(self.q_lens)

    @property
    def Hq(self) -> int:
        return self.Hkv * self.group

    def tensors(self, dtype: torch.dtype, device: str):
        g = torch.Generator().manual_seed(self.seed)

        def rand(B, H, L, D):
            shape = (B, L, H, D) if self.transposed else (B, H, L, D)
            x = torch.randn(*shape, generator=g, dtype=torch.float64) * self.magnitude
            x = x.to(dtype).to(device)
            return x.transpose(1, 2) if self.transposed else x

        q = rand(self.B, self.Hq, self.T, self.D)
        k = rand(self.B, self.Hkv, self.S, self.D)
        v = rand(self.B, self.Hkv, self.S, self.D)
        q_lens = torch.tensor(self.q_lens, dtype=torch.int32, device=device)
        kv_lens = torch.tensor(self.kv_lens, dtype=torch.int32, device=device)
        scale = self.D**-0.5 if self.scale is None else self.scale
        return q, k, v, q_lens, kv_lens, scale


@st.composite
def attention_cases(draw) -> AttentionCase:
    """Random shapes and lengths, biased towards the edges of the contract."""
    B = draw(st.integers(1, 4))
    T = draw(st.integers(1, 16))
    S = draw(st.integers(1, 16))
    all_padding = draw(st.integers(0, 7)) == 7  # 1 case in 8 (and shrinks to False)
    q_lens, kv_lens = [], []
    for _ in range(B):
        kv_len = draw(st.sampled_from([0, S]) | st.integers(0, S))  # empty / full / any
        top = min(T, kv_len)
        q_len = 0 if all_padding else draw(st.sampled_from([0, top]) | st.integers(0, top))
        q_lens.append(q_len)
        kv_lens.append(kv_len)
    return AttentionCase(
        Hkv=draw(st.integers(1, 3)),
        group=draw(st.integers(1, 4)),
        T=T,
        S=S,
        D=draw(st.integers(1, 16)),
        q_lens=tuple(q_lens),
        kv_lens=tuple(kv_lens),
        seed=draw(st.integers(0, 2**32 - 1)),
        magnitude=draw(st.sampled_from([1.0, 0.1, 4.0])),
        scale=draw(st.sampled_from([None, 1.0, 0.0, -0.5])),
        transposed=draw(st.booleans()),
    )


# Every edge the contract names, always run before the random cases.
EDGE_CASES = [
    # q_len 0 next to a full row, and T > max q_len (slot 2 is padding in every row)
    AttentionCase(Hkv=2, group=2, T=3, S=5, D=4, q_lens=(0, 2), kv_lens=(3, 5)),
    # q_len == kv_len: all of the row's keys are new (prefill), T == q_len == kv_len == S
    AttentionCase(Hkv=1, group=3, T=4, S=4, D=8, q_lens=(4, 4), kv_lens=(4, 4)),
    # kv_len == S in every row, MQA (Hkv=1)
    AttentionCase(Hkv=1, group=4, T=2, S=6, D=3, q_lens=(1, 2, 2), kv_lens=(6, 6, 6)),
    # kv_len 0 rows (hence q_len 0) among live rows; transformers' [B, T, H, D] layout
    AttentionCase(
        Hkv=3, group=1, T=2, S=4, D=5, q_lens=(0, 1, 0, 2), kv_lens=(0, 1, 0, 4), transposed=True
    ),
    # all-padding batch: nothing to attend anywhere, output all zeros
    AttentionCase(Hkv=2, group=2, T=3, S=4, D=2, q_lens=(0, 0), kv_lens=(0, 4)),
    # T much larger than every q_len, single-key rows
    AttentionCase(Hkv=1, group=1, T=16, S=16, D=1, q_lens=(1, 1), kv_lens=(1, 16)),
    # large scores (softmax stability) with GQA group 4
    AttentionCase(
        Hkv=2, group=4, T=3, S=7, D=16, q_lens=(3, 1, 2), kv_lens=(7, 3, 2), magnitude=6.0
    ),
]


def with_edge_cases(**other_arguments):
    """``@example`` every edge case (``other_arguments`` fill the test's other strategies)."""

    def decorate(test):
        for case in reversed(EDGE_CASES):
            test = example(case=case, **other_arguments)(test)
        return test

    return decorate


def check_against_naive(
    out, case: AttentionCase, q, k, v, q_lens, kv_lens, scale, dtype, tolerances=TOLERANCES
):
    assert out.shape == (case.B, case.Hq, case.T, case.D)
    assert out.dtype == dtype
    assert out.device == q.device
    out = out.cpu()
    for b, q_len in enumerate(case.q_lens):  # padding slots are exactly zero
        assert (out[b, :, q_len:] == 0).all(), f"row {b}: padding slots are not 0"
    expected = naive_ragged_attention(q, k, v, case.q_lens, case.kv_lens, scale)
    rtol, atol = tolerances[dtype]
    vmax = float(v.detach().abs().max().cpu()) if v.numel() else 1.0
    torch.testing.assert_close(out.to(torch.float64), expected, rtol=rtol, atol=atol * vmax)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("impl", CPU_IMPLS)
@settings(max_examples=examples(100), deadline=None)
@with_edge_cases()
@given(case=attention_cases())
def test_attention_float64_matches_naive_loop(case, impl, device):
    if impl in ("sdpa", "flex") and device != "cpu":
        pytest.skip(f"impl {impl} on CUDA: tests/ops/test_ops_flex.py and the packed suites")
    q, k, v, q_lens, kv_lens, scale = case.tensors(torch.float64, device)
    out = torch.ops.bass.ragged_attention(q, k, v, q_lens, kv_lens, scale, impl)
    tol = tolerances_for(impl, device)
    check_against_naive(out, case, q, k, v, q_lens, kv_lens, scale, torch.float64, tol)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("impl", CPU_IMPLS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@settings(max_examples=examples(60), deadline=None)
@with_edge_cases()
@given(case=attention_cases())
def test_attention_low_precision_matches_naive_loop(case, dtype, impl, device):
    if impl in ("sdpa", "flex") and device != "cpu":
        pytest.skip(f"impl {impl} on CUDA: tests/ops/test_ops_flex.py and the packed suites")
    q, k, v, q_lens, kv_lens, scale = case.tensors(dtype, device)
    out = torch.ops.bass.ragged_attention(q, k, v, q_lens, kv_lens, scale, impl)
    tol = tolerances_for(impl, device)
    check_against_naive(out, case, q, k, v, q_lens, kv_lens, scale, dtype, tol)


@settings(max_examples=examples(40), deadline=None)
@with_edge_cases()
@given(case=attention_cases())
def test_attention_entry_points_agree(case):
    """The public op, its Python wrapper, the reference op and the plain function agree
    (bit for bit where they run the reference; ``auto`` may pick a faster implementation)."""
    args = case.tensors(torch.float32, "cpu")
    expected = torch.ops.bass.ragged_attention(*args, "reference")
    assert torch.equal(bass.ops.ragged_attention(*args, impl="reference"), expected)
    # float32 rounding where auto runs another implementation (the values' scale: random
    # draws of magnitude 4 met 1.1e-6 against a fixed atol of 1e-6)
    rtol, atol = TOLERANCES[torch.float32]
    vmax = float(args[2].abs().max()) if args[2].numel() else 1.0
    for out in (torch.ops.bass.ragged_attention(*args), bass.ops.ragged_attention(*args)):
        torch.testing.assert_close(out, expected, rtol=rtol, atol=atol * vmax)


@settings(max_examples=examples(60), deadline=None)
@with_edge_cases(garbage_seed=0)
@given(case=attention_cases(), garbage_seed=st.integers(0, 2**32 - 1))
def test_attention_ignores_invisible_cache_slots_and_padding_queries(case, garbage_seed):
    """Cache slots at or past kv_len and padding query slots do not change the output."""
    q, k, v, q_lens, kv_lens, scale = case.tensors(torch.float32, "cpu")
    out = torch.ops.bass.ragged_attention(q, k, v, q_lens, kv_lens, scale)
    g = torch.Generator().manual_seed(garbage_seed)
    q2, k2, v2 = (t.clone() for t in (q, k, v))
    for b, (q_len, kv_len) in enumerate(zip(case.q_lens, case.kv_lens, strict=True)):
        for t, start in ((q2, q_len), (k2, kv_len), (v2, kv_len)):
            tail = t[b, :, start:]
            tail.copy_(torch.randn(tail.shape, generator=g) * 1e3)
    for impl in ("auto", "reference", "sdpa"):
        expected = out if impl == "auto" else attend(q, k, v, q_lens, kv_lens, scale, impl)
        assert torch.equal(attend(q2, k2, v2, q_lens, kv_lens, scale, impl), expected), impl


def attend(*args):
    return torch.ops.bass.ragged_attention(*args)


@pytest.mark.parametrize(
    "case",
    [
        AttentionCase(Hkv=1, group=1, T=1, S=4, D=2, q_lens=(1,), kv_lens=(2,)),
        AttentionCase(Hkv=2, group=2, T=2, S=6, D=4, q_lens=(2, 1, 0), kv_lens=(2, 5, 3)),
    ],
    ids=["one-row", "ragged"],
)
def test_attention_ignores_nonfinite_values_past_kv_len(case):
    """A cache from torch.empty may hold NaN past kv_len; the contract never reads there."""
    q, k, v, q_lens, kv_lens, scale = case.tensors(torch.float32, "cpu")
    for bad_k, bad_v in ((math.nan, math.nan), (math.inf, -math.inf), (1.0, math.inf)):
        k2, v2 = k.clone(), v.clone()
        for b, kv_len in enumerate(case.kv_lens):
            k2[b, :, kv_len:] = bad_k
            v2[b, :, kv_len:] = bad_v
        for impl in ("reference", "sdpa", "auto"):
            out = torch.ops.bass.ragged_attention(q, k, v, q_lens, kv_lens, scale, impl)
            assert out.isfinite().all()
            torch.testing.assert_close(
                torch.ops.bass.ragged_attention(q, k2, v2, q_lens, kv_lens, scale, impl), out
            )


def test_attention_worked_example_from_the_docs():
    """``q_lens=[2, 0, 1]``, ``kv_lens=[5, 3, 1]``, ``T=2``: the module docstring's example."""
    case = AttentionCase(Hkv=1, group=2, T=2, S=5, D=4, q_lens=(2, 0, 1), kv_lens=(5, 3, 1))
    q, k, v, q_lens, kv_lens, scale = case.tensors(torch.float64, "cpu")
    out = torch.ops.bass.ragged_attention(q, k, v, q_lens, kv_lens, scale)
    # row 2's single query sees only key 0, so it returns v[2, :, 0] for every head
    torch.testing.assert_close(out[2, :, 0], v[2, 0, 0].expand(2, 4))
    assert (out[1] == 0).all() and (out[2, :, 1] == 0).all()
    # row 0's first query (position 3) does not see key 4: changing it changes only query 1
    k2 = k.clone()
    k2[0, :, 4] += 1.0
    out2 = torch.ops.bass.ragged_attention(q, k2, v, q_lens, kv_lens, scale)
    assert torch.equal(out2[0, :, 0], out[0, :, 0])
    assert not torch.equal(out2[0, :, 1], out[0, :, 1])


# --------------------------------------------------------------------------- kv_append cases


@dataclasses.dataclass(frozen=True)
class AppendCase:
    H: int
    T: int
    S: int
    D: int
    cache_lens: tuple[int, ...]
    new_lens: tuple[int, ...]
    seed: int = 0
    strided_cache: bool = False  # cache is a [B, S, H, D] buffer seen as [B, H, S, D]

    @property
    def B(self) -> int:
        return len(self.cache_lens)

    def tensors(self, dtype: torch.dtype, device: str):
        g = torch.Generator().manual_seed(self.seed)
        B, H, T, S, D = self.B, self.H, self.T, self.S, self.D

        def rand(*shape):
            return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype).to(device)

        if self.strided_cache:
            k_cache = rand(B, S, H, D).transpose(1, 2)
            v_cache = rand(B, S, H, D).transpose(1, 2)
        else:
            k_cache, v_cache = rand(B, H, S, D), rand(B, H, S, D)
        k_new, v_new = rand(B, H, T, D), rand(B, H, T, D)
        for b, n in enumerate(self.new_lens):  # padding entries must never be written
            k_new[b, :, n:] = float("nan")
            v_new[b, :, n:] = float("nan")
        cache_lens = torch.tensor(self.cache_lens, dtype=torch.int32, device=device)
        new_lens = torch.tensor(self.new_lens, dtype=torch.int32, device=device)
        return k_cache, v_cache, k_new, v_new, cache_lens, new_lens


@st.composite
def append_cases(draw) -> AppendCase:
    B = draw(st.integers(1, 4))
    S = draw(st.integers(1, 16))
    T = draw(st.sampled_from([1, S]) | st.integers(1, S))
    cache_lens, new_lens = [], []
    for _ in range(B):
        shape = draw(st.sampled_from(["any", "empty", "ends_at_S", "full"]))
        if shape == "full":  # nothing fits: only new_len 0 is legal
            cache_len, new_len = S, 0
        elif shape == "ends_at_S":  # the append ends exactly at S
            new_len = draw(st.integers(0, min(T, S)))
            cache_len = S - new_len
        else:
            cache_len = draw(st.integers(0, S))
            new_len = 0 if shape == "empty" else draw(st.integers(0, min(T, S - cache_len)))
        cache_lens.append(cache_len)
        new_lens.append(new_len)
    return AppendCase(
        H=draw(st.integers(1, 3)),
        T=T,
        S=S,
        D=draw(st.integers(1, 16)),
        cache_lens=tuple(cache_lens),
        new_lens=tuple(new_lens),
        seed=draw(st.integers(0, 2**32 - 1)),
        strided_cache=draw(st.booleans()),
    )


APPEND_EDGE_CASES = [
    AppendCase(H=2, T=3, S=5, D=4, cache_lens=(0, 2, 5), new_lens=(0, 0, 0)),  # new_lens 0
    AppendCase(H=1, T=3, S=5, D=2, cache_lens=(2, 4, 0), new_lens=(3, 1, 3)),  # ends at S
    AppendCase(H=2, T=4, S=4, D=3, cache_lens=(0, 0), new_lens=(4, 2)),  # T == S, whole cache
    AppendCase(H=3, T=2, S=6, D=1, cache_lens=(5, 1), new_lens=(1, 2), strided_cache=True),
    AppendCase(H=1, T=16, S=16, D=16, cache_lens=(0, 15, 16), new_lens=(16, 1, 0)),
]


def with_append_edge_cases(test):
    for case in reversed(APPEND_EDGE_CASES):
        test = example(case=case)(test)
    return test


APPEND_CALLS = {
    "op": torch.ops.bass.kv_append,
    "wrapper": bass.ops.kv_append,
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("call", list(APPEND_CALLS))
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16], ids=str)
@settings(max_examples=examples(80), deadline=None)
@with_append_edge_cases
@given(case=append_cases())
def test_kv_append_matches_naive_loop(case, dtype, call, device):
    k_cache, v_cache, k_new, v_new, cache_lens, new_lens = case.tensors(dtype, device)
    k_expected, v_expected = naive_kv_append(k_cache, v_cache, k_new, v_new, cache_lens, new_lens)
    k_ptr, v_ptr = k_cache.data_ptr(), v_cache.data_ptr()
    assert APPEND_CALLS[call](k_cache, v_cache, k_new, v_new, cache_lens, new_lens) is None
    # in place, bit-exact everywhere: the written slots hold the new entries, the rest is
    # untouched (NaN padding in k_new/v_new would show if any padding entry were written)
    assert (k_cache.data_ptr(), v_cache.data_ptr()) == (k_ptr, v_ptr)
    assert torch.equal(k_cache, k_expected)
    assert torch.equal(v_cache, v_expected)


@settings(max_examples=examples(40), deadline=None)
@with_append_edge_cases
@given(case=append_cases())
def test_kv_append_then_attention_sees_the_new_keys(case):
    """Appending then attending equals attending over a cache built by the naive loop."""
    k_cache, v_cache, k_new, v_new, cache_lens, new_lens = case.tensors(torch.float64, "cpu")
    k_expected, v_expected = naive_kv_append(k_cache, v_cache, k_new, v_new, cache_lens, new_lens)
    torch.ops.bass.kv_append(k_cache, v_cache, k_new, v_new, cache_lens, new_lens)
    kv_lens = cache_lens + new_lens
    q = torch.randn(case.B, case.H, case.T, case.D, dtype=torch.float64)
    out = torch.ops.bass.ragged_attention(q, k_cache, v_cache, new_lens, kv_lens, 0.5)
    expected = naive_ragged_attention(q, k_expected, v_expected, new_lens, kv_lens, 0.5)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-12)
