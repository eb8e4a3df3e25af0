"""The ops' contract as seen by PyTorch (``opcheck``) and by a caller (eager errors)."""

from __future__ import annotations

import re

import pytest
import torch

import bass

B, HQ, HKV, T, S, D = 3, 4, 2, 2, 6, 8
SCALE = D**-0.5

# name -> (q_lens, kv_lens) for attention and (cache_lens, new_lens) for kv_append (T=2, S=6)
LENGTH_PATTERNS = {
    "uniform": ((2, 2, 2), (4, 4, 4), (2, 2, 2), (2, 2, 2)),
    "spread": ((2, 1, 0), (6, 3, 1), (0, 3, 4), (2, 1, 0)),
    "zero_length_rows": ((0, 2, 0), (0, 5, 0), (0, 2, 6), (0, 2, 0)),
    "full_cache": ((2, 1, 2), (6, 6, 6), (4, 5, 6), (2, 1, 0)),
}


def lens(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


def attention_args(q_lens=(2, 1, 0), kv_lens=(6, 3, 1), dtype=torch.float32, **shape):
    dims = {"B": B, "Hq": HQ, "Hkv": HKV, "T": T, "S": S, "D": D, **shape}
    g = torch.Generator().manual_seed(0)
    q = torch.randn(dims["B"], dims["Hq"], dims["T"], dims["D"], generator=g, dtype=dtype)
    k = torch.randn(dims["B"], dims["Hkv"], dims["S"], dims["D"], generator=g, dtype=dtype)
    v = torch.randn(dims["B"], dims["Hkv"], dims["S"], dims["D"], generator=g, dtype=dtype)
    return q, k, v, lens(q_lens), lens(kv_lens), SCALE


def append_args(cache_lens=(0, 3, 4), new_lens=(2, 1, 0), dtype=torch.float32):
    g = torch.Generator().manual_seed(1)
    k_cache = torch.randn(B, HKV, S, D, generator=g, dtype=dtype)
    v_cache = torch.randn(B, HKV, S, D, generator=g, dtype=dtype)
    k_new = torch.randn(B, HKV, T, D, generator=g, dtype=dtype)
    v_new = torch.randn(B, HKV, T, D, generator=g, dtype=dtype)
    return k_cache, v_cache, k_new, v_new, lens(cache_lens), lens(new_lens)


def attention(*args, **kwargs):
    return torch.ops.bass.ragged_attention(*args, **kwargs)


# --------------------------------------------------------------------------- opcheck

OPCHECK_UTILS = (
    "test_schema",
    "test_autograd_registration",
    "test_faketensor",
    "test_aot_dispatch_dynamic",
)


def assert_opcheck_passes(op, args, kwargs=None):
    result = torch.library.opcheck(op, args, kwargs)  # the default utils: all of them
    assert set(OPCHECK_UTILS) <= set(result), result
    assert all(status == "SUCCESS" for status in result.values()), result


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("pattern", list(LENGTH_PATTERNS))
@pytest.mark.parametrize(
    ("op", "kwargs"),
    [
        pytest.param(torch.ops.bass.ragged_attention.default, None, id="public-auto"),
        *(
            pytest.param(torch.ops.bass.ragged_attention.default, {"impl": i}, id=f"public-{i}")
            for i in ("reference", "sdpa", "flex")
        ),
    ],
)
def test_opcheck_ragged_attention(op, kwargs, pattern, dtype):
    q_lens, kv_lens, _, _ = LENGTH_PATTERNS[pattern]
    assert_opcheck_passes(op, attention_args(q_lens, kv_lens, dtype=dtype), kwargs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("pattern", list(LENGTH_PATTERNS))
def test_opcheck_kv_append(pattern, dtype):
    _, _, cache_lens, new_lens = LENGTH_PATTERNS[pattern]
    assert_opcheck_passes(
        torch.ops.bass.kv_append.default, append_args(cache_lens, new_lens, dtype)
    )


# the packed ops: name -> (q_lens, kv_lens, cache_lens, padding tokens); S = 8
PACKED_PATTERNS = {
    "worked_example": ((3, 0, 2), (7, 4, 2), (4, 4, 0), 3),  # rows of 3, 0, 2 tokens; N = 8
    "decode": ((1, 1, 1), (5, 6, 6), (4, 5, 7), 0),
    "all_empty": ((0, 0, 0), (0, 3, 8), (0, 3, 8), 2),
    "prefill": ((2, 2, 1), (2, 2, 1), (6, 0, 7), 0),
}
PACKED_S = 8


def packed_attention_args(q_lens, kv_lens, pad, dtype=torch.float32):
    """HF's layout: q a transposed view of a [1, N, Hq, D] buffer."""
    g = torch.Generator().manual_seed(2)
    N, B = sum(q_lens) + pad, len(q_lens)
    q = torch.randn(1, N, HQ, D, generator=g, dtype=dtype).transpose(1, 2)
    k = torch.randn(B, HKV, PACKED_S, D, generator=g, dtype=dtype)
    v = torch.randn(B, HKV, PACKED_S, D, generator=g, dtype=dtype)
    cu = lens([sum(q_lens[:b]) for b in range(B + 1)])
    return q, k, v, cu, lens(kv_lens), SCALE


def packed_append_args(q_lens, cache_lens, pad, dtype=torch.float32):
    g = torch.Generator().manual_seed(3)
    N, B = sum(q_lens) + pad, len(q_lens)
    k_cache = torch.randn(B, HKV, PACKED_S, D, generator=g, dtype=dtype)
    v_cache = torch.randn(B, HKV, PACKED_S, D, generator=g, dtype=dtype)
    k_new = torch.randn(1, N, HKV, D, generator=g, dtype=dtype).transpose(1, 2)
    v_new = torch.randn(1, N, HKV, D, generator=g, dtype=dtype).transpose(1, 2)
    cu = lens([sum(q_lens[:b]) for b in range(B + 1)])
    return k_cache, v_cache, k_new, v_new, cu, lens(cache_lens)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("pattern", list(PACKED_PATTERNS))
@pytest.mark.parametrize("impl", ["auto", "reference", "sdpa", "flex"])
def test_opcheck_ragged_attention_packed(impl, pattern, dtype):
    q_lens, kv_lens, _, pad = PACKED_PATTERNS[pattern]
    args = packed_attention_args(q_lens, kv_lens, pad, dtype)
    assert_opcheck_passes(torch.ops.bass.ragged_attention_packed.default, args, {"impl": impl})


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("pattern", list(PACKED_PATTERNS))
def test_opcheck_kv_append_packed(pattern, dtype):
    q_lens, _, cache_lens, pad = PACKED_PATTERNS[pattern]
    args = packed_append_args(q_lens, cache_lens, pad, dtype)
    assert_opcheck_passes(torch.ops.bass.kv_append_packed.default, args)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("impl", ["auto", "reference", "flex", "fused"])
def test_opcheck_packed_ops_on_cuda(impl):
    if impl != "auto" and impl not in bass.ops.implementations("cuda"):
        pytest.skip(f"impl {impl} is not available in this process")
    q_lens, kv_lens, cache_lens, pad = PACKED_PATTERNS["worked_example"]
    args = packed_attention_args(q_lens, kv_lens, pad, torch.bfloat16)
    args = [t.cuda() if isinstance(t, torch.Tensor) else t for t in args]
    assert_opcheck_passes(torch.ops.bass.ragged_attention_packed.default, args, {"impl": impl})
    append = [t.cuda() for t in packed_append_args(q_lens, cache_lens, pad, torch.bfloat16)]
    assert_opcheck_passes(torch.ops.bass.kv_append_packed.default, append)


@pytest.mark.parametrize("pattern", list(LENGTH_PATTERNS))
def test_length_patterns_are_valid(pattern):
    """The patterns above are inside the contract (else opcheck would test error paths)."""
    q_lens, kv_lens, cache_lens, new_lens = LENGTH_PATTERNS[pattern]
    attention(*attention_args(q_lens, kv_lens))
    bass.ops.kv_append(*append_args(cache_lens, new_lens))


@pytest.mark.parametrize("pattern", list(PACKED_PATTERNS))
def test_packed_patterns_are_valid(pattern):
    q_lens, kv_lens, cache_lens, pad = PACKED_PATTERNS[pattern]
    bass.ops.ragged_attention_packed(*packed_attention_args(q_lens, kv_lens, pad))
    bass.ops.kv_append_packed(*packed_append_args(q_lens, cache_lens, pad))


# --------------------------------------------------------------------------- attention errors


def replace(args, **changes):
    names = ("q", "k", "v", "q_lens", "kv_lens", "scale")
    values = dict(zip(names, args, strict=True))
    values.update(changes)
    return tuple(values[n] for n in names)


ARGS = attention_args()
q, k, v, q_lens, kv_lens, _ = ARGS


@pytest.mark.parametrize(
    ("changes", "error", "message"),
    [
        # wrong ranks
        ({"q": q[0]}, ValueError, r"q must be 4-D \[B, Hq, T, D\], got shape \[4, 2, 8\]"),
        (
            {"k": k[None]},
            ValueError,
            r"k must be 4-D \[B, Hkv, S, D\], got shape \[1, 3, 2, 6, 8\]",
        ),
        (
            {"v": v.flatten(2)},
            ValueError,
            r"v must be 4-D \[B, Hkv, S, D\], got shape \[3, 2, 48\]",
        ),
        # wrong dtypes
        (
            {"k": k.int(), "v": v.int()},
            TypeError,
            r"k must be float16, bfloat16, float32 or float64, got torch.int32",
        ),
        ({"q": q.long()}, TypeError, r"q must be float16, .* got torch.int64"),
        (
            {"k": k.double()},
            TypeError,
            r"q, k, v must share a dtype, got torch.float32, torch.float64, torch.float32",
        ),
        (
            {"v": v.half()},
            TypeError,
            r"share a dtype, got torch.float32, torch.float32, torch.float16",
        ),
        # shapes that do not fit together
        (
            {"q": torch.randn(B, 3, T, D)},
            ValueError,
            r"query heads \(3\) must be a positive multiple of KV heads \(2\)",
        ),
        (
            {"k": torch.randn(B, 3, S, D), "v": torch.randn(B, 3, S, D)},
            ValueError,
            r"query heads \(4\) must be a positive multiple of KV heads \(3\)",
        ),
        (
            {"k": torch.randn(B, 0, S, D), "v": torch.randn(B, 0, S, D)},
            ValueError,
            r"positive multiple of KV heads \(0\)",
        ),
        ({"v": v[:, :, :-1]}, ValueError, r"k and v must have the same shape"),
        ({"k": k[:2], "v": v[:2]}, ValueError, r"q has batch 3 but k/v have batch 2"),
        (
            {"k": k[..., :4], "v": v[..., :4]},
            ValueError,
            r"q has head dim 8 but k/v have head dim 4",
        ),
        # lengths: dtype and shape
        (
            {"q_lens": q_lens.long()},
            TypeError,
            r"q_lens must be int32 \(got torch.int64\); convert with q_lens.to\(torch.int32\)",
        ),
        ({"kv_lens": kv_lens.long()}, TypeError, r"kv_lens must be int32 \(got torch.int64\)"),
        ({"kv_lens": kv_lens.float()}, TypeError, r"kv_lens must be int32 \(got torch.float32\)"),
        ({"q_lens": q_lens[:2]}, ValueError, r"q_lens must have shape \[B\] = \[3\], got \[2\]"),
        (
            {"kv_lens": kv_lens[:, None]},
            ValueError,
            r"kv_lens must have shape \[B\] = \[3\], got \[3, 1\]",
        ),
        ({"q_lens": q_lens[0]}, ValueError, r"q_lens must have shape \[B\] = \[3\], got \[\]"),
        (
            {"q_lens": [2, 1, 0]},  # caught by the dispatcher's schema check
            RuntimeError,
            r"Expected a value of type 'Tensor' for argument 'q_lens' but instead found type "
            r"'list'",
        ),
        # lengths: out of range, one condition each (first offending row reported)
        (
            {"q_lens": lens((2, -1, 0))},
            ValueError,
            r"row 1 has q_lens=-1, kv_lens=3; expected q_lens\[b\] >= 0",
        ),
        (
            {"q_lens": lens((0, 0, 0)), "kv_lens": lens((6, 3, -2))},
            ValueError,
            r"row 2 has q_lens=0, kv_lens=-2; expected kv_lens\[b\] >= 0",
        ),
        (
            {"kv_lens": lens((7, 3, 1))},
            ValueError,
            r"row 0 has q_lens=2, kv_lens=7; expected kv_lens\[b\] <= S = 6 \(the cache size",
        ),
        (
            {"q_lens": lens((2, 3, 0))},
            ValueError,
            r"row 1 has q_lens=3, kv_lens=3; expected q_lens\[b\] <= T = 2 \(q.shape\[2\]\)",
        ),
        (
            {"kv_lens": lens((6, 3, 0)), "q_lens": lens((2, 1, 1))},
            ValueError,
            r"row 2 has q_lens=1, kv_lens=0; expected q_lens\[b\] <= kv_lens\[b\]",
        ),
        # devices
        (
            {"q": q.to("meta")},
            ValueError,
            r"all tensors must be on one device, got q on meta, k on cpu, v on cpu, q_lens on cpu, "
            r"kv_lens on cpu",
        ),
        (
            {"k": k.to("meta"), "v": v.to("meta")},
            ValueError,
            r"one device, got q on cpu, k on meta, v on meta",
        ),
        (
            {"q_lens": q_lens.to("meta")},
            ValueError,
            r"one device, .*q_lens on meta, kv_lens on cpu",
        ),
        # scale
        ({"scale": float("nan")}, ValueError, r"scale must be a finite float.*, got nan"),
        ({"scale": float("inf")}, ValueError, r"scale must be a finite float.*, got inf"),
    ],
    ids=[
        "q-rank-3",
        "k-rank-5",
        "v-rank-3",
        "kv-int32",
        "q-int64",
        "k-float64",
        "v-float16",
        "hq-not-multiple-of-hkv",
        "hq-not-multiple-of-3",
        "hkv-zero",
        "k-v-shape-mismatch",
        "batch-mismatch",
        "head-dim-mismatch",
        "q_lens-int64",
        "kv_lens-int64",
        "kv_lens-float32",
        "q_lens-too-short",
        "kv_lens-2d",
        "q_lens-0d",
        "q_lens-list",
        "q_lens-negative",
        "kv_lens-negative",
        "kv_lens-over-S",
        "q_lens-over-T",
        "q_lens-over-kv_lens",
        "q-on-meta",
        "kv-on-meta",
        "q_lens-on-meta",
        "scale-nan",
        "scale-inf",
    ],
)
def test_attention_rejects_invalid_inputs(changes, error, message):
    with pytest.raises(error, match=message):
        attention(*replace(ARGS, **changes))


@pytest.mark.parametrize("names", [("q",), ("k",), ("v",), ("q", "v")], ids="+".join)
def test_attention_is_inference_only(names):
    args = attention_args()
    expected = attention(*args)
    grad_args = replace(args, **{n: args["qkv".index(n)].clone().requires_grad_() for n in names})
    message = (
        f"bass.ragged_attention is inference-only and has no backward, but {', '.join(names)} "
        f"require{'s' if len(names) == 1 else ''} grad; call it under torch.no_grad() / "
        "torch.inference_mode()"
    )
    with pytest.raises(RuntimeError, match=re.escape(message)):
        attention(*grad_args)
    with pytest.raises(RuntimeError, match="inference-only"):
        bass.ops.ragged_attention(*grad_args)
    with torch.no_grad():
        out = attention(*grad_args)
    with torch.inference_mode():
        out_inference = attention(*grad_args)
    assert not out.requires_grad
    assert torch.equal(out, expected)
    assert torch.equal(out_inference, expected)


def test_attention_refuses_forward_mode_tangents_it_would_drop():
    """Forward-mode AD carries no requires_grad: ``torch.func.jvp`` and dual tensors ran
    the op below autograd and lost the tangent (zero or None), a silently wrong derivative.
    Inside a dual level, inputs without tangents still run."""
    import torch.autograd.forward_ad as fwAD

    args = attention_args(dtype=torch.float64)
    q0, rest = args[0], args[1:]
    with pytest.raises(RuntimeError, match="no forward-mode derivative"):
        torch.func.jvp(lambda q: attention(q, *rest), (q0,), (torch.ones_like(q0),))
    with fwAD.dual_level():
        with pytest.raises(RuntimeError, match="no forward-mode derivative"):
            attention(fwAD.make_dual(q0, torch.ones_like(q0)), *rest)
        assert torch.equal(attention(*args), attention(*attention_args(dtype=torch.float64)))
    k_cache, v_cache, k_new, v_new, cache_lens, new_lens = append_args()
    with fwAD.dual_level(), pytest.raises(RuntimeError, match=r"bass\.kv_append is inference"):
        bass.ops.kv_append(
            k_cache, v_cache, fwAD.make_dual(k_new, k_new), v_new, cache_lens, new_lens
        )


def test_lengths_held_in_parameters_are_range_checked():
    """Lengths kept as module state (``nn.Parameter``/``nn.Buffer`` subclasses hold data)
    get the eager range checks plain tensors get: they were skipped as if fake, and an
    append past the cache silently overwrote its last slot."""
    k_cache, v_cache, k_new, v_new, _, _ = append_args()
    full = torch.nn.Parameter(lens((S - 1, 0, 0)), requires_grad=False)
    new = torch.nn.Parameter(lens((2, 0, 0)), requires_grad=False)
    before = k_cache.clone()
    with pytest.raises(ValueError, match="the cache is full"):
        bass.ops.kv_append(k_cache, v_cache, k_new, v_new, full, new)
    assert torch.equal(k_cache, before)
    q, k, v, q_lens, _, scale = attention_args()
    short = torch.nn.Parameter(lens((1, 0, 0)), requires_grad=False)  # q_len 2 > kv_len 1
    with pytest.raises(ValueError, match="q_lens"):
        attention(q, k, v, q_lens, short, scale)


def test_unknown_impl_lists_registered_names():
    with pytest.raises(ValueError, match=r"unknown ragged attention implementation 'nope'") as info:
        attention(*ARGS, impl="nope")
    listed = str(info.value).split("registered: ", 1)[1].split(", ")
    assert listed[0] == "auto"
    assert "reference" in listed
    assert set(bass.ops.implementations()) <= set(listed)


def test_impl_on_a_device_it_does_not_run_on():
    meta = torch.device("meta")  # meta tensors get the fakes; the dispatch itself refuses
    with pytest.raises(ValueError, match=r"'reference' runs on cpu, cuda, not meta"):
        bass.ops.resolve("reference", meta)
    with pytest.raises(RuntimeError, match=r"no ragged attention implementation runs on meta"):
        bass.ops.resolve("auto", meta)
    out = attention(*(t.to("meta") for t in ARGS[:5]), SCALE)
    assert out.device == meta and out.shape == ARGS[0].shape


def test_length_checks_false_skips_the_range_check():
    bad = replace(ARGS, kv_lens=lens((6, 3, 0)), q_lens=lens((2, 1, 1)))  # q_len > kv_len
    with pytest.raises(ValueError, match="expected q_lens"):
        attention(*bad)
    with bass.ops.length_checks(False):
        out = attention(*bad)  # garbage in, garbage out, but no host read and no error
        with bass.ops.length_checks(True), pytest.raises(ValueError, match="expected q_lens"):
            attention(*bad)
        out_again = attention(*bad)  # the inner block restored False
    assert out.shape == (B, HQ, T, D) and torch.equal(out, out_again)
    with pytest.raises(ValueError, match="expected q_lens"):  # restored on exit
        attention(*bad)
    with pytest.raises(ZeroDivisionError), bass.ops.length_checks(False):
        _ = 1 / 0
    with pytest.raises(ValueError, match="expected q_lens"):  # restored after an exception
        attention(*bad)


def test_length_checks_false_in_one_thread_leaves_another_threads_checked():
    """A generation turns the checks off around its steps: an op another thread calls
    meanwhile (a user's own model) is still checked. Before: the switch was the process's,
    and a bad length there wrote past the cache or read garbage, silently."""
    import threading

    bad = replace(ARGS, kv_lens=lens((6, 3, 0)), q_lens=lens((2, 1, 1)))  # q_len > kv_len
    inside, done, seen = threading.Event(), threading.Event(), []

    def generation():
        with bass.ops.length_checks(False):
            inside.set()
            done.wait(30)

    worker = threading.Thread(target=generation)
    worker.start()
    try:
        assert inside.wait(30)
        with pytest.raises(ValueError, match="expected q_lens"):
            attention(*bad)
        seen.append(True)
    finally:
        done.set()
        worker.join(30)
    assert seen == [True]


def test_length_checks_false_keeps_the_metadata_checks():
    with bass.ops.length_checks(False), pytest.raises(TypeError, match="must be int32"):
        attention(*replace(ARGS, q_lens=q_lens.long()))


# --------------------------------------------------------------------------- kv_append errors

APPEND = append_args()


def replace_append(**changes):
    names = ("k_cache", "v_cache", "k_new", "v_new", "cache_lens", "new_lens")
    values = dict(zip(names, APPEND, strict=True))
    values.update(changes)
    return tuple(values[n] for n in names)


@pytest.mark.parametrize(
    "call", [torch.ops.bass.kv_append, bass.ops.kv_append], ids=["op", "wrapper"]
)
@pytest.mark.parametrize(
    ("changes", "error", "message"),
    [
        (
            {"k_cache": APPEND[0][0]},
            ValueError,
            r"k_cache must be 4-D \[B, Hkv, S, D\], got shape \[2, 6, 8\]",
        ),
        (
            {"k_new": APPEND[2].int()},
            TypeError,
            r"k_new must be float16, bfloat16, float32 or float64, got torch.int32",
        ),
        ({"v_cache": APPEND[1].double()}, ValueError, r"k_cache and v_cache must match"),
        (
            {"k_new": APPEND[2].half(), "v_new": APPEND[3].half()},
            TypeError,
            r"k_new and v_new must have the caches' dtype torch.float32, got torch.float16 "
            r"and torch.float16; convert them with .to\(torch.float32\) first",
        ),
        ({"v_new": APPEND[3].double()}, TypeError, r"got torch.float32 and torch.float64"),
        ({"v_new": APPEND[3][:, :, :1]}, ValueError, r"k_new and v_new must match"),
        (
            {"k_new": APPEND[2][:, :1], "v_new": APPEND[3][:, :1]},
            ValueError,
            r"new keys \[3, 1, 2, 8\] must be \[B=3, Hkv=2, T, D=8\]",
        ),
        (
            {"k_new": torch.zeros(B, HKV, S + 1, D), "v_new": torch.zeros(B, HKV, S + 1, D)},
            ValueError,
            r"cannot append T=7 tokens to a cache of S=6 slots",
        ),
        ({"new_lens": APPEND[5].long()}, TypeError, r"new_lens must be int32 \(got torch.int64\)"),
        (
            {"cache_lens": APPEND[4][:2]},
            ValueError,
            r"cache_lens must have shape \[B\] = \[3\], got \[2\]",
        ),
        (
            {"cache_lens": lens((0, -1, 4))},
            ValueError,
            r"row 1 has new_lens=1, cache_lens=-1; expected cache_lens\[b\] >= 0",
        ),
        (
            {"new_lens": lens((2, -1, 0))},
            ValueError,
            r"row 1 has new_lens=-1, cache_lens=3; expected new_lens\[b\] >= 0",
        ),
        (
            {"new_lens": lens((3, 0, 0))},
            ValueError,
            r"row 0 has new_lens=3, cache_lens=0; expected new_lens\[b\] <= T = 2",
        ),
        (
            {"cache_lens": lens((0, 3, 7))},
            ValueError,
            r"row 2 has new_lens=0, cache_lens=7; "
            r"expected cache_lens\[b\] \+ new_lens\[b\] <= S = 6: the cache is full",
        ),
        (
            {"cache_lens": lens((0, 6, 4))},
            ValueError,
            r"row 1 has new_lens=1, cache_lens=6; expected .* the cache is full; "
            r"allocate a larger one",
        ),
        (
            {"new_lens": APPEND[5].to("meta")},
            ValueError,
            r"all tensors must be on one device, .*new_lens on meta",
        ),
    ],
    ids=[
        "k_cache-rank-3",
        "k_new-int32",
        "v_cache-float64",
        "new-float16",
        "v_new-float64",
        "v_new-shape",
        "new-heads",
        "T-over-S",
        "new_lens-int64",
        "cache_lens-too-short",
        "cache_lens-negative",
        "new_lens-negative",
        "new_lens-over-T",
        "cache_lens-over-S",
        "append-past-S",
        "new_lens-on-meta",
    ],
)
def test_kv_append_rejects_invalid_inputs(changes, error, message, call):
    args = tuple(t.clone() if isinstance(t, torch.Tensor) else t for t in replace_append(**changes))
    before = [t.clone() for t in args[:2]] if args[0].device.type != "meta" else None
    with pytest.raises(error, match=message):
        call(*args)
    if before is not None:  # a rejected call writes nothing
        assert all(torch.equal(a, b) for a, b in zip(args[:2], before, strict=True))


def test_kv_append_wrapper_is_inference_only():
    k_cache, v_cache, k_new, v_new, cache_lens, new_lens = append_args()
    k_new.requires_grad_()
    with pytest.raises(
        RuntimeError, match=r"bass.kv_append is inference-only .* k_new requires grad"
    ):
        bass.ops.kv_append(k_cache, v_cache, k_new, v_new, cache_lens, new_lens)
    with torch.no_grad():
        bass.ops.kv_append(k_cache, v_cache, k_new, v_new, cache_lens, new_lens)
    assert torch.equal(k_cache[0, :, :2], k_new[0].detach())
