"""The engine on tiny random models: greedy equivalence, bookkeeping, compile, errors."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from models import FAMILIES, forward_padded, perturbed, reference_greedy, tiny_lm

from bass import Generator, policies, testing
from bass.drafters import ModelDrafter

PROMPTS = [[1, 2, 3, 4, 5], [7, 8], [9, 10, 11, 12, 13, 14, 15, 16, 3], [5], [6, 6, 6, 2]]


@pytest.fixture(scope="module")
def llama():
    return tiny_lm("llama")


def drafts_for(main):
    return {
        "same": main,  # always agrees
        "perturbed": perturbed(main),  # sometimes agrees
        "unrelated": tiny_lm("llama", seed=7, hidden=16, heads=2, kv_heads=1, layers=1),
        "ngram": "ngram",
    }


def check_invariant(gen, state):
    """The engine's bookkeeping invariant (bass.engine), after every step, for every
    active row: the main cache holds all its tokens but the newest. The step's verify
    pass started from the cache's lengths ``gen.cache.lens`` and the row kept ``a + 1`` of
    the tokens it fed, so ``lens + a + 1`` must be ``len(seq) - 1``."""
    assert gen.cache.batch_size == len(state.seqs)
    lens = gen.cache.lens.tolist()
    step = gen.stats.steps[-1] if gen.stats.steps else None
    for s in state.active():
        assert state.seqs[s] is state.by_prompt[state.prompt_of[s]]
        assert state.cache_lens()[s] == len(state.seqs[s]) - 1
        if step is not None and state.prompt_of[s] in step.prompts:
            a = step.accepted[step.prompts.index(state.prompt_of[s])]
            assert lens[s] + a + 1 == len(state.seqs[s]) - 1
    drafter = gen.drafter
    if isinstance(drafter, ModelDrafter):  # the draft cache holds a prefix of each row
        assert drafter.cache.batch_size == len(state.draft_lens) == gen.cache.batch_size
        for s in state.active():
            assert len(state.seqs[s]) - state.draft_lens[s] >= 1  # the newest is never cached


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("kind", ["same", "perturbed", "unrelated", "ngram"])
def test_greedy_equals_main_model(family, kind):
    main = tiny_lm(family)
    draft = drafts_for(main)[kind]
    if kind == "unrelated":
        draft = tiny_lm(family, seed=7, hidden=16, heads=2, kv_heads=1, layers=1)
    gen = Generator(main, draft, policy="constant", policy_options={"k": 3})
    res = gen.generate(PROMPTS, max_new_tokens=12, on_step=check_invariant)
    for p, seq in zip(PROMPTS, res.sequences):
        assert seq == reference_greedy(main, p, 12)
    if kind == "same":  # a draft identical to the main model is always accepted
        assert res.stats.mean_accepted > 2.0


@pytest.mark.parametrize(
    "policy,opts",
    [
        ("constant", {"k": 1}),
        ("constant", {"k": 6}),
        ("constant", {"k": 0}),
        ("bass", {}),
        ("bass", {"l0": 2, "l_limit": 4}),
        ("hf-heuristic", {}),
        ("confidence", {"min_top1": 0.6}),
        ("goodput", {}),
    ],
)
def test_greedy_draft_lengths_and_policies(llama, policy, opts):
    gen = Generator(llama, perturbed(llama), policy=policy, policy_options=opts)
    res = gen.generate(PROMPTS, max_new_tokens=15, on_step=check_invariant)
    for p, seq in zip(PROMPTS, res.sequences):
        assert seq == reference_greedy(llama, p, 15)
    if opts.get("k") == 0:  # regular decoding: one main pass per token after the prefill
        assert res.stats.draft_passes == gen.drafter.prefill_passes
        assert (
            res.stats.main_passes
            == res.stats.prefill_passes + 14
            == res.stats.prefill_passes + len(res.stats.steps)
        )
    if policy == "confidence":  # per-row early stop really cut some rows' drafts short
        assert any(d < s.draft_length for s in res.stats.steps for d in s.drafted)


@settings(max_examples=12)
@given(
    prompts=st.lists(st.lists(st.integers(0, 63), min_size=1, max_size=12), min_size=1, max_size=5),
    k=st.integers(0, 5),
    max_new=st.integers(1, 10),
)
def test_greedy_random_ragged_batches(llama, prompts, k, max_new):
    draft = _PERTURBED.setdefault("d", perturbed(llama))
    res = Generator(llama, draft, policy="constant", policy_options={"k": k}).generate(
        prompts, max_new_tokens=max_new, on_step=check_invariant
    )
    for p, seq in zip(prompts, res.sequences):
        assert seq == reference_greedy(llama, p, max_new)


_PERTURBED: dict = {}


@pytest.mark.parametrize("chunk", [8192, 7, 1])
def test_uneven_prompts_prefill_packed_and_chunked(llama, chunk):
    """Prefill feeds every prompt token once, no padding, in one pass; a batch of more
    than ``prefill_chunk_tokens`` tokens is split into chunks, prompts spanning them."""
    prompts = [[3], [4, 5], list(range(1, 41)), list(range(2, 62)), [7, 8, 9]]
    gen = Generator(
        llama,
        perturbed(llama),
        policy="constant",
        policy_options={"k": 3},
        prefill_chunk_tokens=chunk,
    )
    res = gen.generate(prompts, max_new_tokens=8, on_step=check_invariant)
    total = sum(map(len, prompts))
    assert res.stats.prefill_passes == -(-total // chunk)
    assert res.stats.prefill_tokens == total
    for p, seq in zip(prompts, res.sequences):
        assert seq == reference_greedy(llama, p, 8)


def test_eos_stops_rows_independently(llama):
    solo = [reference_greedy(llama, p, 12) for p in PROMPTS]
    eos = solo[0][4]  # a token the first row emits mid-way
    res = Generator(llama, llama, policy="constant", policy_options={"k": 4}).generate(
        PROMPTS, max_new_tokens=12, eos_token_id=eos, on_step=check_invariant
    )
    for p, seq in zip(PROMPTS, res.sequences):
        assert seq == reference_greedy(llama, p, 12, eos=eos)
    assert res.sequences[0][-1] == eos and len(res.sequences[0]) <= 5


def test_finished_rows_leave_the_batch(llama):
    solo = [reference_greedy(llama, p, 12) for p in PROMPTS]
    eos = solo[1][0]  # rows 1 and 3 finish at once, row 2 a few tokens later, 0 and 4 run on
    seen = []
    gen = Generator(llama, llama, policy="constant", policy_options={"k": 2})

    def on_step(g, s):
        ptrs = [t.data_ptr() for t in g.cache.buffers()]
        seen.append((g.cache.batch_size, len(s.active()), ptrs))

    res = gen.generate(PROMPTS, max_new_tokens=12, eos_token_id=eos, on_step=on_step)
    expected = [reference_greedy(llama, p, 12, eos=eos) for p in PROMPTS]
    assert res.sequences == expected
    # amortised compaction: after each step fewer than half the cache's rows are finished
    assert all(2 * (c - r) < c for c, r, _ in seen if r)
    assert min(c for c, _, _ in seen) < len(PROMPTS)  # it did compact
    assert len({tuple(p) for _, _, p in seen}) == 1  # in place: the buffers never moved
    for step in res.stats.steps:  # finished rows take part in no step, and cost no token
        assert all(res.finish_reasons[r] and len(res.sequences[r]) > 0 for r in step.prompts)
        assert len(step.accepted) == len(step.prompts) == len(step.drafted)
        assert step.verify_tokens == sum(1 + d for d in step.drafted)


def test_stats(llama):
    res = Generator(llama, "ngram", policy="bass").generate(PROMPTS, max_new_tokens=8)
    s = res.stats.summary()
    assert s["tokens_generated"] == sum(map(len, res.sequences)) == 5 * 8
    assert s["main_passes"] == res.stats.prefill_passes + len(res.stats.steps)
    assert len(s["draft_length_trace"]) == len(res.stats.steps)
    assert res.stats.wall_seconds > 0


@pytest.mark.parametrize(
    "draft, policy, options",
    [
        ("model", "constant", {"k": 3}),
        ("model", "bass", None),
        ("model", "confidence", None),
        ("ngram", "hf-heuristic", None),
        ("ngram", "bass", None),
        ("ngram", "adaptive", None),
        ("ngram", "goodput", None),
        (None, "adaptive", None),
    ],
)
def test_sampling_is_seeded(llama, draft, policy, options):
    """A seed repeats the sample exactly: with a draft model under policies that decide
    from token counts only (the same lengths every run; the README says which), and with
    n-gram drafts or none under any policy, timing-based ones included (keyed draws)."""
    d = perturbed(llama) if draft == "model" else draft
    gen = Generator(llama, d, policy=policy, policy_options=options)
    kw = dict(max_new_tokens=10, do_sample=True, temperature=0.9, top_k=20, top_p=0.95)
    a = gen.generate(PROMPTS, seed=3, **kw).sequences
    b = gen.generate(PROMPTS, seed=3, **kw).sequences
    c = gen.generate(PROMPTS, seed=4, **kw).sequences
    assert a == b and a != c


REPETITIVE = [[1, 2, 3, 4] * 5, [7, 8, 9] * 6, [5, 9, 5, 9, 5], [2], [3, 1, 4, 1, 5, 9, 2, 6]]


@pytest.mark.parametrize("policy", sorted(policies.available()))
def test_sampled_ngram_output_is_plain_sampled_decoding(llama, policy):
    """n-gram drafts are verified with keyed draws: under every policy the sampled tokens
    are plain sampled decoding's with the same seed, token for token, stops included."""
    gen = Generator(llama, "ngram", policy=policy)
    kw = dict(temperature=0.9, top_k=20, top_p=0.95, eos_token_id=3)
    res = testing.assert_sampled_equivalent(gen, REPETITIVE + PROMPTS, 16, seed=11, **kw)
    if policy in ("bass", "constant", "hf-heuristic"):  # not vacuous: drafts were kept
        assert sum(map(sum, (s.accepted for s in res.stats.steps))) > 0


def test_sampled_equivalence_check_fails_on_a_change_and_refuses_draft_models(llama):
    gen = Generator(llama, "ngram")
    res = testing.assert_sampled_equivalent(gen, PROMPTS, 6, seed=1)
    with pytest.raises(AssertionError, match="row 0 differs from plain sampled decoding"):

        class Shifted(Generator):  # a broken generator: its first row's tokens shift by one
            def generate(self, *a, **k):
                out = super().generate(*a, **k)
                out.sequences[0] = [(t + 1) % 64 for t in out.sequences[0]]
                return out

        testing.assert_sampled_equivalent(Shifted(llama, "ngram"), PROMPTS, 6, seed=1)
    assert (
        res.sequences
        != Generator(llama, "ngram")
        .generate(PROMPTS, max_new_tokens=6, do_sample=True, seed=2)
        .sequences
    )
    # a draft model's sampled drafts are coupled by default: plain sampling, row for row
    testing.assert_sampled_equivalent(Generator(llama, perturbed(llama)), PROMPTS, 4)
    with pytest.raises(ValueError, match="coupled or deterministic drafts"):
        gen = Generator(llama, perturbed(llama), draft_sampling="rejection")
        testing.assert_sampled_equivalent(gen, PROMPTS, 4)


@pytest.mark.parametrize("mode", ["compiled", "static shapes"])
def test_keyed_sampling_through_compiled_and_static_passes(llama, mode):
    """The keys ride in the pass's packed tensors: compiled passes (a dynamo backend that
    counts graphs) and bucket-padded static-shape passes sample what eager plain decoding
    does."""
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    kw = {"compile": CompileCounter()} if mode == "compiled" else {"static_shapes": True}
    gen = Generator(llama, "ngram", policy="constant", policy_options={"k": 3}, **kw)
    res = testing.assert_sampled_equivalent(gen, REPETITIVE + PROMPTS, 12, seed=4, top_k=30)
    assert sum(map(sum, (s.accepted for s in res.stats.steps))) > 0
    if mode == "static shapes":
        assert res.stats.padding_share > 0  # bucket padding was there, and harmless


def test_unseeded_sampling_follows_torch_manual_seed(llama):
    gen = Generator(llama, "ngram")
    kw = dict(max_new_tokens=8, do_sample=True)
    torch.manual_seed(123)
    a = gen.generate(PROMPTS, **kw).sequences
    torch.manual_seed(123)
    assert gen.generate(PROMPTS, **kw).sequences == a


def test_time_budget_returns_partial_rows(llama):
    res = Generator(llama, llama).generate(PROMPTS, max_new_tokens=50, time_budget=0.0)
    assert res.stats.stopped_by_time_budget
    assert all(len(s) == 1 for s in res.sequences)  # the prefill's token only


def test_compiled_step_has_no_graph_breaks_and_few_graphs(llama):
    from torch._dynamo.testing import CompileCounter

    from bass import hf
    from bass.cache import RaggedKVCache

    torch._dynamo.reset()
    main = copy.deepcopy(llama)
    hf.prepare(main, 64)
    cache = RaggedKVCache(2, 64, 2, torch.device("cpu"))
    q = torch.tensor([4, 2], dtype=torch.int32)
    with torch.inference_mode():
        forward_padded(main, cache, torch.tensor([[1, 2, 3, 4], [5, 6, 0, 0]]), q)
        cache.commit(q)
        explain = torch._dynamo.explain(forward_padded)(
            main, cache, torch.tensor([[1, 2], [3, 0]]), torch.tensor([2, 1], dtype=torch.int32)
        )
    assert explain.graph_break_count == 0 and explain.graph_count == 1

    torch._dynamo.reset()
    counter = CompileCounter()
    eager = Generator(llama, perturbed(llama), policy="bass").generate(PROMPTS, max_new_tokens=30)
    gen = Generator(llama, perturbed(llama), policy="bass", compile=counter)
    res = gen.generate(PROMPTS, max_new_tokens=30)
    assert res.sequences == eager.sequences
    steps = len(res.stats.steps)
    # query widths are bucketed and the batch dimension turns dynamic: a handful of graphs
    assert counter.frame_count <= 8 < steps, (counter.frame_count, steps)


def test_cuda_graph_passes_compile_once_for_all_token_buckets():
    """compile="reduce-overhead" (CUDA graphs on a GPU, plain Inductor here): each model's
    pass is compiled with the token count dynamic, not once per bucket. Per bucket, this
    run compiled 11 graphs (a 7B's took ~49 s each on an H100, and BASS's warm-up never
    finished inside a lease's stage); with the count dynamic, 5: the two models, N = 1
    specialised, a pass kind without logit rows."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    main = tiny_lm("llama", dtype=torch.float32)
    draft = tiny_lm("llama", layers=1, seed=1, dtype=torch.float32)
    prompts = [[1, 2, 3, 4, 5][: 1 + i % 5] for i in range(8)]
    opts = dict(policy="constant", policy_options={"k": 4}, forced_acceptance=0.7)
    eager = Generator(main, draft, **opts).generate(prompts, max_new_tokens=32, seed=0)
    gen = Generator(main, draft, compile="reduce-overhead", cpu_linear="torch", **opts)
    res = gen.generate(prompts, max_new_tokens=32, seed=0)
    assert res.sequences == eager.sequences
    assert res.stats.padding_tokens > 0  # token counts were bucketed
    assert counters["stats"]["unique_graphs"] <= 6, dict(counters["stats"])
    torch._dynamo.reset()


def test_compiled_passes_take_a_models_floats_as_constants(llama):
    """Dynamo's default turns the Python floats a forward reads (attention ``scaling``,
    ``variance_epsilon``, rotary ``attention_scaling``) into 0-d float64 CPU tensor inputs:
    on a GPU those are CPU work inside the CUDA region (compat shim 11). bass's compiled
    passes take them as constants."""
    inputs = []

    def backend(gm, example_inputs):
        inputs.extend(example_inputs)
        return gm.forward

    torch._dynamo.reset()
    gen = Generator(llama, "ngram", compile=backend, policy="constant", policy_options={"k": 2})
    eager = Generator(llama, "ngram", policy="constant", policy_options={"k": 2})
    assert (
        gen.generate(PROMPTS, max_new_tokens=6).sequences
        == eager.generate(PROMPTS, max_new_tokens=6).sequences
    )
    assert inputs
    floats = [
        x
        for x in inputs
        if isinstance(x, torch.SymFloat)
        or (isinstance(x, torch.Tensor) and x.dim() == 0 and x.is_floating_point())
    ]
    assert not floats, floats
    torch._dynamo.reset()


def test_compiled_models_of_one_class_keep_their_own_graphs():
    """The main and draft models are both LlamaForCausalLM but differ in depth: with the
    module guards dropped (torch >= 2.13), each must still run its own graphs (same
    tokens and the same acceptances as eager); a weight changed in place after compiling
    is seen (weights are graph inputs)."""
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    main = tiny_lm("llama", layers=3, dtype=torch.float32)
    draft = copy.deepcopy(main)  # main's first layer only: another graph, drafts worth taking
    del draft.model.layers[1:]
    draft.config.num_hidden_layers = 1
    with torch.no_grad():  # main's deeper layers add little: most drafts are accepted
        for layer in main.model.layers[1:]:
            layer.self_attn.o_proj.weight.mul_(0.05)
            layer.mlp.down_proj.weight.mul_(0.05)
    counter = CompileCounter()
    opts = dict(policy="constant", policy_options={"k": 3})
    gen = Generator(main, draft, compile=counter, **opts)
    for _ in range(2):
        res = gen.generate(PROMPTS, max_new_tokens=12)
        eager = Generator(main, draft, **opts).generate(PROMPTS, max_new_tokens=12)
        assert res.sequences == eager.sequences
        assert [s.accepted for s in res.stats.steps] == [s.accepted for s in eager.stats.steps]
        assert res.stats.mean_accepted > 0.5
        with torch.no_grad():  # the second round: other weights, the same graphs
            main.model.layers[1].mlp.down_proj.weight.mul_(4.0)
    compiled = gen.passes.forward.__wrapped__  # inside the CPU backend's framing
    assert len(compiled._regions) == 2  # a compiled wrapper per model (torch < 2.13 too)
    assert counter.frame_count <= 16


def test_modules_replaced_after_compiling_are_compiled_again():
    """Guards that skip the modules would run the old graph after a module is replaced:
    a swapped activation gave rows of neither model, a resized vocabulary crashed, and
    weights of other strides failed Inductor's layout asserts, and a module's float setting
    (a norm's epsilon: a LoRA scale is one too) is a constant of the graph (compat shim
    11). The region is compiled again, with a warning (it costs a compile)."""
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    main = tiny_lm("llama", dtype=torch.float32)
    counter = CompileCounter()
    gen = Generator(main, "ngram", compile=counter, policy="constant", policy_options={"k": 2})
    before = gen.generate(PROMPTS, max_new_tokens=10).sequences
    assert before == [reference_greedy(main, p, 10) for p in PROMPTS]

    def new_activation(m):
        for layer in m.model.layers:
            layer.mlp.act_fn = torch.nn.Tanh()

    def resized(m):
        m.resize_token_embeddings(80, mean_resizing=False)

    def relaid(m):  # equal values in another memory layout (Inductor asserts strides)
        state = {
            k: v.t().contiguous().t() if v.dim() == 2 else v for k, v in m.state_dict().items()
        }
        m.load_state_dict(state, assign=True)

    def epsilon(m):  # a float attribute, read by the forward as a constant
        for module in m.modules():
            if hasattr(module, "variance_epsilon"):
                module.variance_epsilon = 10.0

    for change in (new_activation, resized, relaid, epsilon):
        change(main)
        frames = counter.frame_count
        with pytest.warns(UserWarning, match="layouts changed since its compiled forward"):
            res = gen.generate(PROMPTS, max_new_tokens=10)
        assert res.sequences == [reference_greedy(main, p, 10) for p in PROMPTS]
        assert change is relaid or res.sequences != before  # (the model's before the changes)
        assert counter.frame_count > frames
        gen.generate(PROMPTS, max_new_tokens=10)  # unchanged since: no warning


# ----------------------------------------------------------------------------- static shapes


def test_static_shapes_keep_buffers_and_bucket_every_pass(llama):
    """What CUDA graphs need, checked on the CPU: through a long ragged generation with
    rows finishing, the cache buffers never move or change shape, and every pass after
    the prefill computes a bucketed token count (padding tokens belong to no row)."""
    from bass.packing import TOKEN_BUCKETS

    prompts = [p * 3 for p in PROMPTS] + [[7] * 20, [1, 9]]
    solo = [reference_greedy(llama, p, 40) for p in prompts]
    eos = solo[1][5]
    draft = perturbed(llama)
    kw = dict(max_new_tokens=40, eos_token_id=eos, on_step=check_invariant)
    eager = Generator(llama, draft, policy="bass").generate(prompts, **kw)
    gen = Generator(llama, draft, policy="bass", static_shapes=True)
    seen = []

    def on_step(g, s):
        check_invariant(g, s)
        buffers = g.cache.buffers() + g.drafter.cache.buffers()
        seen.append([(t.data_ptr(), tuple(t.shape)) for t in buffers])

    res = gen.generate(prompts, **{**kw, "on_step": on_step})
    assert res.sequences == eager.sequences
    assert len(set(res.finish_reasons)) > 1  # rows finished at different steps
    assert all(x == seen[0] for x in seen)  # never reallocated, never reshaped
    assert seen[0][0][1][0] == len(prompts)  # no compaction: every row keeps its slot
    verify = [s.verify_tokens + s.padding_tokens for s in res.stats.steps]
    passes = [n for s in res.stats.steps for n in s.draft_pass_tokens]  # every draft pass
    assert passes and set(verify) | set(passes) <= set(TOKEN_BUCKETS)
    assert len(set(verify)) > 1 and sum(s.padding_tokens for s in res.stats.steps) > 0
    assert res.stats.padding_share > 0 == eager.stats.padding_share


def test_explicit_arguments_win_over_the_config_file_even_when_false(llama, tmp_path):
    """``Generator(compile=False, config=f)`` must not compile when the file says
    ``compile = true`` (an explicit falsy argument is still explicit)."""
    cfg = tmp_path / "bass.toml"
    cfg.write_text('[model]\ncompile = true\ncpu_linear = "unpacked"\nattention = "reference"\n')
    assert not Generator(llama, None, config=cfg, compile=False).passes.compiled
    assert Generator(llama, None, config=cfg).passes.compiled  # the file, when not given
    gen = Generator(llama, None, config=cfg, compile=False, cpu_linear="torch", attention="sdpa")
    assert gen.backend.describe()["cpu_linear"] == "torch" and gen.attention == "sdpa"
    gen = Generator(llama, None, config=cfg, compile=False)
    assert gen.backend.describe()["cpu_linear"] == "unpacked" and gen.attention == "reference"


def test_the_core_modules_know_nothing_of_the_cpu_linear_machinery():
    """The engine loop, the drafters, the HF integration, packing, the cache and sampling
    are device-neutral: the CPU's linear layouts live behind bass.backends only."""
    import ast
    from pathlib import Path

    import bass

    root = Path(bass.__file__).parent
    for name in ("engine", "hf", "drafters", "packing", "cache", "sampling", "verify"):
        tree = ast.parse((root / f"{name}.py").read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""] + [a.name for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            assert not any("cpu_linear" in n for n in names), f"{name}.py imports {names}"


@pytest.mark.parametrize("draft", [None, "ngram"])
def test_row_ids_make_a_split_job_draw_the_samples_of_one_call(llama, draft):
    """Seeded sampling keys each row's draws by its row id: a job split into calls (or
    ranks: bass.distributed) draws the samples of one call when rows keep their ids."""
    gen = Generator(llama, draft, policy="constant", policy_options={"k": 3})
    prompts = PROMPTS + PROMPTS[::-1]
    kw = dict(max_new_tokens=8, do_sample=True, temperature=1.2, seed=4)
    whole = gen.generate(prompts, **kw).sequences
    cut = len(prompts) // 2
    first = gen.generate(prompts[:cut], row_ids=list(range(cut)), **kw).sequences
    rest = gen.generate(prompts[cut:], row_ids=list(range(cut, len(prompts))), **kw).sequences
    assert first + rest == whole
    for bad in ([0] * len(prompts), [-1, *range(1, len(prompts))], [0, 1]):
        with pytest.raises(ValueError, match=r"row_ids=.* is not allowed; expected"):
            gen.generate(prompts, max_new_tokens=2, row_ids=bad)


# ----------------------------------------------------------------------------- rows


def test_forced_acceptance_sets_the_mean_accepted_length(llama):
    unrelated = tiny_lm("llama", seed=7, hidden=16, heads=2, kv_heads=1, layers=1)
    means = {}
    for p in (0.0, 0.5, 1.0):
        gen = Generator(
            llama, unrelated, policy="constant", policy_options={"k": 4}, forced_acceptance=p
        )
        res = gen.generate(PROMPTS * 4, max_new_tokens=40, seed=0, on_step=check_invariant)
        assert res.stats.summary()["forced_acceptance"] == p
        means[p] = res.stats.mean_accepted
    assert means[0.0] == 0.0
    # all 4 drafted tokens accepted, except where a row's budget caps its draft
    assert means[1.0] > 3.0
    assert 0.6 < means[0.5] < 1.2  # E[accepted] = sum_{i=1..4} 0.5^i = 0.94
    with pytest.raises(ValueError, match="forced_acceptance"):
        Generator(llama, llama, forced_acceptance=1.5)


def test_stop_sequences_end_rows_like_eos(llama):
    solo = [reference_greedy(llama, p, 12) for p in PROMPTS]
    stop = solo[2][3:5]  # two tokens row 2 emits mid-way
    gen = Generator(llama, perturbed(llama), policy="constant", policy_options={"k": 3})
    res = gen.generate(PROMPTS, max_new_tokens=12, stop_sequences=[stop], on_step=check_invariant)
    for full, got in zip(solo, res.sequences):
        ends = [i + 2 for i in range(len(full) - 1) if full[i : i + 2] == stop]
        assert got == (full[: ends[0]] if ends else full)
    assert res.sequences[2][-2:] == stop
    with pytest.raises(ValueError, match="empty sequence"):
        gen.generate(PROMPTS, max_new_tokens=2, stop_sequences=[[]])


@pytest.mark.parametrize("kind", [None, "ngram", "perturbed"])
def test_unsorted_prompts_of_one_length_group(llama, kind):
    """Prompts of close, unsorted lengths are prefilled as one group: each row's logits
    must go back to its own row (they once went to the row of the same sorted rank)."""
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 64, (n,), generator=g).tolist() for n in (17, 17, 18, 13, 16)]
    draft = {"perturbed": perturbed(llama)}.get(kind, kind)
    gen = Generator(llama, draft, policy="constant", policy_options={"k": 3})
    res = gen.generate(prompts, max_new_tokens=6, on_step=check_invariant)
    for p, seq in zip(prompts, res.sequences):
        assert seq == reference_greedy(llama, p, 6)
