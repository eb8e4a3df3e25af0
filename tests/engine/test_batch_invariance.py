"""Batch invariance: every row of a batch comes out exactly as its prompt generated alone
(the main model's own greedy decoding), whatever the batch around it.

Over the length patterns of :mod:`bass.testing.strategies` (near-equal unsorted, sorted,
descending, one long outlier, bimodal, duplicates, a single row), every drafter (none,
n-grams, a draft model that always agrees, one that sometimes does), the built-in
policies and a per-row policy drawing random lengths, with eos and stop strings landing
mid-step so rows finish at different steps. Each pattern has a pinned example batch that
runs on every test run; hypothesis adds random ones (``ci`` profile: a few, ``thorough``:
many, with ``nox -s slow``).
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from profiles import examples

from bass import Generator
from bass.testing import assert_greedy_equivalent, greedy_reference
from bass.testing.strategies import LENGTH_PATTERNS, example_batches, ragged_prompts

VOCAB = 64
MAX_NEW = 10


class CharTokenizer:
    """Token ``t`` decodes to one character: stop strings over tiny random models."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(0x100 + t) for t in ids)


class RandomRows:
    """A per-row policy: every row's length drawn at random each step, 0 included."""

    def __init__(self, seed=0, k_max=4):
        self.rng, self.k_max = random.Random(seed), k_max

    def draft_length(self):
        raise AssertionError("draft_lengths is the contract used")

    def draft_lengths(self, ctx):
        return [self.rng.randint(0, self.k_max) for _ in ctx.prompts]

    def update(self, stats):
        pass


POLICIES = {
    "adaptive": lambda: ("adaptive", None),
    "bass": lambda: ("bass", None),
    "constant": lambda: ("constant", {"k": 3}),
    "random-rows": lambda: (RandomRows(), None),
}


def generator(llama, drafts, draft, policy):
    p, opts = POLICIES[policy]()
    return Generator(llama, drafts[draft], policy=p, policy_options=opts)


def finishing_kwargs(llama, prompts, how: str, pick: int) -> dict:
    """eos or a stop string taken from one row's own continuation, so that row (and
    maybe others) ends mid-generation, usually inside a speculative step."""
    if how == "length":
        return {}
    row = greedy_reference(llama, prompts[pick % len(prompts)], MAX_NEW)
    at = 2 + pick % (MAX_NEW - 4)
    if how == "eos":
        return {"eos_token_id": row[at]}
    tok = CharTokenizer()
    return {"stop_strings": [tok.decode(row[at : at + 2])], "tokenizer": tok}


@pytest.mark.parametrize("draft", ["none", "ngram", "same", "perturbed"])
@pytest.mark.parametrize("pattern", LENGTH_PATTERNS)
def test_every_pattern_example(llama, drafts, pattern, draft):
    prompts = example_batches(VOCAB)[pattern]
    gen = generator(llama, drafts, draft, "adaptive")
    assert_greedy_equivalent(gen, prompts, MAX_NEW)


@pytest.mark.parametrize("how", ["eos", "stop_string"])
@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize("draft", ["ngram", "same", "perturbed"])
def test_rows_finishing_mid_step(llama, drafts, draft, policy, how):
    prompts = example_batches(VOCAB, seed=1)["bimodal"]
    kw = finishing_kwargs(llama, prompts, how, pick=3)
    res = assert_greedy_equivalent(generator(llama, drafts, draft, policy), prompts, MAX_NEW, **kw)
    assert len({len(s) for s in res.sequences}) > 1  # rows ended at different steps


# a draw may draft nothing (rows that end at once, n-grams that never match: still a check
# of plain decoding), which bass.testing warns of; the examples as a whole draft
@pytest.mark.filterwarnings("ignore:assert_greedy_equivalent.. passed, but no draft token")
@settings(max_examples=examples(12), suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    prompts=ragged_prompts(VOCAB, max_rows=6, max_len=20),
    draft=st.sampled_from(["none", "ngram", "same", "perturbed"]),
    policy=st.sampled_from(sorted(POLICIES)),
    how=st.sampled_from(["length", "eos", "stop_string"]),
    pick=st.integers(0, 50),
    chunk=st.sampled_from([8192, 7]),
)
def test_random_batches(llama, drafts, prompts, draft, policy, how, pick, chunk):
    p, opts = POLICIES[policy]()
    gen = Generator(llama, drafts[draft], policy=p, policy_options=opts, prefill_chunk_tokens=chunk)
    kw = finishing_kwargs(llama, prompts, how, pick)
    assert_greedy_equivalent(gen, prompts, MAX_NEW, **kw)


@pytest.mark.parametrize("static", [False, True])
def test_compaction_and_static_shapes_keep_rows_exact(llama, drafts, static):
    """Many rows finishing one after another: amortised compaction runs several times
    (eager), or never (static shapes); either way rows stay exact."""
    prompts = [p for batch in example_batches(VOCAB, seed=2).values() for p in batch][:16]
    solo = greedy_reference(llama, prompts[0], 30)
    gen = Generator(llama, drafts["perturbed"], static_shapes=static)
    sizes = []
    res = assert_greedy_equivalent(
        gen,
        prompts,
        30,
        eos_token_id=solo[4],
        on_step=lambda g, s: sizes.append(g.cache.batch_size),
    )
    if static:
        assert set(sizes) == {len(prompts)}
    else:
        assert len(set(sizes)) >= 2  # compacted more than once... or at least once
    assert len(set(res.finish_reasons)) >= 1


@pytest.mark.parametrize("chunk", [8192, 7])
def test_prompt_logprobs_do_not_depend_on_the_batch(llama, drafts, chunk):
    """A row's prompt log-probabilities (computed by its prefill, chunked, in passes shared
    with other prompts, admitted as rows finish) and its tokens equal the prompt's alone."""
    prompts = example_batches(VOCAB, seed=3)["bimodal"]
    gen = Generator(llama, drafts["perturbed"], prefill_chunk_tokens=chunk)
    kw = dict(max_new_tokens=MAX_NEW, do_sample=False, prompt_logprobs=True)
    together = gen.generate(prompts, max_rows=3, **kw)
    for i, prompt in enumerate(prompts):
        alone = gen.generate([prompt], **kw)
        assert alone.sequences[0] == together.sequences[i]
        assert alone.prompt_logprobs[0][0] is together.prompt_logprobs[i][0] is None
        got, want = together.prompt_logprobs[i][1:], alone.prompt_logprobs[0][1:]
        assert got == pytest.approx(want, abs=1e-12)


@pytest.mark.parametrize("draft", ["ngram", "perturbed", "same"])
def test_samples_sharing_one_prefill_equal_each_sample_alone(llama, drafts, draft):
    """A prompt's ``n`` samples share one prefill (the main model's and a draft model's):
    admitted together (a pass of their own at the start, or riding in a verify pass as
    rows end) or after a sibling (its cache rows copied); each sampled row equals that
    sample generated alone, and the prefill computes each prompt once."""
    from bass.sampling import row_key

    prompts = example_batches(VOCAB, seed=4)["bimodal"][:3]
    gen = Generator(llama, drafts[draft], policy="constant", policy_options={"k": 2})
    kw = dict(max_new_tokens=MAX_NEW, do_sample=True, seed=3)
    first = gen.generate(prompts[:1], n=1, **kw).sequences[0]
    kw["eos_token_id"] = first[2]  # rows end at different steps: the others' samples ride
    res = gen.generate(prompts, n=3, max_rows=5, **kw)
    assert res.stats.riding_admissions >= 1
    # each prompt computed once; a sample admitted after it copies a running sibling's
    # cache rows and feeds one token (its prompt's last)
    total = sum(map(len, prompts))
    assert res.stats.prefill_tokens + res.stats.shared_prompt_tokens == 3 * total
    assert total < res.stats.prefill_tokens <= total + 2 * len(prompts)
    if draft == "same":  # the draft model's copied cache rows are right: it always agrees
        steps = res.stats.steps
        assert sum(sum(r.accepted) for r in steps) == sum(sum(r.drafted) for r in steps)
    for i, prompt in enumerate(prompts):
        for s in range(3):
            alone = gen.generate([prompt], row_ids=[row_key(i, s)], **kw)
            assert res.sequences[3 * i + s] == alone.sequences[0], (i, s)
