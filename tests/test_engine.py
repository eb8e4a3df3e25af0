"""The engine on tiny random models: greedy equivalence, bookkeeping, compile, errors."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from models import FAMILIES, perturbed, reference_greedy, tiny_lm

from bass import Generator
from bass.hf import UnsupportedModelError

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
    """DESIGN.md's bookkeeping invariant, after every step."""
    main_lens = gen.cache.lens.tolist()
    for b, seq in enumerate(state.seqs):
        assert main_lens[b] == len(seq) - 1
    drafter = gen.drafter
    if drafter is not None and hasattr(drafter, "d_len"):
        assert drafter.cache.lens.tolist() == drafter.d_len
        for b, seq in enumerate(state.seqs):
            assert len(seq) - drafter.d_len[b] >= 1  # the newest token is never in a cache


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


def test_uneven_prompts_are_prefilled_in_groups(llama):
    prompts = [[3], [4, 5], list(range(1, 41)), list(range(2, 62)), [7, 8, 9]]
    gen = Generator(llama, perturbed(llama), policy="constant", policy_options={"k": 3})
    res = gen.generate(prompts, max_new_tokens=8, on_step=check_invariant)
    assert res.stats.prefill_passes > 1  # a 60-token prompt does not pad the 1-token ones
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
    eos = solo[0][1]  # row 0 finishes after two tokens, the others (mostly) later
    sizes = []
    gen = Generator(llama, llama, policy="constant", policy_options={"k": 2})
    res = gen.generate(
        PROMPTS,
        max_new_tokens=12,
        eos_token_id=eos,
        on_step=lambda g, s: sizes.append((g.cache.batch_size, len(s.rows))),
    )
    expected = [reference_greedy(llama, p, 12, eos=eos) for p in PROMPTS]
    assert res.sequences == expected
    assert all(c == r for c, r in sizes if r)  # compacted at once (none left: no step)
    lengths = sorted(len(e) for e in expected)
    assert lengths[0] < lengths[-1] and min(c for c, _ in sizes) < len(PROMPTS)
    for step in res.stats.steps:  # finished rows no longer take part in any step
        assert all(len(res.sequences[r]) > 0 for r in step.rows)
        assert len(step.accepted) == len(step.rows) == len(step.drafted)


def test_stats(llama):
    res = Generator(llama, "ngram", policy="bass").generate(PROMPTS, max_new_tokens=8)
    s = res.stats.summary()
    assert s["tokens_generated"] == sum(map(len, res.sequences)) == 5 * 8
    assert s["main_passes"] == res.stats.prefill_passes + len(res.stats.steps)
    assert len(s["draft_length_trace"]) == len(res.stats.steps)
    assert res.stats.wall_seconds > 0


def test_sampling_is_seeded(llama):
    gen = Generator(llama, perturbed(llama), policy="constant", policy_options={"k": 3})
    kw = dict(max_new_tokens=10, do_sample=True, temperature=0.9, top_k=20, top_p=0.95)
    a = gen.generate(PROMPTS, seed=3, **kw).sequences
    b = gen.generate(PROMPTS, seed=3, **kw).sequences
    c = gen.generate(PROMPTS, seed=4, **kw).sequences
    assert a == b and a != c


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
        hf.forward_logits(main, cache, torch.tensor([[1, 2, 3, 4], [5, 6, 0, 0]]), q)
        cache.commit(q)
        explain = torch._dynamo.explain(hf.forward_logits)(
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


# ----------------------------------------------------------------------------- errors


def test_errors_before_any_work(llama):
    gen = Generator(llama, llama)
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        gen.generate([[1], []], max_new_tokens=4)
    with pytest.raises(ValueError, match="prompts is empty"):
        gen.generate([], max_new_tokens=4)
    with pytest.raises(ValueError, match="max_new_tokens must be an int >= 1"):
        gen.generate([[1]], max_new_tokens=0)
    with pytest.raises(ValueError, match=r"exceeds .* context of 256"):
        gen.generate([[1] * 200], max_new_tokens=60)
    with pytest.raises(ValueError, match="temperature"):
        gen.generate([[1]], max_new_tokens=4, do_sample=True, temperature=0.0)
    with pytest.raises(ValueError, match="outside \\[0, 64\\)"):
        gen.generate([[1, 64]], max_new_tokens=4)
    with pytest.raises(ValueError, match="unknown policy 'bas'; installed: bass"):
        Generator(llama, llama, policy="bas")
    with pytest.raises(ValueError, match="vocabularies differ"):
        Generator(llama, tiny_lm("llama", vocab=80))
    with pytest.raises(ValueError, match="'ngram'"):
        Generator(llama, "gram")


def test_unroutable_model_is_named():
    from transformers import LlamaForCausalLM

    from bass import hf

    class LegacyAttentionLM(LlamaForCausalLM):  # as a model with hand-written attention
        _supports_attention_backend = False

    model = LegacyAttentionLM(tiny_lm("llama").config)
    with pytest.raises(UnsupportedModelError, match=r"LegacyAttentionLM.*AttentionInterface"):
        hf.prepare(model)
    with pytest.raises(UnsupportedModelError, match="LegacyAttentionLM"):
        Generator(model, "ngram").generate([[1, 2]], max_new_tokens=2)


def test_sliding_window_shorter_than_context_is_refused():
    from bass import hf

    model = tiny_lm("mistral")
    model.config.sliding_window = 16
    with pytest.raises(UnsupportedModelError, match="sliding window of 16"):
        hf.prepare(model, max_len=64)


def test_model_is_handed_back_unchanged(llama):
    before = llama.config._attn_implementation
    Generator(llama, "ngram").generate([[1, 2]], max_new_tokens=3)
    assert llama.config._attn_implementation == before


def test_config_file_sets_defaults_and_arguments_win(llama, tmp_path):
    cfg = tmp_path / "bass.toml"
    cfg.write_text(
        '[policy]\nname = "constant"\n[policy.options]\nk = 2\n[generation]\nmax_new_tokens = 5\n'
    )
    gen = Generator(llama, "ngram", config=cfg)
    res = gen.generate(PROMPTS)
    assert all(len(s) == 5 for s in res.sequences)
    assert set(res.stats.draft_length_trace()) <= {0, 1, 2}
    assert all(len(s) == 3 for s in gen.generate(PROMPTS, max_new_tokens=3).sequences)
    gen = Generator(llama, "ngram", policy="bass", config=cfg)
    assert type(gen.new_policy()).__name__ == "BassPolicy"


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
