"""The packed ops refuse bad input with errors that say what was wrong and what to do,
and the family's registry (unknown names, devices, ``auto``, replacing an entry)."""

from __future__ import annotations

import dataclasses
import math
import re

import pytest
import torch
from test_ops_packed import APPEND_EDGE, EDGE

import bass
from bass.ops import plan

# --------------------------------------------------------------------------- errors

ARGS = EDGE["worked_example"].tensors(torch.float32)  # N = 8, B = 3, S = 8, Hq = 4
q, k, v, cu, kv, SCALE = ARGS


def lens(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


def replace(**changes):
    names = ("q", "k", "v", "cu_q_lens", "kv_lens", "scale")
    values = dict(zip(names, ARGS, strict=True)) | changes
    return tuple(values[n] for n in names)


ATTENTION_ERRORS = {
    "q-rank-3": ({"q": q[0]}, ValueError, r"q must be 4-D \[1, Hq, N, D\] \(packed\)"),
    "q-batch-2": (
        {"q": q.expand(2, -1, -1, -1)},
        ValueError,
        r"packed q must be \[1, Hq, N, D\] .* got \[2, 4, 8, 4\]; padded .* ragged_attention",
    ),
    "k-int": ({"k": k.int(), "v": v.int()}, TypeError, r"k must be float16, .* torch.int32"),
    "dtype-mismatch": ({"v": v.double()}, TypeError, r"q, k, v must share a dtype"),
    "k-v-shape": ({"v": v[:, :, :-1]}, ValueError, r"k and v must have the same shape"),
    "head-dim": ({"k": k[..., :2], "v": v[..., :2]}, ValueError, r"q has head dim 4 but k/v"),
    "heads": (
        {"q": torch.zeros(1, 3, 8, 4)},
        ValueError,
        r"query heads \(3\) must be a positive multiple of KV heads \(2\)",
    ),
    "cu-int64": (
        {"cu_q_lens": cu.long()},
        TypeError,
        r"cu_q_lens must be int32 \(got torch.int64\); convert with cu_q_lens.to\(torch.int32\)",
    ),
    "cu-shape-B": (
        {"cu_q_lens": cu[1:]},
        ValueError,
        r"cu_q_lens must have shape \[B\+1\] = \[4\] .* got \[3\]",
    ),
    "kv-shape": ({"kv_lens": kv[:2]}, ValueError, r"kv_lens must have shape \[B\] = \[3\]"),
    "cu-list": (
        {"cu_q_lens": [0, 3, 3, 5]},
        RuntimeError,
        r"Expected a value of type 'Tensor' for argument 'cu_q_lens'",
    ),
    "cu-on-meta": ({"cu_q_lens": cu.to("meta")}, ValueError, r"one device, .*cu_q_lens on meta"),
    "scale-nan": (
        {"scale": math.nan},
        ValueError,
        r"scale must be a finite float within float32's range, got nan",
    ),
    "scale-past-float32": ({"scale": 1e39}, ValueError, r"float32's range, got 1e\+39"),
    "cu0-not-zero": (
        {"cu_q_lens": lens((1, 3, 3, 5))},
        ValueError,
        r"cu_q_lens\[0\] must be 0 .* got 1",
    ),
    "cu-decreasing": (
        {"cu_q_lens": lens((0, 3, 2, 5))},
        ValueError,
        r"non-decreasing, but cu_q_lens\[2\] = 2 < cu_q_lens\[1\] = 3",
    ),
    "cu-past-N": (
        {"cu_q_lens": lens((0, 3, 3, 9)), "kv_lens": lens((7, 4, 6))},
        ValueError,
        r"cu_q_lens\[B\] = 9 tokens but the pass has N = 8 \(q.shape\[2\]\)",
    ),
    "kv-over-S": (
        {"kv_lens": lens((9, 4, 2))},
        ValueError,
        r"row 0 has q_len=3 \(cu_q_lens\[0:2\] = \[0, 3\]\), kv_lens=9; expected kv_lens\[b\] "
        r"<= S = 8",
    ),
    "q_len-over-kv": (
        {"kv_lens": lens((7, 4, 1))},
        ValueError,
        r"row 2 has q_len=2 .* kv_lens=1; expected q_len\[b\] <= kv_lens\[b\]",
    ),
}


@pytest.mark.parametrize("name", list(ATTENTION_ERRORS))
def test_attention_rejects_invalid_inputs(name):
    changes, error, message = ATTENTION_ERRORS[name]
    with pytest.raises(error, match=message):
        torch.ops.bass.ragged_attention_packed(*replace(**changes))


def test_a_planned_set_of_lengths_still_checks_scale_and_lengths():
    """The CPU kernel keeps a plan per set of lengths; every call is still checked."""
    torch.ops.bass.ragged_attention_packed(*ARGS)  # the signature is now known
    for name in ("scale-nan", "q_len-over-kv", "kv-over-S"):
        changes, error, message = ATTENTION_ERRORS[name]
        with pytest.raises(error, match=message):
            torch.ops.bass.ragged_attention_packed(*replace(**changes))


def test_length_checks_false_skips_only_the_range_checks():
    bad = replace(kv_lens=lens((7, 4, 1)))
    with bass.ops.length_checks(False):
        torch.ops.bass.ragged_attention_packed(*bad)  # no host read, no error
        with pytest.raises(TypeError, match="cu_q_lens must be int32"):
            torch.ops.bass.ragged_attention_packed(*replace(cu_q_lens=cu.long()))
    with pytest.raises(ValueError, match=r"expected q_len\[b\] <= kv_lens\[b\]"):
        torch.ops.bass.ragged_attention_packed(*bad)


def test_unknown_and_misplaced_implementations():
    with pytest.raises(ValueError, match=r"unknown ragged attention implementation 'x'; "
                       r"registered: auto, reference, sdpa, flex, fused, pad, split"):  # fmt: skip
        torch.ops.bass.ragged_attention_packed(*ARGS, "x")
    with pytest.raises(ValueError, match=r"'fused' runs on cuda, not cpu; use impl='auto'"):
        torch.ops.bass.ragged_attention_packed(*ARGS, "fused")


def test_registry_and_auto():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert plan.resolve("auto", cpu, "eager")[0].name == "sdpa"
    fused = plan.IMPLEMENTATIONS["fused"]
    # the CUDA default: one launch per layer, every kind (fused in eager passes, where it
    # can run here; flex traced into graphs)
    picked, why = plan.resolve("auto", cuda, "eager")
    if fused.unavailable() is None:
        assert picked.name == "fused" and picked.single_launch
    else:
        assert picked.name == "reference" and why.startswith("fused unavailable")
    for kind in ("compiled", "graphs"):
        picked = plan.resolve("auto", cuda, kind)[0]
        assert picked.name == "flex" and picked.single_launch and picked.traceable
    assert fused.devices == ("cuda",) and fused.single_launch
    assert set(bass.ops.implementations("cpu")) == {"reference", "sdpa", "flex"}
    with pytest.raises(ValueError, match="'auto' is reserved"):
        bass.ops.register(dataclasses.replace(fused, name="auto"))


def test_auto_falls_back_to_the_reference_where_its_pick_cannot_run(monkeypatch):
    flex = plan.IMPLEMENTATIONS["flex"]
    monkeypatch.setitem(
        plan.IMPLEMENTATIONS, "flex", dataclasses.replace(flex, unavailable=lambda: "gone")
    )
    impl, why = plan.resolve("auto", torch.device("cuda"), "compiled")
    assert impl.name == "reference" and why == "flex unavailable (gone); the reference"
    monkeypatch.setenv(plan.AUTO_OVERRIDE, "sdpa")  # a suite run through one implementation
    assert plan.resolve("auto", torch.device("cuda"), "eager")[0].name == "sdpa"
    assert plan.auto_pick("cuda", "eager") == ("sdpa", f"${plan.AUTO_OVERRIDE}")
    monkeypatch.setenv(plan.AUTO_OVERRIDE, "nope")
    with pytest.raises(ValueError, match=r"BASS_AUTO_ATTENTION='nope' names no ragged attention"):
        plan.resolve("auto", torch.device("cpu"))


def test_one_tensor_as_both_caches_a_cache_needing_grad_and_head_dim_0_are_named():
    cache, new = torch.zeros(1, 1, 4, 2), torch.ones(1, 1, 2, 2)
    lens, cu = torch.tensor([0], dtype=torch.int32), torch.tensor([0, 2], dtype=torch.int32)
    for other in (cache, cache.view(1, 1, 4, 2)):  # one tensor, or a view from its start
        with pytest.raises(ValueError, match="k_cache and v_cache are the same memory"):
            torch.ops.bass.kv_append_packed(cache, other, new, new, cu, lens)
    expanded = torch.zeros(1, 1, 4, 2).expand(2, 1, 4, 2)  # row 1 is row 0's memory
    cu2 = torch.tensor([0, 1, 2], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"v_cache has stride 0 .* \(an expanded tensor\)"):
        torch.ops.bass.kv_append_packed(
            torch.zeros(2, 1, 4, 2), expanded, new, new, cu2, lens.repeat(2)
        )
    fused = torch.zeros(1, 1, 4, 4)  # keys and values side by side in one tensor: allowed
    torch.ops.bass.kv_append_packed(fused[..., :2], fused[..., 2:], new, 2 * new, cu, lens)
    assert fused[0, 0, :2].tolist() == [[1.0, 1.0, 2.0, 2.0]] * 2
    grad = torch.zeros(1, 1, 4, 2, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"inference-only .* but k_cache requires grad"):
        torch.ops.bass.kv_append_packed(grad, cache.clone(), new, new, cu, lens)
    empty = torch.zeros(1, 1, 4, 0)
    with pytest.raises(ValueError, match="the head dim D must be >= 1"):
        torch.ops.bass.ragged_attention_packed(
            torch.zeros(1, 1, 2, 0), empty, empty, cu, lens + 2, 1.0, "reference"
        )


def test_the_override_applies_to_an_op_call_at_lengths_seen_before(monkeypatch):
    """An op's plan is cached per set of lengths: "auto" is resolved before that cache, so
    $BASS_AUTO_ATTENTION set later (a suite per implementation) still decides."""
    q = torch.randn(1, 2, 3, 8)
    kv = torch.randn(2, 1, 4, 8)
    cu, lens = torch.tensor([0, 2, 3], dtype=torch.int32), torch.tensor([3, 4], dtype=torch.int32)
    torch.ops.bass.ragged_attention_packed(q, kv, kv, cu, lens, 0.5)  # auto's own pick
    real, picked = plan._host_plan, []
    monkeypatch.setattr(plan, "_host_plan", lambda impl, *a: picked.append(impl) or real(impl, *a))
    for name in ("reference", "sdpa"):
        monkeypatch.setenv(plan.AUTO_OVERRIDE, name)
        torch.ops.bass.ragged_attention_packed(q, kv, kv, cu, lens, 0.5)
    assert picked == ["reference", "sdpa"]
    monkeypatch.setenv(plan.AUTO_OVERRIDE, "nope")
    with pytest.raises(ValueError, match=r"BASS_AUTO_ATTENTION='nope' names no ragged attention"):
        torch.ops.bass.ragged_attention_packed(q, kv, kv, cu, lens, 0.5)


def test_a_registered_implementation_runs_by_name_and_replacing_it_takes_effect(monkeypatch):
    monkeypatch.setattr(plan, "IMPLEMENTATIONS", dict(plan.IMPLEMENTATIONS))
    calls = []

    def spy(tag):
        def run(state, q, k, v, scale):
            calls.append(tag)
            return plan.reference.attention(q, k, v, *state, scale)

        return dataclasses.replace(plan.IMPLEMENTATIONS["reference"], name="spy", run=run)

    bass.ops.register(spy("first"))
    expected = torch.ops.bass.ragged_attention_packed(*ARGS, "reference")
    assert torch.equal(torch.ops.bass.ragged_attention_packed(*ARGS, "spy"), expected)
    bass.ops.register(spy("second"))  # the same lengths: a plan made for "first" is gone
    torch.ops.bass.ragged_attention_packed(*ARGS, "spy")
    assert calls == ["first", "second"]


BAD_OUTPUTS = {
    "float64": (lambda out: out.double(), r"torch.float64 \[1, 4, 5, 8\]"),
    "shape": (lambda out: out[:, :, :-1], r"torch.float32 \[1, 4, 4, 8\]"),
    "head-major": (lambda out: out.contiguous(), r"torch.float32 \[1, 4, 5, 8\] on cpu, not token"),
    "none": (lambda out: None, r"a NoneType"),
}


@pytest.mark.parametrize("bad", list(BAD_OUTPUTS))
def test_a_registered_implementations_output_is_checked_naming_it(bad, monkeypatch):
    """What a registered ``run`` returns must be the contract's output (q's shape, dtype and
    device, token-major): anything else is named at the op, not a failure layers later."""
    monkeypatch.setattr(plan, "IMPLEMENTATIONS", dict(plan.IMPLEMENTATIONS))
    change, said = BAD_OUTPUTS[bad]

    def run(state, q, k, v, scale):
        return change(plan.reference.attention(q, k, v, *state, scale))

    bass.ops.register(dataclasses.replace(plan.IMPLEMENTATIONS["reference"], name="mine", run=run))
    with pytest.raises(
        bass.errors.PluginOutputError, match=r"implementation 'mine' returned " + said
    ):
        torch.ops.bass.ragged_attention_packed(
            torch.randn(1, 5, 4, 8).transpose(1, 2), *[torch.zeros(2, 2, 6, 8)] * 2,
            torch.tensor([0, 2, 5], dtype=torch.int32), torch.tensor([4, 6], dtype=torch.int32),
            0.5, "mine",
        )  # fmt: skip


def test_a_registered_implementation_that_cannot_be_traced_is_named_by_a_compile_error(
    monkeypatch,
):
    """A user's implementation registered with the defaults (``traceable=True``) whose
    ``run`` reads lengths on the host cannot be traced: the compile error names it and
    ``traceable=False`` (it blamed the model alone); registered so, compiled passes run."""
    from models import tiny_lm

    monkeypatch.setattr(plan, "IMPLEMENTATIONS", dict(plan.IMPLEMENTATIONS))
    reference = plan.IMPLEMENTATIONS["reference"]

    def run(state, q, k, v, scale):
        assert int(state[1].max()) >= 0  # a host read: data-dependent under tracing
        return plan.reference.attention(q, k, v, *state, scale)

    def eager_backend(gm, example_inputs):
        return gm.forward

    model, prompts = tiny_lm(), [[1, 2, 3], [4, 5]]
    want = bass.Generator(model, None).generate(prompts, max_new_tokens=4, do_sample=False)
    bass.ops.register(dataclasses.replace(reference, name="mine", run=run))
    gen = bass.Generator(model, None, attention="mine", compile=eager_backend)
    said = r"implementation 'mine' was traced into the graph \(if the error is in it: register "
    said += r"it with traceable=False"
    with pytest.raises(bass.errors.UnsupportedModelError, match=said):
        gen.generate(prompts, max_new_tokens=4, do_sample=False)
    bass.ops.register(dataclasses.replace(reference, name="mine", run=run, traceable=False))
    gen = bass.Generator(model, None, attention="mine", compile=eager_backend)
    got = gen.generate(prompts, max_new_tokens=4, do_sample=False)
    assert got.sequences == want.sequences


@pytest.mark.parametrize("names", [("q",), ("k", "v")], ids="+".join)
def test_attention_is_inference_only(names):
    args = dict(zip(("q", "k", "v"), ARGS[:3]))
    grads = {n: args[n].detach().clone().requires_grad_() for n in names}
    message = (
        "bass.ragged_attention_packed is inference-only and has no backward, but "
        f"{', '.join(names)} require{'s' if len(names) == 1 else ''} grad"
    )
    with pytest.raises(RuntimeError, match=re.escape(message)):
        torch.ops.bass.ragged_attention_packed(*replace(**grads))
    with torch.inference_mode():
        out = torch.ops.bass.ragged_attention_packed(*replace(**grads))
    assert torch.equal(out, torch.ops.bass.ragged_attention_packed(*ARGS))


APPEND = APPEND_EDGE[0].tensors(torch.float32)  # B = 3, S = 8, N = 8


def replace_append(**changes):
    names = ("k_cache", "v_cache", "k_new", "v_new", "cu_q_lens", "cache_lens")
    values = dict(zip(names, APPEND, strict=True)) | changes
    return tuple(t.clone() if isinstance(t, torch.Tensor) else t for t in map(values.get, names))


APPEND_ERRORS = {
    "cache-rank": ({"k_cache": APPEND[0][0]}, ValueError, r"k_cache must be 4-D \[B, Hkv, S, D\]"),
    "new-batch-3": (
        {"k_new": APPEND[0], "v_new": APPEND[1]},
        ValueError,
        r"packed new keys \[3, 2, 8, 4\] must be \[1, Hkv=2, N, D=4\]",
    ),
    "caches-differ": ({"v_cache": APPEND[1].double()}, ValueError, r"k_cache and v_cache must"),
    "new-bfloat16": (
        {"k_new": APPEND[2].bfloat16(), "v_new": APPEND[3].bfloat16()},
        TypeError,
        r"k_new and v_new must have the caches' dtype torch.float32, got torch.bfloat16",
    ),
    "cu-int64": ({"cu_q_lens": APPEND[4].long()}, TypeError, r"cu_q_lens must be int32"),
    "cache_lens-shape": (
        {"cache_lens": APPEND[5][:2]},
        ValueError,
        r"cache_lens must have shape \[B\] = \[3\]",
    ),
    "cache_lens-negative": (
        {"cache_lens": lens((4, -1, 0))},
        ValueError,
        r"row 1 has q_len=0 \(cu_q_lens\[1:3\] = \[3, 3\]\), cache_lens=-1; expected "
        r"cache_lens\[b\] >= 0",
    ),
    "cache-full": (
        {"cache_lens": lens((6, 4, 0))},
        ValueError,
        r"row 0 has q_len=3 .* cache_lens=6; expected cache_lens\[b\] \+ q_len\[b\] <= S = 8: "
        r"the cache is full; allocate a larger one",
    ),
    "cu-past-N": (
        {"cu_q_lens": lens((0, 3, 3, 9))},
        ValueError,
        r"kv_append_packed: cu_q_lens\[B\] = 9 tokens but the pass has N = 8 \(k_new",
    ),
}


@pytest.mark.parametrize("call", [torch.ops.bass.kv_append_packed, bass.ops.kv_append_packed])
@pytest.mark.parametrize("name", list(APPEND_ERRORS))
def test_append_rejects_invalid_inputs_and_writes_nothing(name, call):
    changes, error, message = APPEND_ERRORS[name]
    args = replace_append(**changes)
    before = [t.clone() for t in args[:2]]
    with pytest.raises(error, match=message):
        call(*args)
    assert all(torch.equal(a, b) for a, b in zip(args[:2], before))


def test_append_is_inference_only():
    args = list(replace_append())
    args[2] = args[2].requires_grad_()
    with pytest.raises(RuntimeError, match=r"bass.kv_append_packed is inference-only"):
        torch.ops.bass.kv_append_packed(*args)
    with torch.no_grad():
        torch.ops.bass.kv_append_packed(*args)


def test_fakes_report_shapes_and_token_major_strides():
    meta = [t.to("meta") for t in ARGS[:5]]
    out = torch.ops.bass.ragged_attention_packed(*meta, SCALE)
    assert out.device.type == "meta" and out.shape == q.shape
    assert out.stride() == torch.ops.bass.ragged_attention_packed(*ARGS).stride()
    torch.ops.bass.kv_append_packed(*(t.to("meta") for t in APPEND))  # returns nothing


def test_docstrings_reach_torch_ops():
    for name in ("ragged_attention_packed", "kv_append_packed"):
        wrapper = getattr(bass.ops, name)
        assert getattr(torch.ops.bass, name).__doc__ == wrapper.__doc__
        assert getattr(torch.ops.bass, name).default.__doc__ == wrapper.__doc__
    doc = torch.ops.bass.ragged_attention_packed.__doc__
    for phrase in ("kv_lens[b] - q_len_b + i", "output 0", "[1, Hq, N, D]", "token-major"):
        assert phrase in doc
    assert "cache_lens[b] + j -" in torch.ops.bass.kv_append_packed.__doc__


@pytest.mark.parametrize("op", ["attention", "append"])
def test_a_compiled_call_is_inference_only_too(op):
    """``torch.compile`` traces the ops on fake tensors and runs the graph with grad off
    (``aot_eager`` here, as inductor), so the device kernels' check never sees grad: the ops'
    Autograd kernel refuses inputs that require grad while tracing, as in eager calls, and a
    cache that requires grad is left as it was."""
    torch._dynamo.reset()
    if op == "attention":
        args = replace(q=ARGS[0].detach().clone().requires_grad_())
        fn = torch.ops.bass.ragged_attention_packed
        name = "bass.ragged_attention_packed is inference-only .* but q requires grad"
    else:
        args = list(replace_append())
        args[0] = args[0].clone().requires_grad_()
        fn = torch.ops.bass.kv_append_packed
        name = "bass.kv_append_packed is inference-only .* but k_cache requires grad"
    before = args[0].detach().clone()
    compiled = torch.compile(lambda *a: fn(*a), fullgraph=True, backend="aot_eager")
    with pytest.raises(RuntimeError, match=name):
        compiled(*args)
    assert torch.equal(args[0].detach(), before)
    with torch.no_grad():
        compiled(*args)  # and runs where grad is off
