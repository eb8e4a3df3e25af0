"""bass.cpu_linear: the transposed and packed GEMM layouts compute F.linear's numbers, the
plan routes exactly the row counts it names, packed copies follow their weights, and
generation through routed layers stays exact."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from models import FAMILIES, perturbed, tiny_lm
from profiles import examples

from bass import Generator, backends, cpu_linear
from bass.config import ConfigError, load_config
from bass.cpu_linear import LAYOUTS, LinearPlan, calibrate, choose, install, routing, uninstall
from bass.testing import assert_greedy_equivalent

DTYPES = {torch.float32: 1e-5, torch.float64: 1e-12, torch.bfloat16: 2e-2}


def _can_pack(dtype) -> bool:
    try:
        cpu_linear.pack(torch.ones(2, 2, dtype=dtype))
        return True
    except (RuntimeError, AttributeError):
        return False


needs_packing = pytest.mark.skipif(
    not _can_pack(torch.float32), reason="this torch build has no oneDNN packed linear"
)


def _layout_case(lead, dims, bias, dtype, strided, seed):
    g = torch.Generator().manual_seed(seed)
    out_f, in_f = dims
    w = torch.randn(out_f, in_f, generator=g).to(dtype)
    b = torch.randn(out_f, generator=g).to(dtype) if bias else None
    x = torch.randn(*lead, 2 * in_f if strided else in_f, generator=g).to(dtype)
    if strided:  # a non-contiguous input (every other feature)
        x = x[..., ::2]
    return x, w, b, DTYPES[dtype] * max(1.0, in_f**0.5)


_CASES = dict(
    lead=st.sampled_from([(), (1,), (3,), (1, 5), (2, 3), (1, 20)]),
    dims=st.tuples(st.integers(1, 40), st.integers(1, 40)),
    bias=st.booleans(),
    strided=st.booleans(),
    seed=st.integers(0, 2**16),
)


@settings(deadline=None, max_examples=examples(40))
@given(dtype=st.sampled_from(list(DTYPES)), **_CASES)
def test_transposed_layout_computes_f_linear(lead, dims, bias, dtype, strided, seed):
    x, w, b, tol = _layout_case(lead, dims, bias, dtype, strided, seed)
    want = F.linear(x, w, b)
    got = cpu_linear.transposed_linear(x, w, b)
    assert got.shape == want.shape and got.dtype == want.dtype and got.is_contiguous()
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)


@needs_packing
@settings(deadline=None, max_examples=examples(40))
@given(
    dtype=st.sampled_from([d for d in (torch.float32, torch.bfloat16) if _can_pack(d)]), **_CASES
)
def test_packed_layout_computes_f_linear(lead, dims, bias, dtype, strided, seed):
    x, w, b, tol = _layout_case(lead, dims, bias, dtype, strided, seed)
    want = F.linear(x, w, b)
    got = cpu_linear.packed_linear(x, cpu_linear.pack(w), b)
    assert got.shape == want.shape and got.dtype == want.dtype
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)


def test_choose_keeps_another_layout_only_where_it_is_clearly_faster():
    assert choose({"torch": 1.0, "transposed": 0.5, "packed": 0.6}) == "transposed"
    assert choose({"torch": 1.0, "transposed": 0.7, "packed": 0.6}) == "packed"
    assert choose({"torch": 1.0, "transposed": 0.91}) == "torch"
    assert choose({"torch": 1.0, "transposed": 0.91}, margin=1.0) == "transposed"
    assert choose({"torch": 1.0}) == "torch"


def test_calibrate_measures_every_linear_shape_and_row_count():
    model = tiny_lm(dtype=torch.float32)
    plan = calibrate(model, rows=[1, 2, 5], above=[3, 9], rounds=1)
    shapes = {(m.weight.shape[0], m.weight.shape[1], m.weight.dtype) for m in _linears(model)}
    assert set(plan.timings) == shapes and plan.last == 5
    packs = _can_pack(torch.float32)
    for shape, t in plan.timings.items():
        assert set(t) == {1, 2, 5, 9}  # 3 is not past the calibrated counts
        for m, by in t.items():
            assert set(by) == set(LAYOUTS if packs else LAYOUTS[:2])
            assert all(s > 0 for s in by.values())
            assert plan.layout(shape, m) == choose(by)
        assert plan.layout(shape, 3) == "torch"  # inside the calibrated range, not measured
        assert plan.layout(shape, 700) == choose(t[9])
    assert plan.describe().count("\n") == len(shapes) - 1
    unpacked = calibrate(model, rows=[1, 2], rounds=1, packed=False)
    assert all(set(by) == set(LAYOUTS[:2]) for t in unpacked.timings.values() for by in t.values())
    assert all(not unpacked.packs(s) for s in shapes)
    assert all(not plan.without_packed().packs(s) for s in shapes)
    with pytest.raises(ValueError, match="margin"):
        calibrate(model, margin=0.0)
    with pytest.raises(ValueError, match="rounds"):
        calibrate(model, rounds=0)


def test_float64_weights_are_never_packed():
    """oneDNN has no float64 product: calibration leaves that layout out."""
    plan = calibrate(tiny_lm(dtype=torch.float64), rows=[1, 4], rounds=1)
    assert all("packed" not in by for t in plan.timings.values() for by in t.values())


def _linears(model):
    return [m for m in model.modules() if isinstance(m, torch.nn.Linear)]


def _plan(model, rows, layout="transposed", above=None) -> LinearPlan:
    shapes = {(m.weight.shape[0], m.weight.shape[1], m.weight.dtype) for m in _linears(model)}
    return LinearPlan(
        {s: {m: layout for m in rows} for s in shapes},
        {s: above for s in shapes} if above else {},
    )


class _Spy:
    """Counts the rows of every call that took the transposed or the packed layout."""

    def __init__(self, monkeypatch):
        self.calls = []
        for name in ("transposed_linear", "packed_linear"):
            real = getattr(cpu_linear, name)
            monkeypatch.setattr(cpu_linear, name, self._wrap(name, real))

    def _wrap(self, name, real):
        def spy(x, w, b):
            self.calls.append((name.split("_")[0], x.numel() // x.shape[-1]))
            return real(x, w, b)

        return spy


def test_install_routes_exactly_the_planned_row_counts(monkeypatch):
    model = tiny_lm(dtype=torch.float64)
    ids = torch.randint(0, 64, (1, 40))
    with torch.inference_mode():
        want = {n: model(ids[:, :n]).logits for n in (1, 2, 3, 7, 17, 33)}
    n_layers = len(_linears(model))
    assert install(model, _plan(model, {2, 3}, above="transposed")) == n_layers
    assert routing(model) is not None
    spy = _Spy(monkeypatch)
    with torch.inference_mode():
        for n, logits in want.items():
            spy.calls.clear()
            with cpu_linear.active():  # as inside bass's passes
                got = model(ids[:, :n]).logits
            torch.testing.assert_close(got, logits, rtol=1e-10, atol=1e-10)
            routed = n in (2, 3) or n > 16  # 16: the plan's last calibrated count
            assert spy.calls == ([("transposed", n)] * n_layers if routed else [])
            model(ids[:, :n])  # the model's other callers: F.linear, untouched
            assert spy.calls == ([("transposed", n)] * n_layers if routed else [])
    uninstall(model)
    assert routing(model) is None
    assert not any("forward" in m.__dict__ for m in _linears(model))


@settings(deadline=None, max_examples=examples(30))
@given(
    rows=st.dictionaries(st.integers(1, 16), st.sampled_from(LAYOUTS), max_size=16),
    above=st.sampled_from(LAYOUTS),
    m=st.integers(1, 80),
)
def test_the_op_takes_the_layout_the_plan_names_for_every_row_count(rows, above, m):
    layer = torch.nn.Linear(8, 6)
    shape = (6, 8, torch.float32)
    plan = LinearPlan({shape: rows}, {shape: above})
    code = plan.code(shape)
    try:
        with pytest.MonkeyPatch.context() as mp:  # (hypothesis: no function-scoped fixture)
            spy = _Spy(mp)
            install(layer, plan)
            x = torch.randn(m, 8)
            with torch.inference_mode(), cpu_linear.active():
                torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias))
        handle = layer.__dict__.get(cpu_linear._HANDLE, -1)
        want = plan.layout(shape, m)
        if want == "packed" and not _can_pack(torch.float32):
            want = "torch"
        assert spy.calls == ([] if want == "torch" else [(want, m)])
        assert (code >> (2 * m) & 3 if m <= 30 else code & 3) == LAYOUTS.index(
            plan.layout(shape, m)
        )
        assert (handle >= 0) == (plan.packs(shape) and _can_pack(torch.float32))
    finally:
        uninstall(layer)


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


@needs_packing
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_packed_models_of_every_family_compute_the_same_logits(family):
    model = tiny_lm(family, dtype=torch.float32)
    ids = torch.randint(0, 64, (1, 40))
    install(model, _plan(model, range(1, 17), "packed", above="packed"))
    assert cpu_linear.packed_bytes(model) == sum(4 * m.weight.numel() for m in _linears(model))
    with torch.inference_mode():
        for n in (1, 3, 8, 40):
            want = model(ids[:, :n]).logits
            with cpu_linear.active():
                got = model(ids[:, :n]).logits
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    uninstall(model)
    assert cpu_linear.packed_bytes(model) == 0


@needs_packing
def test_copies_that_could_not_be_packed_are_not_counted():
    """A model cast to float64 after its copies were made: oneDNN packs none (F.linear
    runs), and packed_bytes counted 10 MiB of copies that did not exist."""
    model = tiny_lm(dtype=torch.float32)
    install(model, _plan(model, range(1, 17), "packed", above="packed"))
    assert cpu_linear.packed_bytes(model) > 0
    model.to(torch.float64)
    assert cpu_linear.refresh(model) > 0 and cpu_linear.packed_bytes(model) == 0
    uninstall(model)


@needs_packing
def test_a_model_given_as_its_own_draft_counts_its_copies_once():
    """``Generator(model, model)``: one set of copies, reported (and checked) once."""
    model = tiny_lm(dtype=torch.float32)
    install(model, _plan(model, range(1, 17), "packed", above="packed"))
    backend = backends.CPUBackend()
    backend.chosen = "auto"  # as prepare() leaves it when it routes
    backend.refresh([model, model])
    assert backend.packed_bytes == cpu_linear.packed_bytes(model) > 0
    uninstall(model)


@needs_packing
def test_packed_copies_follow_their_weights_and_are_freed():
    layer = torch.nn.Linear(8, 6)
    twin = torch.nn.Linear(8, 6)
    twin.weight = layer.weight  # a shared weight: one packed copy
    model = torch.nn.Sequential(layer, twin)
    install(model, _plan(model, range(1, 17), "packed"))
    handles = {m.__dict__[cpu_linear._HANDLE] for m in model}
    assert len(handles) == 1 and handles <= set(cpu_linear._PACKS)
    x = torch.randn(4, 8)

    def check():
        with torch.inference_mode(), cpu_linear.active():
            for m in model:
                torch.testing.assert_close(m(x), F.linear(x, m.weight, m.bias))

    check()
    with torch.no_grad():
        layer.weight.mul_(3.0)  # in place: the version counter moves
    check()
    model.load_state_dict({k: torch.randn_like(v) for k, v in model.state_dict().items()})
    check()
    layer.weight = torch.nn.Parameter(torch.randn(6, 8))  # replaced: another storage
    check()
    uninstall(model)
    assert not handles & set(cpu_linear._PACKS)


# in-place changes through ``.data`` (no version-counter bump) to a [6, 8] weight, the first
# three as docs/guides/performance.md ("Weight changes") names them: most flip the same bits
# in an even number of elements of every row and column they touch, or move values around
_SILENT_CHANGES = {
    "negation": lambda d: d.neg_(),  # every sign bit: 8 per row, 6 per column
    "swap": lambda d: d.view(-1).__setitem__([3, 12], d.view(-1)[[12, 3]].clone()),
    "sign_flip_2x2": lambda d: d[2:4, 5:7].neg_(),
    "times_4": lambda d: d.mul_(4.0),  # the exponent bits only
    "row_swap": lambda d: d.copy_(d[[1, 0, 2, 3, 4, 5]]),
    "one_ulp": lambda d: d.view(torch.int32)[4, 3].add_(1),
}


@needs_packing
@pytest.mark.parametrize("change", list(_SILENT_CHANGES))
def test_refresh_finds_in_place_changes_that_keep_the_version_counter(change):
    layer = torch.nn.Linear(8, 6)
    model = torch.nn.Sequential(layer)
    install(model, _plan(model, range(1, 17), "packed"))
    x = torch.randn(4, 8)
    assert cpu_linear.refresh(model) == 0
    version = layer.weight._version
    with torch.no_grad():
        _SILENT_CHANGES[change](layer.weight.data)
    assert layer.weight._version == version  # only refresh's fingerprint can see it
    assert cpu_linear.refresh(model) == 1
    assert cpu_linear.refresh(model) == 0
    with torch.inference_mode(), cpu_linear.active():
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias))
    uninstall(model)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_the_fingerprint_follows_the_bits_exactly(dtype):
    w = torch.randn(37, 61).to(dtype)  # 2257 elements: two full blocks and a partial one
    fp = cpu_linear.fingerprint(w)
    assert cpu_linear.fingerprint(w.clone()) == fp  # same bits, same fingerprint
    assert cpu_linear.fingerprint(w.T.contiguous().T) == fp  # not contiguous: same bits
    assert cpu_linear.fingerprint(w.reshape(61, 37)) != fp  # the shape counts
    ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[w.element_size()]
    for index in (0, 1500, w.numel() - 1):  # a single element's lowest or sign bit: always seen
        for flip in (1, torch.iinfo(ints).min):
            changed = w.clone()
            changed.view(ints).view(-1)[index] ^= flip
            assert cpu_linear.fingerprint(changed) != fp, (index, flip)
    block = w[:6, :8].clone()
    for name, change in _SILENT_CHANGES.items():
        changed = block.clone()
        change(changed)
        assert cpu_linear.fingerprint(changed) != cpu_linear.fingerprint(block), name


@needs_packing
def test_generation_follows_a_weight_negated_in_place():
    main = tiny_lm(dtype=torch.float32)
    draft = perturbed(main)  # drafts every step (n-grams found no match here: no verify)
    install(main, _plan(main, range(1, 17), "packed", above="packed"))
    gen = Generator(main, draft, policy="constant", policy_options={"k": 2})
    prompts = [[1, 2, 3, 1, 2, 3, 1, 2], [5, 6, 7]]
    before = assert_greedy_equivalent(gen, prompts, max_new_tokens=10).sequences
    assert main.lm_head.weight.shape == (64, 32)  # even: every bit flips evenly per row, column
    with torch.no_grad():
        main.lm_head.weight.data.neg_()
    res = assert_greedy_equivalent(gen, prompts, max_new_tokens=10)  # the new weights' tokens
    assert res.sequences != before
    assert res.stats.backend["repacked"] == 1
    uninstall(main)


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


def test_autograd_goes_through_torch_s_own_op():
    layer = torch.nn.Linear(8, 6)
    install(layer, _plan(layer, range(1, 17), "packed"))
    x = torch.randn(3, 8, requires_grad=True)
    with cpu_linear.active():
        layer(x).sum().backward()
    torch.testing.assert_close(x.grad, layer.weight.sum(0).expand(3, 8))


@pytest.mark.parametrize("layout", LAYOUTS[1:])
def test_the_compiled_form_is_one_graph_for_every_row_count(monkeypatch, layout):
    from torch._dynamo.testing import CompileCounter

    if layout == "packed" and not _can_pack(torch.float32):
        pytest.skip("this torch build has no oneDNN packed linear")
    layer = torch.nn.Linear(8, 6)
    install(layer, _plan(layer, {2, 3}, layout, above=layout))
    spy = _Spy(monkeypatch)
    torch._dynamo.reset()
    counter = CompileCounter()
    compiled = torch.compile(layer, backend=counter, fullgraph=True, dynamic=True)
    with torch.inference_mode(), cpu_linear.active():
        for m in (2, 5, 3, 7, 40):
            x = torch.randn(1, m, 8)
            torch.testing.assert_close(compiled(x), F.linear(x, layer.weight, layer.bias))
    assert counter.frame_count == 1  # the row count is read inside the op, not guarded on
    assert spy.calls == [(layout, m) for m in (2, 3, 40)]


def test_cpu_linear_op_contract():
    x, w, b = torch.randn(3, 8), torch.randn(6, 8), torch.randn(6)
    shape = (6, 8, torch.float32)
    layer = torch.nn.Linear(8, 6)
    for layout in LAYOUTS:
        plan = LinearPlan({shape: {3: layout}}, {shape: layout})
        install(layer, plan)
        handle = layer.__dict__.get(cpu_linear._HANDLE, -1)
        for bias in (b, None):
            for xi in (x, torch.randn(40, 8), torch.randn(0, 8)):
                args = (xi, layer.weight.detach(), bias, plan.code(shape), handle)
                torch.library.opcheck(torch.ops.bass.cpu_linear.default, args)
                torch.testing.assert_close(
                    torch.ops.bass.cpu_linear(*args), F.linear(xi, layer.weight, bias)
                )
        uninstall(layer)
    # an unknown handle (its copies freed): F.linear's numbers
    out = torch.ops.bass.cpu_linear(x, w, b, 0b10 << 6, 10**9)
    torch.testing.assert_close(out, F.linear(x, w, b))


@pytest.mark.parametrize("layout", LAYOUTS[1:])
@pytest.mark.parametrize("draft", [None, "ngram", "model"])
def test_generation_through_routed_layers_is_exact(draft, layout):
    main = tiny_lm(dtype=torch.float32)
    install(main, _plan(main, range(1, 17), layout, above=layout))  # every pass routed
    d = None
    if draft == "model":
        d = tiny_lm(dtype=torch.float32, seed=1)
        install(d, _plan(d, range(1, 17), layout, above=layout))
    elif draft == "ngram":
        d = "ngram"
    gen = Generator(main, d, policy="constant", policy_options={"k": 3})
    assert routing(main).rows == _plan(main, range(1, 17), layout, above=layout).rows  # kept
    prompts = [[1, 2, 3, 1, 2, 3, 1, 2], [5, 6, 7], [9, 9, 9, 9, 9]]
    assert_greedy_equivalent(gen, prompts, max_new_tokens=12)


def test_generator_calibrates_once_per_model_and_modes_route_as_named(monkeypatch):
    main = tiny_lm(dtype=torch.float32)
    gen = Generator(main, "ngram")
    plan = routing(main)
    assert plan is not None and gen.backend.chosen == "auto" and gen.backend.routed
    Generator(main, None)
    assert routing(main) is plan  # kept on the model: not measured again
    Generator(main, None, cpu_linear="unpacked")
    unpacked = routing(main)
    assert unpacked == plan.without_packed()
    assert cpu_linear.packed_bytes(main) == 0
    Generator(main, None)
    assert routing(main) == plan  # the same measurement, packed again
    install(main, _plan(main, range(1, 64)))  # by hand: every row count routed
    spy = _Spy(monkeypatch)
    Generator(main, None, cpu_linear="torch").generate([[1, 2, 3]], max_new_tokens=3)
    assert not spy.calls and routing(main) is not None  # not routed; the model keeps its plan
    Generator(main, None).generate([[1, 2, 3]], max_new_tokens=3)
    assert spy.calls  # the plan installed by hand is kept
    kept = routing(main)
    assert Generator(main, None, compile=True).backend.routed and routing(main) is kept


def test_packed_copies_only_within_the_memory_budget(monkeypatch):
    """A model whose packed copies would not fit the budget of free memory gets the
    copy-free layouts (a 7B float32 model, 28 GB, on a machine with 32 GB free would
    double its memory): here a small model and a faked free memory."""

    main = tiny_lm(dtype=torch.float32, seed=2)
    need = cpu_linear.linear_bytes(main)
    assert need > 0
    monkeypatch.setattr(backends, "available_memory", lambda: int(need * 1.5))  # < 2x
    gen = Generator(main, None)  # the default share, 0.5 of the free memory
    report = gen.backend.describe()
    assert report["cpu_linear"] == "unpacked" and report["requested"] == "auto"
    assert "budget" in report["reason"] and cpu_linear.packed_bytes(main) == 0
    assert all(k != "packed" for rows in routing(main).rows.values() for k in rows.values())
    res = gen.generate([[1, 2, 3]], max_new_tokens=3)
    assert res.stats.backend["cpu_linear"] == "unpacked"
    monkeypatch.setattr(backends, "available_memory", lambda: None)  # unknown: no copies
    assert Generator(main, None).backend.chosen == "unpacked"
    monkeypatch.setattr(backends, "available_memory", lambda: need * 4)  # fits
    assert Generator(main, None).backend.describe()["cpu_linear"] == "auto"
    with pytest.raises(ValueError, match="memory_share"):
        backends.CPUBackend(memory_share=1.5)


def test_bad_cpu_linear_values_are_refused(tmp_path):
    allowed = "expected one of auto, unpacked, torch"
    with pytest.raises(ValueError, match=rf"cpu_linear='fast' is not allowed; {allowed}"):
        Generator(tiny_lm(), None, cpu_linear="fast")
    cfg = tmp_path / "bass.toml"
    cfg.write_text('[model]\ncpu_linear = "fast"\n')
    with pytest.raises(ConfigError, match="cpu_linear"):
        load_config(cfg)
    for mode in ("torch", "unpacked"):
        cfg.write_text(f'[model]\ncpu_linear = "{mode}"\n')
        assert load_config(cfg).generator_kwargs()["cpu_linear"] == mode


@needs_packing
@pytest.mark.parametrize("draft", ["none", "ngram", "model"])
def test_every_length_pattern_stays_exact_through_the_packed_layout(draft):
    """Batch invariance with every pass's linear layers packed (prefill, draft, verify):
    float32, where the layouts round differently from ``F.linear``."""
    from models import perturbed

    from bass.testing.strategies import LENGTH_PATTERNS, example_batches

    main = tiny_lm(dtype=torch.float32)
    install(main, _plan(main, range(1, 17), "packed", above="packed"))
    d = {"none": None, "ngram": "ngram", "model": perturbed(main)}[draft]
    if draft == "model":
        install(d, _plan(d, range(1, 17), "packed", above="packed"))
    gen = Generator(main, d)
    for pattern in LENGTH_PATTERNS:
        assert_greedy_equivalent(gen, example_batches(64)[pattern], 10)


@needs_packing
def test_a_deepcopy_of_a_routed_model_computes_with_its_own_weights():
    import copy

    model = torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.Linear(6, 4))
    install(model, _plan(model, range(1, 17), "packed"))
    twin = copy.deepcopy(model)
    with torch.no_grad():
        for p in twin.parameters():
            p.mul_(-2.0)
    x = torch.randn(3, 8)
    with torch.inference_mode(), cpu_linear.active():
        for _ in range(2):  # each call finds the other model's weight in the shared copy
            torch.testing.assert_close(twin(x), F.linear(F.linear(x, *_wb(twin[0])), *_wb(twin[1])))
            torch.testing.assert_close(
                model(x), F.linear(F.linear(x, *_wb(model[0])), *_wb(model[1]))
            )
    mine = cpu_linear.packed_bytes(model)
    assert mine > 0 and cpu_linear.packed_bytes(twin) == 0  # the twin owns no copy
    uninstall(twin)  # frees nothing of the original's
    assert cpu_linear.packed_bytes(model) == mine
    twin = copy.deepcopy(model)
    cpu_linear.prepare(twin)  # what a Generator does: the twin gets copies of its own
    assert cpu_linear.packed_bytes(twin) == mine and routing(twin) == routing(model)


def _wb(layer):
    return layer.weight, layer.bias


def test_measurements_are_kept_on_disk_per_machine_and_shapes(tmp_path, monkeypatch):
    """A second process (here: a fresh model of the same shapes) reads the measurement
    instead of taking it again; another thread count, other shapes, a damaged entry or the
    cache turned off measure anew; the plan read back is the one measured."""
    monkeypatch.setenv(cpu_linear.CACHE_VARIABLE, str(tmp_path))
    measured = []
    real = cpu_linear.calibrate
    monkeypatch.setattr(cpu_linear, "calibrate", lambda m: measured.append(m) or real(m, rounds=1))
    first = cpu_linear.measured(tiny_lm(dtype=torch.float32))
    (entry,) = tmp_path.glob("*.json")
    again = cpu_linear.measured(tiny_lm(dtype=torch.float32, seed=3))
    assert len(measured) == 1 and again == first  # rows, above, timings, swept: all equal
    assert Generator(tiny_lm(dtype=torch.float32, seed=4), None).backend.routed
    assert len(measured) == 1 and not list(tmp_path.glob(".*"))  # no temporary file left
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)
        cpu_linear.measured(tiny_lm(dtype=torch.float32))  # other threads: other timings
    finally:
        torch.set_num_threads(threads)
    cpu_linear.measured(tiny_lm(dtype=torch.bfloat16))  # other shapes
    assert len(measured) == 3 and len(list(tmp_path.glob("*.json"))) == 3
    for damaged in ("{not json", '{"ident": 1}', entry.read_text().replace('"shapes"', '"x"')):
        entry.write_text(damaged)
        assert cpu_linear.measured(tiny_lm(dtype=torch.float32)).rows.keys() == first.rows.keys()
    assert len(measured) == 6 and cpu_linear.measured(tiny_lm(dtype=torch.float32)) is not None
    assert len(measured) == 6  # the last damaged entry was written again, whole
    monkeypatch.setenv(cpu_linear.CACHE_VARIABLE, "0")
    cpu_linear.measured(tiny_lm(dtype=torch.float32))
    assert len(measured) == 7 and len(list(tmp_path.glob("*.json"))) == 3


def test_an_unwritable_cache_only_logs(tmp_path, monkeypatch, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("")  # a file where the cache folder would be
    monkeypatch.setenv(cpu_linear.CACHE_VARIABLE, str(blocker / "cache"))
    plan = cpu_linear.measured(tiny_lm(dtype=torch.float32))
    assert plan.timings and "BASS_CPU_LINEAR_CACHE" in caplog.text
