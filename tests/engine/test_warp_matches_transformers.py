"""bass's warping (temperature, top-k, top-p, min-p) keeps the tokens transformers' own warpers
keep, on logits with ties: bf16 logits tie often (a head of 4096 tokens at bf16's 8 bits of
mantissa), and top-p's edge falls inside a group of equal logits at a few percent of
positions. bass broke such ties the other way (its own sort): up to half of a position's
mass moved to other tokens than transformers' ``generate`` samples."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from bass.sampling import SamplingParams, warp_probs


def transformers_warp(logits, temperature, top_k, top_p, min_p=None):
    """``generate``'s warping, in its order: temperature, top-k, top-p, min-p."""
    x = logits.clone()
    if temperature != 1.0:
        x = TemperatureLogitsWarper(temperature)(None, x)
    if top_k is not None:
        x = TopKLogitsWarper(top_k=top_k)(None, x)
    if top_p is not None:
        x = TopPLogitsWarper(top_p=top_p)(None, x)
    if min_p is not None:
        x = MinPLogitsWarper(min_p=min_p)(None, x)
    return torch.softmax(x, -1)


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    vocab=st.sampled_from([8, 64, 1000]),
    levels=st.integers(2, 12),  # distinct logit values: ties in every row
    temperature=st.sampled_from([1.0, 0.7, 1.3]),
    top_k=st.one_of(st.none(), st.integers(1, 50)),
    top_p=st.floats(0.05, 0.99),
    min_p=st.one_of(st.none(), st.floats(0.0, 1.0)),
)
def test_the_tokens_kept_are_transformers_own_on_tied_logits(
    seed, vocab, levels, temperature, top_k, top_p, min_p
):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randint(0, levels, (16, vocab), generator=g).float() * 0.5  # [16, V]
    logits = logits.to(torch.bfloat16).float()  # as generate casts a bf16 model's logits
    ours = warp_probs(logits, SamplingParams(True, temperature, top_k, top_p, min_p))
    theirs = transformers_warp(logits, temperature, top_k, top_p, min_p)
    assert torch.equal(ours > 0, theirs > 0)
    torch.testing.assert_close(ours, theirs)


def test_all_equal_logits_keep_the_tokens_transformers_keeps():
    """Every logit equal, top_p=0.5: transformers keeps half of the tokens (those its sort
    puts last); bass kept the other half."""
    logits = torch.zeros(1, 8)
    ours = warp_probs(logits, SamplingParams(True, 1.0, None, 0.5))
    assert torch.equal(ours > 0, transformers_warp(logits, 1.0, None, 0.5) > 0)


def test_min_p_one_keeps_every_token_tied_with_the_likeliest():
    logits = torch.tensor([[1.0, 1.0, 0.0, 1.0]])
    ours = warp_probs(logits, SamplingParams(True, 1.0, None, None, 1.0))
    assert torch.equal(ours > 0, torch.tensor([[True, True, False, True]]))
    assert torch.equal(ours > 0, transformers_warp(logits, 1.0, None, None, 1.0) > 0)
