"""Tests of the ``fused`` implementation (bass's Triton kernels) of the ragged attention
family.

Two groups here (the other two, sm_90 builds and GPU checks, are in
``test_triton_fused_gpu.py``, which shares this file's helpers), each on padded rows
(``[B, Hq, T, D]`` flattened row after row, ``starts[b] = b * T``: what the padded op hands
the kernels) and on packed passes, against the reference:

* host side and registration: the split rule, the registry entry, ``import bass``
  without triton (a subprocess that hides it). No GPU, no interpreter.
* the kernels in Triton's interpreter, on CPU tensors, against the reference. The
  interpreter must be chosen before triton is first imported, and the rest of the suite
  imports it (``import bass`` does), so ``test_kernels_in_triton_interpreter`` reruns this
  file in a subprocess with ``TRITON_INTERPRET=1``; there the interpreter tests run and
  the driver skips. Run them directly with ``TRITON_INTERPRET=1 pytest
  tests/ops/test_triton_fused.py``. Small shapes (B <= 3, T <= 5, S <= 40): the interpreter
  runs numpy per tile and takes ~0.1 s per launch.

Tolerances (fused output vs. the reference on the same inputs, computed in float32;
``vmax`` = the largest ``|v|``): float32 ``1e-4`` relative and ``1e-4 * vmax`` absolute
(IEEE fp32 dots, only summation order differs); float16 ``2e-3`` (the probabilities are
rounded to float16 for the PV dot, the output once more); bfloat16 ``1e-2`` (the same with
8-bit mantissas; in the interpreter the dots run in fp32, see ``UPCAST_DOT``).
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from test_ops_packed import EDGE as PACKED_EDGE
from test_ops_packed import PackedCase, packed_cases
from test_ops_reference import AttentionCase

import bass
from bass.ops import fused, plan

ROOT = Path(__file__).resolve().parents[2]
HAS_TRITON = importlib.util.find_spec("triton") is not None
INTERPRETED = fused.interpreted()  # this process runs the kernels in the interpreter

needs_interpreter = pytest.mark.skipif(
    not INTERPRETED,
    reason="runs in the TRITON_INTERPRET=1 subprocess of test_kernels_in_triton_interpreter",
)

# dtype -> (rtol, atol relative to max |v|); see the module docstring.
TOLERANCES = {
    torch.float32: (1e-4, 1e-4),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1e-2, 1e-2),
}


def _fix_interpreter_for_numpy_2_4() -> None:
    """Triton 3.6's interpreter turns a loop bound into an int with ``int(array of shape
    (1,))``, which NumPy >= 2.4 refuses (triton-lang/triton#9171, fixed upstream after 3.6
    by #9172, whose one-line change this applies). Test-only: the library never patches
    Triton."""
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor
    if getattr(original, "bass_fixed", False):
        return

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    patched.bass_fixed = True
    interpreter._patch_lang_tensor = patched


if INTERPRETED and np.lib.NumpyVersion(np.__version__) >= "2.4.0":
    _fix_interpreter_for_numpy_2_4()


# --------------------------------------------------------------------------- helpers


def fused_padded(q, k, v, q_lens, kv_lens, scale, **kw):
    """The kernels on padded rows ``[B, Hq, T, D]``, flattened as the padded op does."""
    B, Hq, T, D = q.shape
    flat = q.transpose(0, 1).reshape(1, Hq, B * T, D)
    starts = torch.arange(B, dtype=torch.int32, device=q.device) * T
    out = fused.fused_attention(flat, k, v, starts, q_lens, kv_lens, scale, **kw)
    return out[0].unflatten(1, (B, T)).transpose(0, 1).contiguous()


def reference_padded(q, k, v, q_lens, kv_lens, scale):
    return torch.ops.bass.ragged_attention(q, k, v, q_lens, kv_lens, scale, "reference")


def fused_packed(q, k, v, cu_q_lens, kv_lens, scale, **kw):
    return fused.fused_attention(q, k, v, cu_q_lens[:-1], cu_q_lens.diff(), kv_lens, scale, **kw)


def check_fused(out, case: AttentionCase, args, dtype) -> None:
    """``out`` is the reference's answer within the dtype's tolerance, padding exactly 0."""
    q, k, v, q_lens, kv_lens, scale = args
    assert out.shape == (case.B, case.Hq, case.T, case.D)
    assert out.dtype == dtype
    assert out.device == q.device
    out = out.cpu()
    for b, q_len in enumerate(case.q_lens):
        assert (out[b, :, q_len:] == 0).all(), f"row {b}: padding slots are not 0"
    expected = reference_padded(*(t.float() for t in (q, k, v)), q_lens, kv_lens, scale).cpu()
    rtol, atol = TOLERANCES[dtype]
    vmax = float(v.abs().max()) if v.numel() else 1.0
    torch.testing.assert_close(out.float(), expected, rtol=rtol, atol=atol * vmax)


@st.composite
def small_cases(draw) -> AttentionCase:
    """Shapes small enough for the interpreter, biased towards the contract's edges."""
    B = draw(st.integers(1, 3))
    T = draw(st.integers(1, 5))
    S = draw(st.integers(1, 40))
    all_padding = draw(st.integers(0, 7)) == 7
    q_lens, kv_lens = [], []
    for _ in range(B):
        kv_len = draw(st.sampled_from([0, S]) | st.integers(0, S))
        top = min(T, kv_len)
        q_lens.append(0 if all_padding else draw(st.sampled_from([0, top]) | st.integers(0, top)))
        kv_lens.append(kv_len)
    return AttentionCase(
        Hkv=draw(st.integers(1, 2)),
        group=draw(st.sampled_from([1, 2, 4])),
        T=T,
        S=S,
        D=draw(st.sampled_from([8, 12, 16, 32])),
        q_lens=tuple(q_lens),
        kv_lens=tuple(kv_lens),
        seed=draw(st.integers(0, 2**32 - 1)),
        magnitude=draw(st.sampled_from([1.0, 0.1, 4.0])),
        scale=draw(st.sampled_from([None, 1.0, 0.0, -0.5])),
        transposed=draw(st.booleans()),
    )


# Every edge the contract names (the interpreter tiles are 16 queries x 16 keys).
EDGE = {
    # q_len 0 next to a full row; T > max q_len (slot 2 is padding everywhere)
    "q_len_0": AttentionCase(Hkv=2, group=2, T=3, S=20, D=8, q_lens=(0, 2), kv_lens=(3, 20)),
    # q_len == kv_len == T == S (prefill); G * T = 20 rows: two query blocks
    "prefill": AttentionCase(Hkv=1, group=4, T=5, S=5, D=16, q_lens=(5, 5), kv_lens=(5, 5)),
    # kv_len == S in every row, MQA, three key tiles
    "full_cache": AttentionCase(
        Hkv=1, group=4, T=2, S=40, D=32, q_lens=(1, 2, 2), kv_lens=(40, 40, 40)
    ),
    # kv_len 0 rows among live rows; transformers' [B, T, H, D] layout
    "kv_len_0": AttentionCase(
        Hkv=2, group=1, T=2, S=33, D=8, q_lens=(0, 1, 2), kv_lens=(0, 1, 33), transposed=True
    ),
    # all-padding batch: nothing to attend anywhere, output all zeros
    "all_padding": AttentionCase(Hkv=2, group=2, T=3, S=17, D=8, q_lens=(0, 0), kv_lens=(0, 17)),
    # a long row next to short ones: the short rows' later split chunks are empty
    "long_and_short": AttentionCase(
        Hkv=1, group=2, T=4, S=40, D=16, q_lens=(4, 1, 2), kv_lens=(40, 1, 5)
    ),
    # large scores (softmax stability), GQA group 4, two query blocks
    "large_scores": AttentionCase(
        Hkv=2, group=4, T=5, S=37, D=16, q_lens=(5, 1, 2), kv_lens=(37, 3, 2), magnitude=6.0
    ),
    # first query positions 14, 30, 14, next to the edge of a 16-key tile: the unmasked
    # stage must stop exactly where a later query's key or the row's end begins
    "tile_edges": AttentionCase(
        Hkv=1, group=2, T=3, S=33, D=8, q_lens=(2, 3, 1), kv_lens=(16, 33, 15)
    ),
    # negative scale, a prefill row spanning both stages of the key loop
    "negative_scale": AttentionCase(
        Hkv=1, group=1, T=5, S=40, D=12, q_lens=(5,), kv_lens=(21,), scale=-0.5
    ),
}
EDGE_CASES = list(EDGE.values())


def with_edge_cases(test):
    for case in reversed(EDGE_CASES):
        test = example(case=case)(test)
    return test


# --------------------------------------------------------------------------- host side


def test_num_kv_splits_uses_shapes_and_sm_count_only():
    split = fused.num_kv_splits
    assert split(programs=132, S=1 << 16, sms=132) == 1  # a full wave: no split
    assert split(programs=8, S=100, sms=132) == 1  # short cache: no split
    assert split(programs=8, S=1024, sms=132) == 4  # bounded by S // MIN_KEYS_PER_SPLIT
    assert split(programs=8, S=1 << 16, sms=132) == 16  # ceil(132 / 8) = 17 > MAX_SPLITS
    assert split(programs=40, S=1 << 16, sms=132) == 4  # ceil(132 / 40)
    assert split(programs=1, S=1 << 20, sms=132) == fused.MAX_SPLITS


def test_tiles_cover_the_head_dim_with_powers_of_two():
    for D in (1, 8, 12, 64, 80, 128, 256):
        for M in (1, 4, 20, 64, 300):
            for fp32 in (False, True):
                bm, bn, bd, _, _ = fused._tiles(M, D, fp32=fp32, interpret=False)
                assert bd >= max(D, 16) and bd & (bd - 1) == 0
                assert 16 <= bm <= 64 and bm & (bm - 1) == 0
                assert bn in (16, 32, 64)


def test_fused_is_registered_for_cuda_and_auto_in_eager_passes():
    impl = plan.IMPLEMENTATIONS["fused"]
    assert impl.devices == (("cuda", "cpu") if INTERPRETED else ("cuda",))
    assert impl.single_launch and impl.traceable
    assert (impl.unavailable() is None) == (
        HAS_TRITON and (torch.cuda.is_available() or INTERPRETED)
    )
    if not torch.cuda.is_available() and not INTERPRETED:
        assert "fused" not in bass.ops.implementations()
        why = "no CUDA" if HAS_TRITON else "triton is not installed"
        with pytest.raises(RuntimeError, match=rf"'fused' is not available here \({why}"):
            bass.ops.resolve("fused", torch.device("cuda"))
    # auto on CUDA: fused in eager passes (where it can run), flex traced into graphs
    eager = bass.ops.resolve("auto", torch.device("cuda"), "eager")[0].name
    assert eager == ("fused" if impl.unavailable() is None else "reference")
    for kind in ("compiled", "graphs"):
        assert bass.ops.resolve("auto", torch.device("cuda"), kind)[0].name == "flex"


IMPORT_WITHOUT_TRITON = """
import sys
sys.modules["triton"] = None  # `import triton` now raises ImportError
import torch, bass
impl = bass.ops.plan.IMPLEMENTATIONS["fused"]
assert impl.unavailable() == "triton is not installed", impl.unavailable()
try:
    bass.ops.resolve("fused", torch.device("cuda"))
except RuntimeError as error:
    assert "triton is not installed" in str(error), error
else:
    raise AssertionError("resolve('fused') did not raise")
q = torch.zeros(1, 1, 1, 16)
lens = torch.ones(1, dtype=torch.int32)
try:
    torch.ops.bass.ragged_attention_fused(q, q, q, lens - 1, lens, lens, 1.0)
except RuntimeError as error:
    assert "needs triton" in str(error), error
else:
    raise AssertionError("the fused op ran without triton")
print("ok")
"""


@pytest.mark.skipif(INTERPRETED, reason="checked by the parent run")
def test_import_bass_without_triton_registers_fused_as_unavailable():
    result = subprocess.run(
        [sys.executable, "-c", IMPORT_WITHOUT_TRITON],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-4000:]


@pytest.mark.skipif(INTERPRETED, reason="this process runs the interpreter")
def test_cpu_tensors_without_the_interpreter_are_refused():
    pytest.importorskip("triton")
    args = EDGE["q_len_0"].tensors(torch.float32, "cpu")
    with pytest.raises(RuntimeError, match=r"runs on CUDA tensors.*TRITON_INTERPRET=1"):
        fused_padded(*args)


def test_triton_3_6s_interpreter_error_under_numpy_2_4_is_explained():
    """The interpreter's own error names neither Triton's bug nor NumPy (the tests patch
    Triton, a user's process does not); other errors pass through as they are."""
    pytest.importorskip("triton")
    bug = "TypeError('only 0-dimensional arrays can be converted to Python scalars')"
    hint = r"install 'numpy<2.4', or a Triton with the fix"
    with pytest.raises(RuntimeError, match=hint) as info, fused._numpy_2_4_hint(True):
        raise TypeError(bug)
    assert str(info.value.__cause__) == bug
    for interpret, message in ((False, bug), (True, "another error")):
        with pytest.raises(TypeError, match=re.escape(message)), fused._numpy_2_4_hint(interpret):
            raise TypeError(message)


@pytest.mark.skipif(INTERPRETED, reason="this is the interpreter run")
def test_kernels_in_triton_interpreter():
    """Run this file's interpreter tests in a fresh process with TRITON_INTERPRET=1."""
    pytest.importorskip("triton")
    command = [sys.executable, "-m", "pytest", __file__, "-q", "-p", "no:cacheprovider"]
    result = subprocess.run(
        [*command, "-m", "not gpu"],
        cwd=ROOT,
        env={**os.environ, "TRITON_INTERPRET": "1"},
        capture_output=True,
        text=True,
        timeout=900,
    )
    report = result.stdout[-8000:] + result.stderr[-4000:]
    assert result.returncode == 0, report
    passed = re.search(r"(\d+) passed", result.stdout)
    assert passed and int(passed.group(1)) >= 20, report  # the interpreter tests did run


# --------------------------------------------------------------------------- interpreter


@needs_interpreter
@pytest.mark.parametrize("split", [None, 1, 2, 3], ids=lambda s: f"split={s}")
@settings(max_examples=12)
@with_edge_cases
@given(case=small_cases())
def test_fused_float32_matches_reference(case, split):
    """split=None: the direct path (S <= 40 never splits); 1..3: the split-KV path."""
    args = case.tensors(torch.float32, "cpu")
    out = fused_padded(*args, split=split)
    assert out.is_contiguous()
    check_fused(out, case, args, torch.float32)


@needs_interpreter
@pytest.mark.parametrize("split", [None, 2], ids=lambda s: f"split={s}")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@settings(max_examples=6)
@example(case=EDGE["prefill"])
@example(case=EDGE["long_and_short"])
@example(case=EDGE["large_scores"])
@given(case=small_cases())
def test_fused_low_precision_matches_reference(case, dtype, split):
    args = case.tensors(dtype, "cpu")
    check_fused(fused_padded(*args, split=split), case, args, dtype)


@needs_interpreter
@pytest.mark.parametrize("split", [None, 3], ids=lambda s: f"split={s}")
@settings(max_examples=6)
@example(case=EDGE["q_len_0"])
@example(case=EDGE["long_and_short"])
@example(case=EDGE["tile_edges"])
@given(case=small_cases())
def test_fused_never_reads_past_kv_len_or_padding_queries(case, split):
    """NaN or inf in cache slots >= kv_len (a torch.empty cache) and NaN in padding query
    slots change nothing, bit for bit: the kernels never load them."""
    q, k, v, q_lens, kv_lens, scale = case.tensors(torch.float32, "cpu")
    out = fused_padded(q, k, v, q_lens, kv_lens, scale, split=split)
    q2, k2, v2 = q.clone(), k.clone(), v.clone()
    for b, (q_len, kv_len) in enumerate(zip(case.q_lens, case.kv_lens)):
        q2[b, :, q_len:] = float("nan")
        k2[b, :, kv_len:] = float("nan")
        v2[b, :, kv_len:] = float("inf")
    out2 = fused_padded(q2, k2, v2, q_lens, kv_lens, scale, split=split)
    assert not out2.isnan().any()
    assert torch.equal(out2, out)


@needs_interpreter
@pytest.mark.parametrize(("block_m", "block_n"), [(16, 32), (32, 16), (64, 64)])
@pytest.mark.parametrize("name", ["prefill", "full_cache", "tile_edges", "negative_scale"])
def test_fused_other_tile_shapes(name, block_m, block_n):
    case = EDGE[name]
    args = case.tensors(torch.float32, "cpu")
    for split in (0, 2):
        out = fused_padded(*args, split=split, block_m=block_m, block_n=block_n)
        check_fused(out, case, args, torch.float32)


@needs_interpreter
@pytest.mark.parametrize("D", [64, 80, 128, 256])
def test_fused_large_head_dims(D):
    case = AttentionCase(Hkv=1, group=2, T=2, S=20, D=D, q_lens=(2, 1), kv_lens=(20, 7))
    args = case.tensors(torch.float32, "cpu")
    check_fused(fused_padded(*args), case, args, torch.float32)
    check_fused(fused_padded(*args, split=2), case, args, torch.float32)


@needs_interpreter
def test_fused_worked_example_from_the_module_docstring():
    """G = 2, T = 3, q_lens = [2], kv_lens = [6]: queries at positions 4 and 5."""
    case = AttentionCase(Hkv=1, group=2, T=3, S=6, D=8, q_lens=(2,), kv_lens=(6,))
    q, k, v, q_lens, kv_lens, scale = case.tensors(torch.float32, "cpu")
    out = fused_padded(q, k, v, q_lens, kv_lens, scale)
    assert (out[0, :, 2] == 0).all()
    k2 = k.clone()
    k2[0, :, 5] += 1.0  # key 5 is visible to the second query only
    out2 = fused_padded(q, k2, v, q_lens, kv_lens, scale)
    assert torch.equal(out2[0, :, 0], out[0, :, 0])
    assert not torch.equal(out2[0, :, 1], out[0, :, 1])


@needs_interpreter
def test_fused_float64_is_the_reference():
    args = EDGE["full_cache"].tensors(torch.float64, "cpu")
    assert torch.equal(fused_padded(*args), reference_padded(*args))


@needs_interpreter
def test_fused_head_dims_past_its_tiles_are_the_reference():
    """Gemma 4's global layers have head dim 512: ``auto`` picks ``fused`` in a GPU's eager
    passes, so a head dim its tiles do not take must run (as the reference), not raise."""
    case = AttentionCase(Hkv=1, group=2, T=3, S=6, D=288, q_lens=(2, 3), kv_lens=(6, 3))
    args = case.tensors(torch.float32, "cpu")
    assert torch.equal(fused_padded(*args), reference_padded(*args))
    out = torch.ops.bass.ragged_attention(*args, "fused")
    assert torch.equal(out, torch.ops.bass.ragged_attention(*args, "reference"))


@needs_interpreter
def test_registered_op_and_the_family_run_the_kernels_in_the_interpreter():
    """The triton_op itself (its schema checked by opcheck), and ``impl="fused"`` of both
    public ops, eagerly on CPU tensors."""
    case = EDGE["long_and_short"]
    args = case.tensors(torch.float32, "cpu")
    check_fused(torch.ops.bass.ragged_attention(*args, "fused"), case, args, torch.float32)
    q, k, v, q_lens, kv_lens, scale = args
    B, Hq, T, D = q.shape
    flat = (
        q.transpose(0, 1).reshape(1, Hq, B * T, D),
        k,
        v,
        torch.arange(B, dtype=torch.int32) * T,
    )
    op = torch.ops.bass.ragged_attention_fused.default
    torch.library.opcheck(op, (*flat, q_lens, kv_lens, scale), test_utils="test_schema")
    packed_case = PACKED_CASES["worked_example"]
    packed_args = packed_case.tensors(torch.float32)
    out = torch.ops.bass.ragged_attention_packed(*packed_args, "fused")
    check_fused_packed(out, packed_case, packed_args, torch.float32)


@needs_interpreter
@pytest.mark.parametrize("split", [None, 2], ids=lambda s: f"split={s}")
def test_fused_strided_and_expanded_length_tensors(split):
    """Lengths that are views (a column of a [B, 2] tensor; one value expanded to B rows)
    pass the op's checks; the kernels index them as flat arrays, so they must be made
    dense first."""
    case = AttentionCase(Hkv=2, group=2, T=2, S=12, D=8, q_lens=(2, 1, 2), kv_lens=(9, 4, 12))
    q, k, v, q_lens, kv_lens, scale = case.tensors(torch.float32, "cpu")
    both = torch.stack([q_lens, kv_lens], 1)  # [B, 2]: columns have stride 2
    out = fused_padded(q, k, v, both[:, 0], both[:, 1], scale, split=split)
    check_fused(out, case, (q, k, v, q_lens, kv_lens, scale), torch.float32)
    one = AttentionCase(Hkv=2, group=2, T=1, S=12, D=8, q_lens=(1, 1, 1), kv_lens=(5, 5, 5))
    q, k, v, q_lens, kv_lens, scale = one.tensors(torch.float32, "cpu")
    expanded = [torch.tensor([n], dtype=torch.int32).expand(3) for n in (1, 5)]
    out = fused_padded(q, k, v, *expanded, scale, split=split)
    check_fused(out, one, (q, k, v, q_lens, kv_lens, scale), torch.float32)


# --------------------------------------------------------------------------- packed layout

PACKED_CASES = {
    **PACKED_EDGE,
    # G = 3 (query rows straddle blocks), rows of 7, 0, 12 and 1 tokens: several blocks
    # per row, block starts next to a row's end, two padding tokens, three key tiles
    "blocks_and_tiles": PackedCase(
        Hkv=1, group=3, S=40, D=16, q_lens=(7, 0, 12, 1), kv_lens=(20, 0, 40, 33), pad=2
    ),
}


def check_fused_packed(out, case: PackedCase, args, dtype) -> None:
    """The packed reference's answer within the dtype's tolerance; padding tokens 0."""
    q, k, v, cu_q_lens, kv_lens, scale = args
    assert out.shape == (1, case.Hq, case.N, case.D)
    assert out.dtype == dtype
    assert out.transpose(1, 2).is_contiguous(), "the output is not stored token-major"
    assert (out[:, :, sum(case.q_lens) :] == 0).all(), "padding tokens are not 0"
    expected = torch.ops.bass.ragged_attention_packed(
        *(t.float() for t in (q, k, v)), cu_q_lens, kv_lens, scale, "reference"
    )
    rtol, atol = TOLERANCES[dtype]
    vmax = float(v.abs().max()) if v.numel() else 1.0
    torch.testing.assert_close(out.float(), expected, rtol=rtol, atol=atol * vmax)


def with_packed_cases(*names):
    def decorate(test):
        for name in reversed(names or list(PACKED_CASES)):
            test = example(case=PACKED_CASES[name])(test)
        return test

    return decorate


@needs_interpreter
@pytest.mark.parametrize("split", [None, 3], ids=lambda s: f"split={s}")
@settings(max_examples=5)
@with_packed_cases()
@given(case=packed_cases())
def test_fused_packed_float32_matches_reference(case, split):
    args = case.tensors(torch.float32)
    out = fused_packed(*args, split=split)
    check_fused_packed(out, case, args, torch.float32)


@needs_interpreter
@pytest.mark.parametrize("split", [None, 2], ids=lambda s: f"split={s}")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@settings(max_examples=2)
@with_packed_cases("worked_example", "prefill", "large_scores")
@given(case=packed_cases())
def test_fused_packed_low_precision_matches_reference(case, dtype, split):
    args = case.tensors(dtype)
    check_fused_packed(fused_packed(*args, split=split), case, args, dtype)


@needs_interpreter
@pytest.mark.parametrize("split", [None, 3], ids=lambda s: f"split={s}")
@settings(max_examples=2)
@with_packed_cases("worked_example", "decode_mixed", "blocks_and_tiles")
@given(case=packed_cases())
def test_fused_packed_never_reads_past_kv_len_or_padding_tokens(case, split):
    """NaN/Inf past kv_len and NaN in the padding tokens' queries change nothing, bit for
    bit: the kernels never load them."""
    q, k, v, cu_q_lens, kv_lens, scale = case.tensors(torch.float32)
    out = fused_packed(q, k, v, cu_q_lens, kv_lens, scale, split=split)
    q2, k2, v2 = q.clone(), k.clone(), v.clone()
    q2[:, :, sum(case.q_lens) :] = float("nan")
    for b, kv_len in enumerate(case.kv_lens):
        k2[b, :, kv_len:] = float("nan")
        v2[b, :, kv_len:] = float("inf")
    out2 = fused_packed(q2, k2, v2, cu_q_lens, kv_lens, scale, split=split)
    assert not out2.isnan().any()
    assert torch.equal(out2, out)


@needs_interpreter
@pytest.mark.parametrize(("block_m", "block_n"), [(16, 32), (32, 16), (64, 64)])
@pytest.mark.parametrize("name", ["blocks_and_tiles", "decode_all"])
def test_fused_packed_other_tile_shapes(name, block_m, block_n):
    """Other query blocks move every row's block starts (G * cu[b] // BLOCK_M + b)."""
    case = PACKED_CASES[name]
    args = case.tensors(torch.float32)
    for split in (0, 2):
        out = fused_packed(*args, split=split, block_m=block_m, block_n=block_n)
        check_fused_packed(out, case, args, torch.float32)


@needs_interpreter
def test_fused_packed_float64_is_the_reference_and_lengths_may_be_views():
    args = PACKED_CASES["worked_example"].tensors(torch.float64)
    expected = torch.ops.bass.ragged_attention_packed(*args, "reference")
    assert torch.equal(fused_packed(*args), expected)
    case = PACKED_CASES["blocks_and_tiles"]
    q, k, v, cu_q_lens, kv_lens, scale = case.tensors(torch.float32)
    both = torch.stack([cu_q_lens[:-1], cu_q_lens.diff(), kv_lens], 1)  # [B, 3]: stride 3
    out = fused.fused_attention(q, k, v, both[:, 0], both[:, 1], both[:, 2], scale)
    check_fused_packed(out, case, (q, k, v, cu_q_lens, kv_lens, scale), torch.float32)
