"""A draft and a main model of one tokenizer whose embedding matrices were padded to
different sizes (Qwen2.5 7B+: 152064 rows, 0.5B-3B: 151936, 151665 tokens): refused
without ``shared_vocab``, exact with it, whichever model is the larger."""

from __future__ import annotations

import copy

import pytest
import torch
from models import perturbed, tiny_lm

from bass import Generator, testing
from bass.drafters import make_drafter
from bass.models import padded_vocab, shared_vocab, vocab_agreement


def resized(model, rows: int, seed: int = 3):
    """A copy of ``model`` with ``rows`` embedding and output rows (the extra ones random,
    as padding rows of a released checkpoint are: a random model does emit them)."""
    out = copy.deepcopy(model)
    old = out.get_output_embeddings().weight.shape[0]
    out.resize_token_embeddings(rows, mean_resizing=False)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for emb in (out.get_input_embeddings(), out.get_output_embeddings()):
            w = emb.weight
            if rows > old:
                w[old:] = torch.randn(w[old:].shape, generator=g, dtype=w.dtype) * w[:old].std()
    return out


@pytest.fixture(scope="module")
def main72():
    return tiny_lm("llama", vocab=72)


@pytest.fixture(scope="module")
def draft64(main72):
    return perturbed(resized(main72, 64), scale=0.1)


def test_different_logit_counts_are_refused_with_what_to_do(main72, draft64):
    with pytest.raises(ValueError, match=r"draft model .* 64 logits, the main model .* 72.*"
                       r"shared_vocab=len\(tokenizer\)"):  # fmt: skip
        Generator(main72, draft64)
    for bad in (65, 80):
        with pytest.raises(ValueError, match=r"shared_vocab must be an int in \[1, 64\]"):
            Generator(main72, draft64, shared_vocab=bad)
    for bad in (0, 64.0, True):
        with pytest.raises(ValueError, match=rf"shared_vocab={bad!r} is not allowed; expected an "):
            Generator(main72, draft64, shared_vocab=bad)
    with pytest.raises(TypeError, match="draft must be a causal LM"):
        Generator(main72, True)


@pytest.mark.parametrize("bad", [0, -5, True, 2.0, "8", 65])
def test_make_drafter_checks_shared_vocab_itself(main72, draft64, bad):
    """bass.drafters.make_drafter is public: called without Generator() in front, a bad
    shared_vocab is refused there too (a negative one would silently cut the vocabulary)."""
    with pytest.raises(ValueError, match=r"shared_vocab must be an int in \[1, 64\]"):
        make_drafter(draft64, main72, bad)
    assert make_drafter(draft64, main72, 64).tokens == 64


def test_a_smaller_draft_vocabulary_is_exact_and_sees_main_tokens_it_cannot_embed(main72, draft64):
    """The main model emits ids the draft has no row for (64-71 here, padding in a real
    checkpoint); the draft is fed id 0 there, and the output stays the main model's."""
    gen = Generator(main72, draft64, shared_vocab=64, policy="constant", policy_options={"k": 3})
    prompts = [[1, 2, 3, 4, 5, 6], [7, 8, 9], [10, 11, 12, 13], [60, 61, 62, 63, 3]]
    res = testing.assert_greedy_equivalent(gen, prompts, 24)
    assert any(t >= 64 for seq in res.sequences for t in seq)  # the fed-as-0 path ran
    assert res.stats.mean_accepted > 0.5  # and drafts were accepted
    # prompts holding such ids too: the main model embeds them, the draft is fed 0
    res = testing.assert_greedy_equivalent(gen, [[1, 70, 2, 3], [64, 65, 71], [71]], 12)
    assert res.stats.mean_accepted > 0


def test_a_larger_draft_vocabulary_never_proposes_ids_past_the_shared_ones(main72):
    """A draft with more rows than the main model: its padding ids are never proposed
    (the main model's embedding has no row for them)."""
    main = resized(main72, 64)
    draft = perturbed(main72, scale=0.1)  # 72 rows, 64 shared
    gen = Generator(main, draft, shared_vocab=64, policy="constant", policy_options={"k": 3})
    res = testing.assert_greedy_equivalent(gen, [[1, 2, 3, 4], [5, 6, 7, 8, 9, 10]], 20)
    assert res.stats.mean_accepted > 0.5


@pytest.mark.parametrize("main_rows, draft_rows", [(6, 5), (5, 6)])
def test_sampling_with_padded_vocabularies_keeps_the_main_distribution(main_rows, draft_rows):
    """Rejection sampling with the draft's distribution zero past the shared tokens (and
    the main model's own over all of its rows): the main model's distribution exactly
    (chi-square over every 4-token continuation: room for drafts of 2)."""
    base = tiny_lm("llama", vocab=6, sharpen=3.0)
    main = resized(base, main_rows) if main_rows != 6 else base
    draft = perturbed(resized(base, draft_rows, seed=4) if draft_rows != 6 else base, 0.3)
    gen = Generator(main, draft, shared_vocab=5, policy="constant", policy_options={"k": 2})
    test = testing.assert_distribution_equivalent(
        gen, main, [1, 2, 3], 4, rows=3000, seed=5, temperature=1.0
    )
    assert test.df > 10


class _Tok:
    def __init__(self, vocab):
        self.vocab = vocab

    def get_vocab(self):
        return dict(self.vocab)

    def __len__(self):
        return len(self.vocab)


def test_tokenizers_are_compared_by_their_vocabularies(main72, draft64):
    a = _Tok({"a": 0, "b": 1, "c": 2})
    assert shared_vocab(a, _Tok({"a": 0, "b": 1, "c": 2})) == 3
    assert shared_vocab(a, _Tok({"a": 0, "b": 2, "c": 1})) is None
    # sources that cannot be loaded count as different tokenizers
    assert padded_vocab("/nonexistent/main", "/nonexistent/draft", main72, draft64) is None


def test_a_draft_tokenizer_that_gives_tokens_other_ids_is_reported(main72, draft64, monkeypatch):
    """Same logit counts, other token ids: exact output, useless drafts: said, not refused."""
    import bass.models

    toks = {
        "main": _Tok({"a": 0, "b": 1, "c": 2}),
        "same": _Tok({"a": 0, "b": 1, "c": 2}),
        "other": _Tok({"a": 0, "b": 2, "c": 1}),
    }
    monkeypatch.setattr(bass.models, "load_tokenizer", toks.__getitem__)
    said: list[str] = []
    assert padded_vocab("main", "same", main72, main72, warn=said.append) is None and not said
    assert padded_vocab("main", "other", main72, main72, warn=said.append) is None
    assert "the draft model other's tokenizer gives 67% of the main model's tokens" in said[0]
    with pytest.warns(UserWarning, match="its drafts will rarely be accepted"):
        padded_vocab("main", "other", main72, main72)
    assert vocab_agreement(toks["main"], toks["other"]) == pytest.approx(1 / 3)
    # other logit counts: one tokenizer is reconciled, another refused as what it is (not
    # with the advice to pass shared_vocab, which fits padded embeddings of one tokenizer)
    assert padded_vocab("main", "same", main72, draft64) == 3
    refused = r"^the draft model other \(64 logits\) does not share the main model main's "
    with pytest.raises(ValueError, match=refused + r"tokenizer \(72 logits; .* 67% .*'ngram'$"):
        padded_vocab("main", "other", main72, draft64)


def test_the_draft_hands_the_verifier_distributions_of_the_main_models_width(main72, draft64):
    gen = Generator(main72, draft64, shared_vocab=64)
    assert gen.drafter.out_vocab == 72 and gen.drafter.tokens == 64
    res = gen.generate([[1, 2, 3]], max_new_tokens=8, do_sample=True, seed=0)
    assert len(res.sequences[0]) == 8 and all(0 <= t < 72 for t in res.sequences[0])
