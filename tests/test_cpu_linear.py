"""bass.cpu_linear: the transposed GEMM layout computes F.linear's numbers, the plan routes
exactly the row counts it names, and generation through routed layers stays exact."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as st
from models import FAMILIES, tiny_lm

from bass import Generator, cpu_linear
from bass.config import ConfigError, load_config
from bass.cpu_linear import LinearPlan, calibrate, choose, install, routing, uninstall
from bass.testing import assert_greedy_equivalent

DTYPES = {torch.float32: 1e-5, torch.float64: 1e-12, torch.bfloat16: 2e-2}


@settings(deadline=None, max_examples=examples(40))
@given(
    lead=st.sampled_from([(), (1,), (3,), (1, 5), (2, 3)]),
    dims=st.tuples(st.integers(1, 40), st.integers(1, 40)),
    bias=st.booleans(),
    dtype=st.sampled_from(list(DTYPES)),
    strided=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_transposed_layout_computes_f_linear(lead, dims, bias, dtype, strided, seed):
    g = torch.Generator().manual_seed(seed)
    out_f, in_f = dims
    w = torch.randn(out_f, in_f, generator=g).to(dtype)
    b = torch.randn(out_f, generator=g).to(dtype) if bias else None
    x = torch.randn(*lead, 2 * in_f if strided else in_f, generator=g).to(dtype)
    if strided:  # a non-contiguous input (every other feature)
        x = x[..., ::2]
    want = F.linear(x, w, b)
    got = cpu_linear.transposed_linear(x, w, b)
    assert got.shape == want.shape and got.dtype == want.dtype and got.is_contiguous()
    tol = DTYPES[dtype] * max(1.0, in_f**0.5)
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)


def test_choose_keeps_the_transposed_layout_only_where_it_is_clearly_faster():
    timings = {2: (1.0, 0.5), 3: (1.0, 0.9), 4: (1.0, 0.91), 5: (1.0, 1.5)}
    assert choose(timings) == {2, 3}
    assert choose(timings, margin=1.0) == {2, 3, 4}
    assert choose({}) == frozenset()


def test_calibrate_measures_every_linear_shape_and_row_count():
    model = tiny_lm(dtype=torch.float32)
    plan = calibrate(model, rows=[1, 2, 5], rounds=1)
    shapes = {(m.weight.shape[0], m.weight.shape[1], m.weight.dtype) for m in _linears(model)}
    assert set(plan.transposed) == shapes == set(plan.timings)
    for shape, t in plan.timings.items():
        assert set(t) == {1, 2, 5}
        assert all(a > 0 and b > 0 for a, b in t.values())
        assert plan.transposed[shape] == choose(t)
    assert plan.describe().count("\n") == len(shapes) - 1
    with pytest.raises(ValueError, match="margin"):
        calibrate(model, margin=0.0)
    with pytest.raises(ValueError, match="rounds"):
        calibrate(model, rounds=0)


def _linears(model):
    return [m for m in model.modules() if isinstance(m, torch.nn.Linear)]


def _plan(model, rows) -> LinearPlan:
    shapes = {(m.weight.shape[0], m.weight.shape[1], m.weight.dtype) for m in _linears(model)}
    return LinearPlan({s: frozenset(rows) for s in shapes})


def test_install_routes_exactly_the_planned_row_counts(monkeypatch):
    model = tiny_lm(dtype=torch.float64)
    ids = torch.randint(0, 64, (1, 12))
    with torch.inference_mode():
        want = {n: model(ids[:, :n]).logits for n in (1, 2, 3, 7)}
    n_layers = len(_linears(model))
    assert install(model, _plan(model, {2, 3})) == n_layers
    assert routing(model) is not None
    calls = []
    real = cpu_linear.transposed_linear

    def spy(x, w, b):
        calls.append(x.numel() // x.shape[-1])
        return real(x, w, b)

    monkeypatch.setattr(cpu_linear, "transposed_linear", spy)
    with torch.inference_mode():
        for n, logits in want.items():
            calls.clear()
            with cpu_linear.active():  # as inside bass's passes
                got = model(ids[:, :n]).logits
            torch.testing.assert_close(got, logits, rtol=1e-10, atol=1e-10)
            assert calls == ([n] * n_layers if n in (2, 3) else [])
            model(ids[:, :n])  # the model's other callers: F.linear, untouched
            assert calls == ([n] * n_layers if n in (2, 3) else [])
    uninstall(model)
    assert routing(model) is None
    assert not any("forward" in m.__dict__ for m in _linears(model))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_routed_models_of_every_family_compute_the_same_logits(family):
    """Qwen2's attention projections have biases: the addmm path inside a real model."""
    model = tiny_lm(family, dtype=torch.float64)
    ids = torch.randint(0, 64, (1, 6))
    install(model, _plan(model, range(1, 17)))
    with torch.inference_mode():
        for n in (1, 2, 5):
            want = model(ids[:, :n]).logits
            with cpu_linear.active():
                got = model(ids[:, :n]).logits
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_install_skips_subclasses_with_their_own_forward_and_restores_instance_forwards():
    class Scaled(torch.nn.Linear):
        def forward(self, x):
            return 2 * super().forward(x)

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), Scaled(4, 4))
    own = model[0].forward
    model[0].forward = own  # an instance forward the caller set (e.g. a hook library's)
    assert install(model, _plan(model, {2})) == 1  # the subclass keeps its own
    assert model[0].forward is not own
    uninstall(model)
    assert model[0].forward is own


def test_the_compiled_form_is_one_graph_for_every_row_count(monkeypatch):
    from torch._dynamo.testing import CompileCounter

    layer = torch.nn.Linear(8, 6)
    install(layer, _plan(layer, {2, 3}))
    calls = []
    real = cpu_linear.transposed_linear
    monkeypatch.setattr(cpu_linear, "transposed_linear", lambda *a: calls.append(1) or real(*a))
    torch._dynamo.reset()
    counter = CompileCounter()
    compiled = torch.compile(layer, backend=counter, fullgraph=True, dynamic=True)
    with cpu_linear.active():
        for m in (2, 5, 3, 7):
            x = torch.randn(1, m, 8)
            torch.testing.assert_close(compiled(x), F.linear(x, layer.weight, layer.bias))
    assert counter.frame_count == 1  # the row count is read inside the op, not guarded on
    assert len(calls) == 2  # rows 2 and 3 went through the transposed layout


def test_cpu_linear_op_contract():
    x, w, b = torch.randn(3, 8), torch.randn(6, 8), torch.randn(6)
    for bias in (b, None):
        for rows in ([3], [1, 2], [], [3, 200]):
            mask = cpu_linear.row_mask(rows)
            torch.library.opcheck(torch.ops.bass.cpu_linear.default, (x, w, bias, mask))
            torch.testing.assert_close(
                torch.ops.bass.cpu_linear(x, w, bias, mask), F.linear(x, w, bias)
            )


@pytest.mark.parametrize("draft", [None, "ngram", "model"])
def test_generation_through_routed_layers_is_exact(draft):
    main = tiny_lm(dtype=torch.float32)
    install(main, _plan(main, range(1, 64)))  # every pass through the transposed layout
    d = None
    if draft == "model":
        d = tiny_lm(dtype=torch.float32, seed=1)
        install(d, _plan(d, range(1, 64)))
    elif draft == "ngram":
        d = "ngram"
    gen = Generator(main, d, policy="constant", policy_options={"k": 3})
    prompts = [[1, 2, 3, 1, 2, 3, 1, 2], [5, 6, 7], [9, 9, 9, 9, 9]]
    assert_greedy_equivalent(gen, prompts, max_new_tokens=12)


def test_generator_calibrates_once_per_model_and_torch_mode_does_not_route(monkeypatch):
    main = tiny_lm(dtype=torch.float32)
    gen = Generator(main, "ngram")
    plan = routing(main)
    assert plan is not None and gen.linear_plans == [plan]
    Generator(main, None)
    assert routing(main) is plan  # kept on the model: not measured again
    install(main, _plan(main, range(1, 64)))  # every row count routed
    calls = []
    real = cpu_linear.transposed_linear
    monkeypatch.setattr(cpu_linear, "transposed_linear", lambda *a: calls.append(1) or real(*a))
    Generator(main, None, cpu_linear="torch").generate([[1, 2, 3]], max_new_tokens=3)
    assert not calls and routing(main) is not None  # not routed; the model keeps its plan
    Generator(main, None).generate([[1, 2, 3]], max_new_tokens=3)
    assert calls
    assert Generator(main, None, compile=True).linear_plans == [routing(main)]


def test_bad_cpu_linear_values_are_refused(tmp_path):
    with pytest.raises(ValueError, match="cpu_linear must be one of 'auto', 'torch'"):
        Generator(tiny_lm(), None, cpu_linear="fast")
    cfg = tmp_path / "bass.toml"
    cfg.write_text('[model]\ncpu_linear = "fast"\n')
    with pytest.raises(ConfigError, match="cpu_linear"):
        load_config(cfg)
    cfg.write_text('[model]\ncpu_linear = "torch"\n')
    assert load_config(cfg).generator_kwargs()["cpu_linear"] == "torch"
