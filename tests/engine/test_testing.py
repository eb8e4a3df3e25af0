"""Tests of ``bass.testing`` itself: the oracles agree with the ops, the strategies draw
the patterns they name, the equivalence checks pass exact generators and fail broken
ones, and the stated power holds."""

from __future__ import annotations

import functools
import re
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from models import perturbed, tiny_lm

import bass
from bass import testing
from bass.drafters import Drafter, Proposal
from bass.testing import distribution
from bass.testing import strategies as bst

# --------------------------------------------------------------------------- oracles


@settings(max_examples=30, deadline=None)
@given(bst.attention_inputs())
def test_naive_oracle_matches_the_reference_op(args):
    out = torch.ops.bass.ragged_attention(*args, "reference")
    torch.testing.assert_close(out, testing.naive_ragged_attention(*args).to(out.dtype))


def test_op_strategies_draw_what_catches_wrong_kernels():
    """Over 120 draws: other scales than D**-0.5, views in memory (transposed, strided),
    NaN in q's padding, several rows with queries, rows longer than a 16-key tile, and
    values narrower than keys for the appends."""
    seen: Counter = Counter()

    @settings(max_examples=120, deadline=None, database=None)
    @given(bst.attention_inputs(), bst.packed_attention_inputs(), bst.kv_append_inputs())
    def draw(padded, packed, append):
        q, k, _, q_lens, kv_lens, scale = padded
        D = q.shape[-1]
        seen["other scale"] += scale != D**-0.5
        seen["strided k"] += not k.is_contiguous()
        seen["transposed q"] += q.stride(1) < q.stride(2)
        seen["nan q padding"] += bool((q_lens < q.shape[2]).any()) and bool(q.isnan().any())
        seen["long row"] += int(kv_lens.max()) > 16
        seen["rows with queries"] += int((q_lens > 0).sum()) >= 2
        pq, _, _, cu, _, _ = packed
        seen["nan packed padding"] += pq.shape[2] > int(cu[-1]) and bool(pq.isnan().any())
        seen["narrow values"] += append[1].shape[-1] < append[0].shape[-1]

    draw()
    assert all(seen[k] >= 5 for k in [
        "other scale", "strided k", "transposed q", "nan q padding", "long row",
        "rows with queries", "nan packed padding", "narrow values",
    ]), seen  # fmt: skip


@pytest.mark.parametrize("form", ["padded", "packed"])
def test_op_strategies_reach_past_a_key_tile(form):
    """A kernel wrong past its first 32-key tile is caught by a test of 30 examples at the
    defaults (max_s=40): over 200 draws, a query sees a key past 32 in 8% at least (about
    a fifth on average; under 4% before cache lengths favoured long rows)."""
    seen: Counter = Counter()
    strategy = bst.packed_attention_inputs() if form == "packed" else bst.attention_inputs()

    @settings(max_examples=200, deadline=None, database=None)
    @given(strategy)
    def draw(args):
        lens, kv_lens = args[3], args[4]
        q_lens = lens[1:] - lens[:-1] if form == "packed" else lens
        seen["past key 32"] += bool(((q_lens > 0) & (kv_lens > 32)).any())

    draw()
    assert seen["past key 32"] >= 16, seen


@settings(max_examples=30, deadline=None)
@given(bst.packed_attention_inputs())
def test_packed_oracle_is_the_padded_one_on_the_rows(args):
    """The packed oracle against the padded oracle on the same rows padded."""
    q, k, v, cu, kv, scale = args
    B, Hq, D = k.shape[0], q.shape[1], q.shape[3]
    q_lens = (cu[1:] - cu[:-1]).tolist()
    T = max([*q_lens, 1])
    padded = torch.zeros(B, Hq, T, D, dtype=q.dtype)
    for b in range(B):
        padded[b, :, : q_lens[b]] = q[0, :, cu[b] : cu[b + 1]]
    want = testing.naive_ragged_attention(padded, k, v, q_lens, kv, scale)
    got = testing.naive_ragged_attention_packed(*args)
    for b in range(B):
        torch.testing.assert_close(got[0, :, cu[b] : cu[b + 1]], want[b, :, : q_lens[b]])
    assert not got[0, :, int(cu[-1]) :].any()  # padding tokens: 0


@settings(max_examples=20, deadline=None)
@given(bst.packed_kv_append_inputs())
def test_packed_append_oracle_writes_only_row_slots(args):
    kc, _, _, _, cu, lens = args
    k_out, _ = testing.naive_kv_append_packed(*args)
    changed = (k_out != kc).any(dim=(1, 3))  # [B, S]
    for b in range(kc.shape[0]):
        n = int(cu[b + 1] - cu[b])
        allowed = torch.zeros(kc.shape[2], dtype=torch.bool)
        allowed[int(lens[b]) : int(lens[b]) + n] = True
        assert not (changed[b] & ~allowed).any()


# --------------------------------------------------------------------------- strategies


def check_pattern(name: str, lens: list[int], max_len: int = 24) -> None:
    assert all(1 <= n <= max(max_len, 40) for n in lens)
    if name == "single_row":
        assert len(lens) == 1
    elif name == "near_equal_unsorted":
        assert lens != sorted(lens) and max(lens) - min(lens) <= 7
    elif name == "sorted":
        assert lens == sorted(lens)
    elif name == "descending":
        assert lens == sorted(lens, reverse=True)
    elif name == "long_outlier":
        assert sorted(lens)[-1] >= 2 * sorted(lens)[-2] or max(lens) == max_len
    elif name == "duplicates":
        assert len(set(lens)) == 1 and len(lens) >= 2


@pytest.mark.parametrize("name", bst.LENGTH_PATTERNS)
def test_examples_follow_their_pattern(name):
    check_pattern(name, bst.EXAMPLE_LENGTHS[name], max_len=40)
    batch = bst.example_batches(64)[name]
    assert [len(p) for p in batch] == bst.EXAMPLE_LENGTHS[name]
    if name == "duplicates":
        assert all(p == batch[0] for p in batch)


@settings(max_examples=60, deadline=None)
@given(st.data(), st.sampled_from(bst.LENGTH_PATTERNS))
def test_drawn_lengths_follow_their_pattern(data, name):
    check_pattern(name, data.draw(bst.lengths(name)))


@settings(max_examples=30, deadline=None)
@given(bst.ragged_prompts(vocab_size=16))
def test_ragged_prompts_are_token_lists(prompts):
    assert prompts and all(p and all(0 <= t < 16 for t in p) for p in prompts)


def _oracle_call(case: str):
    attend, append = testing.naive_ragged_attention, testing.naive_kv_append
    q, kv, kv3 = torch.randn(1, 2, 3, 4), torch.randn(1, 1, 5, 4), torch.randn(3, 1, 5, 4)
    cache = torch.zeros(1, 2, 5, 4)
    cases = {  # each accepted before (a broadcast, a truncation) or failed deep in torch
        "batch": lambda: attend(q, kv3, kv3, [1], [2], 1.0),
        "head dim": lambda: attend(q, kv[..., :2], kv[..., :2], [1], [2], 1.0),
        "rank": lambda: attend(q[0], kv, kv, [1], [2], 1.0),
        "float lengths": lambda: attend(q, kv, kv, [1.7], [2], 1.0),
        "int q": lambda: attend(q.int(), kv, kv, [1], [2], 1.0),
        "heads": lambda: append(cache, cache.clone(), kv[..., :3, :], kv[..., :3, :], [0], [3]),
        "kv past S": lambda: attend(q, kv, kv, [1], [6], 1.0),
        "append past S": lambda: append(cache, cache.clone(), q[:, :, :2], q[:, :, :2], [4], [2]),
        "cu not from 0": lambda: testing.naive_ragged_attention_packed(q, kv, kv, [1, 2], [2], 1.0),
    }
    return cases[case]


@pytest.mark.parametrize(
    "case, match",
    [
        ("batch", "q has batch 1 but k/v have batch 3"),  # the ops' own words
        ("head dim", "q has head dim 4 but k/v have head dim 2"),
        ("rank", r"q must be 4-D \[B, Hq, T, D\]"),
        ("float lengths", "q_lens must hold integers"),
        ("int q", "q must be float16, bfloat16, float32 or float64, got torch.int32"),
        ("heads", r"new keys \[1, 1, 3, 4\] must be \[B=1, Hkv=2, T, D=4\]"),
        ("kv past S", r"naive_ragged_attention: row 0 has q_lens=1, kv_lens=6; expected kv_lens"),
        ("append past S", r"row 0 has new_lens=2, cache_lens=4; expected .* the cache is full"),
        ("cu not from 0", r"naive_ragged_attention_packed: cu_q_lens\[0\] must be 0"),
    ],
)
def test_the_oracles_refuse_what_the_ops_refuse(case, match):
    with pytest.raises((ValueError, TypeError), match=match):
        _oracle_call(case)()


def test_the_helpers_name_a_model_passed_for_a_generator_and_bad_prompts():
    model = tiny_lm("llama")
    for check in (testing.assert_greedy_equivalent, testing.assert_sampled_equivalent):
        with pytest.raises(TypeError, match=r"takes a bass.Generator .* got LlamaForCausalLM"):
            check(model, [[1, 2]], 2)
    with pytest.raises(TypeError, match=r"takes a bass\.Generator"):
        testing.assert_distribution_equivalent(model, model, [1, 2], 1, rows=10)
    with pytest.raises(ValueError, match=r"greedy_reference\(\): the prompt is empty"):
        testing.greedy_reference(model, [], 3)
    V = model.config.vocab_size
    with pytest.raises(
        ValueError,
        match=rf"exact_distribution\(\): the prompt has token ids outside \[0, {V}\): \[{V}\]",
    ):
        testing.exact_distribution(model, [1, V], 1)


def test_unknown_pattern_is_refused():
    with pytest.raises(ValueError, match="unknown length pattern 'zigzag'"):
        bst.lengths("zigzag")


@settings(max_examples=40, deadline=None)
@given(st.data(), st.integers(1, 3), st.integers(1, 3))
def test_small_bounds_are_kept(data, max_rows, max_len):
    """Every batch keeps its bounds, however small (one row, length 1: only the patterns
    that fit are drawn)."""
    lens = data.draw(bst.lengths(max_rows=max_rows, max_len=max_len))
    assert 1 <= len(lens) <= max_rows and all(1 <= n <= max_len for n in lens)
    prompts = data.draw(bst.ragged_prompts(5, max_rows=max_rows, max_len=max_len))
    assert 1 <= len(prompts) <= max_rows and all(1 <= len(p) <= max_len for p in prompts)


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: bst.lengths("bimodal", max_len=1), "no length pattern of .'bimodal'. fits"),
        (lambda: bst.lengths("sorted", max_rows=1), "need max_rows >= 2"),
        (lambda: bst.lengths(max_rows=0), "max_rows must be an int >= 1, got 0"),
        (lambda: bst.ragged_prompts(0), "vocab_size must be an int >= 1"),
        (lambda: bst.example_batches(0), r"example_batches\(\): vocab_size must be an int >= 1"),
        (lambda: bst.attention_inputs(max_t=5, max_s=3), "max_s=3 < max_t=5"),
        (lambda: bst.kv_append_inputs(max_batch=0), "max_batch must be an int >= 1"),
        (lambda: bst.attention_inputs(dtype=torch.int32), "dtype=torch.int32; .* floating"),
        (lambda: bst.packed_attention_inputs(dtype="float32"), "dtype=.float32.; .* floating"),
    ],
)
def test_bounds_a_strategy_cannot_keep_are_named(build, match):
    @settings(max_examples=1, database=None)
    @given(st.data())
    def draw(data):
        data.draw(build())

    with pytest.raises(ValueError, match=match):
        draw()


# --------------------------------------------------------------------------- greedy


@pytest.fixture(scope="module")
def llama():
    return tiny_lm("llama")


@pytest.mark.parametrize("draft", ["ngram", "perturbed", None])
def test_greedy_equivalence_passes_bass(llama, draft):
    d = perturbed(llama) if draft == "perturbed" else draft
    batch = bst.example_batches(64)["near_equal_unsorted"]  # the batch that found a bug
    res = testing.assert_greedy_equivalent(bass.Generator(llama, d), batch, 10)
    assert len(res.sequences) == len(batch)


def test_a_check_that_made_no_draft_says_so(llama):
    """A drafter whose policy never drafts passes every check vacuously: warned, for each
    check; a row too short to draft in is no warning."""
    gen = bass.Generator(llama, "ngram", policy="constant", policy_options={"k": 0})
    for check in (testing.assert_greedy_equivalent, testing.assert_sampled_equivalent):
        with pytest.warns(UserWarning, match=r"passed, but no draft token was made"):
            check(gen, [[1, 2, 1, 2], [3]], 6)
    testing.assert_greedy_equivalent(gen, [[1, 2, 1, 2]], 2)  # no room: no warning
    # a draft model drafts every step (n-grams may find no match: no draft either)
    drafting = bass.Generator(llama, perturbed(llama), policy="constant", policy_options={"k": 2})
    res = testing.assert_greedy_equivalent(drafting, [[1, 2, 1, 2, 1, 2]], 6)  # no warning
    assert max(res.stats.draft_lengths) > 0 and res.stats.drafted_tokens > 0


class NeverProposes(Drafter):
    name = "never-proposes"

    def propose(self, view, lengths):
        return Proposal(drafted=[0] * len(lengths), host_tokens=[[]] * len(lengths))


def test_a_drafter_that_proposes_nothing_is_no_draft_either(llama):
    """The policy allowed 3 tokens a row, the drafter made none: the warning reads what was
    drafted (it read the lengths allowed, and passed the checks silently)."""
    gen = bass.Generator(llama, NeverProposes(), policy="constant", policy_options={"k": 3})
    for check in (testing.assert_greedy_equivalent, testing.assert_sampled_equivalent):
        with pytest.warns(UserWarning, match=r"passed, but no draft token was made"):
            res = check(gen, [[1, 2, 1, 2], [3]], 6)
        assert max(res.stats.draft_lengths) == 3 and res.stats.drafted_tokens == 0


def test_a_sampled_check_without_a_seed_draws_one_for_both_runs(llama):
    """seed=None: each run drew its own seed, so a correct generator failed."""
    gen = bass.Generator(llama, perturbed(llama))
    testing.assert_sampled_equivalent(gen, [[1, 2, 1, 2], [3, 4]], 8, seed=None, temperature=4.0)


@pytest.mark.parametrize(
    ("kw", "said"),
    [
        ({"alpha": 0.0}, "alpha=0.0"),
        ({"alpha": -1.0}, "alpha=-1.0"),
        ({"alpha": float("nan")}, "alpha=nan"),
        ({"alpha": 1.0}, "alpha=1.0"),
        ({"rows": 1.5}, "rows=1.5"),
        ({"rows": 0}, "rows=0"),
        ({"do_sample": True}, "drop do_sample=True"),
    ],
)
def test_distribution_checks_refuse_settings_that_decide_nothing(llama, kw, said):
    """alpha=0 or NaN passed any generator (no p-value is below 0), alpha >= 1 failed any."""
    kw = {"rows": 100, **kw}
    with pytest.raises(ValueError, match=re.escape(said)):
        testing.assert_distribution_equivalent(bass.Generator(llama), llama, [1, 2], 2, **kw)


@dataclass
class Wrong:
    """A generator that corrupts one row's output."""

    main: object
    row: int
    at: int
    drop: bool = False

    def generate(self, prompts, **kw):
        res = bass.Generator(self.main).generate(prompts, **kw)
        seq = res.sequences[self.row]
        if self.drop:
            del seq[self.at :]
        else:
            seq[self.at] = (seq[self.at] + 1) % 64
        return res


def test_greedy_equivalence_names_the_row_position_and_tokens(llama):
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    with pytest.raises(AssertionError, match=r"row 2 .* new token 3: generator \d+, main"):
        testing.assert_greedy_equivalent(Wrong(llama, 2, 3), prompts, 6)
    with pytest.raises(AssertionError, match=r"row 1 .* stopped after 4 tokens"):
        testing.assert_greedy_equivalent(Wrong(llama, 1, 4, drop=True), prompts, 6)


def test_greedy_reference_cuts_at_eos_stop_sequences_and_strings(llama):
    full = testing.greedy_reference(llama, [1, 2, 3], 12)
    assert len(full) == 12
    eos = full[5]
    cut = full.index(eos) + 1
    assert testing.greedy_reference(llama, [1, 2, 3], 12, eos_token_id=eos) == full[:cut]
    stop = full[2:4]
    assert testing.greedy_reference(llama, [1, 2, 3], 12, stop_sequences=[stop])[-2:] == stop

    class Tok:  # token t decodes to chr(65 + t)
        def decode(self, ids, skip_special_tokens=True):
            return "".join(chr(65 + t) for t in ids)

    text = Tok().decode(full)
    got = testing.greedy_reference(llama, [1, 2, 3], 12, stop_strings=text[3:5], tokenizer=Tok())
    assert got == full[: text.index(text[3:5]) + 2]


# --------------------------------------------------------------------------- sampling

V = 5


@pytest.fixture(scope="module")
def pair():
    main = tiny_lm("llama", vocab=V, sharpen=3.0)
    draft = tiny_lm(
        "llama", vocab=V, seed=11, hidden=16, heads=2, kv_heads=1, layers=1, sharpen=3.0
    )
    return main, draft


def test_exact_distribution_sums_to_one_and_matches_a_direct_product(pair):
    main, _ = pair
    exact = testing.exact_distribution(main, [1, 2], 2, temperature=0.7, top_k=3)
    assert len(exact) == V**2 and sum(exact.values()) == pytest.approx(1.0)
    with torch.no_grad():
        ref = main.__class__(main.config).eval()  # same weights, plain attention
        ref.load_state_dict(main.state_dict())
        ref = ref.to(torch.float64)
        p1 = bass.sampling.warp_probs(
            ref(torch.tensor([[1, 2]])).logits[0, -1], bass.SamplingParams(True, 0.7, 3)
        )
        p2 = bass.sampling.warp_probs(
            ref(torch.tensor([[1, 2, 4]])).logits[0, -1], bass.SamplingParams(True, 0.7, 3)
        )
    assert exact[(4, 0)] == pytest.approx(float(p1[4] * p2[0]))
    with pytest.raises(ValueError, match="too many to enumerate"):
        testing.exact_distribution(tiny_lm("llama"), [1], 4)  # 64**4


@pytest.mark.parametrize("drafter", ["model", "ngram"])
def test_distribution_check_passes_lossless_sampling(pair, drafter):
    main, draft = pair
    gen = bass.Generator(
        main, draft if drafter == "model" else "ngram", policy="constant", policy_options={"k": 2}
    )
    test = testing.assert_distribution_equivalent(
        gen, main, [1, 2, 3], 4, rows=3000, seed=5, temperature=1.0
    )
    assert test.df > 10


def test_distribution_check_fails_a_generator_that_keeps_every_draft(pair):
    main, draft = pair
    gen = bass.Generator(
        main, draft, policy="constant", policy_options={"k": 2}, forced_acceptance=1.0
    )
    with pytest.raises(AssertionError, match=r"chi-square .* degrees of freedom, p = .* < alpha"):
        testing.assert_distribution_equivalent(gen, main, [1, 2, 3], 4, rows=3000, seed=5)


def test_chi_square_test_refuses_samples_too_few_to_fail():
    """125 equally likely outcomes, 600 samples all on one: every outcome is expected under
    5 times, so the pooled test would have one cell and could not reject anything."""
    uniform = {i: 1 / 125 for i in range(125)}
    with pytest.raises(ValueError, match=r"600 samples are too few .* at least 62\d samples"):
        testing.chi_square_test({0: 600}, uniform)
    assert testing.chi_square_test({0: 700}, uniform).p_value == 0.0  # now it can fail
    assert testing.chi_square_test({"a": 3}, {"a": 1.0, "b": 0.0}).p_value == 1.0


def test_chi_square_test_basics():
    exact = {"a": 0.5, "b": 0.5, "c": 0.0}
    assert testing.chi_square_test({"a": 50, "b": 50}, exact).p_value == pytest.approx(1.0)
    assert testing.chi_square_test({"a": 50, "b": 49, "c": 1}, exact).p_value == 0.0
    scipy = pytest.importorskip("scipy.stats")
    counts = {"a": 60, "b": 40}
    ours = testing.chi_square_test(counts, exact)
    theirs = scipy.chisquare([60, 40], [50, 50])
    assert ours.statistic == pytest.approx(theirs.statistic)
    assert ours.p_value == pytest.approx(theirs.pvalue)


def test_stated_power():
    """The power stated in assert_distribution_equivalent's docstring for its test of the
    whole continuations: 125 equally likely outcomes, rows=4000, at the level it runs at
    there (alpha=1e-3 over 6 tests), half the outcomes 20% more likely (TV 0.1): > 0.99;
    10% (TV 0.05): ~0.12, ~0.73 at rows=8000 (the noncentral chi-square approximation,
    checked with scipy)."""
    exact = {i: 1 / 125 for i in range(125)}
    level = 1e-3 / 6  # 3 new tokens: the continuations, 3 positions, 2 adjacent pairs

    def shifted(d):
        return {i: (1 + (d if i % 2 else -d)) / 125 for i in range(125)}

    def renorm(q):
        s = sum(q.values())
        return {i: p / s for i, p in q.items()}

    assert len(distribution._views(3)) + 1 == 6
    power = functools.partial(testing.chi_square_power, exact, alpha=level)
    assert power(renorm(shifted(0.2)), 4000, trials=200) > 0.99
    weak = power(renorm(shifted(0.1)), 4000, trials=400)
    assert 0.06 < weak < 0.2
    null = testing.chi_square_power(exact, exact, 4000, alpha=0.05, trials=400)
    assert null < 0.1  # the false-alarm rate is alpha
    ncx2 = pytest.importorskip("scipy.stats").ncx2
    chi2 = pytest.importorskip("scipy.stats").chi2
    crit = chi2.isf(level, 124)
    assert ncx2.sf(crit, 124, 4000 * 0.1**2) == pytest.approx(0.12, abs=0.01)
    assert ncx2.sf(crit, 124, 8000 * 0.1**2) == pytest.approx(0.73, abs=0.01)
    assert ncx2.sf(crit, 124, 4000 * 0.2**2) > 0.99


def test_samples_and_counts(pair):
    main, _ = pair
    exact = testing.exact_distribution(main, [1], 1)
    counts = Counter(
        tuple(s)
        for s in bass.Generator(main)
        .generate([[1]] * 500, max_new_tokens=1, do_sample=True, seed=0)
        .sequences
    )
    assert testing.chi_square_test(counts, exact).p_value > 1e-3


def test_import_without_hypothesis():
    code = (
        "import sys; sys.modules['hypothesis'] = None\n"
        "import bass.testing\n"
        "try:\n    import bass.testing.strategies\nexcept ImportError:\n    print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ok"
