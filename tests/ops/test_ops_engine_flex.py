"""The engine through ``flex``, the CUDA default, on the CPU: greedy equivalence with the
main model decoding each prompt alone, batch invariance, and one flex call per layer per
pass, in eager and compiled passes.

The suites' own tiny models are float64 with head dim 8, which flex does not take (they
would run the reference); these are float32 with head dim 32 (``hidden=128, heads=4``),
GQA 4/2, so every attention call is a FlexAttention kernel.
"""

from __future__ import annotations

import pytest
import torch
from models import perturbed, tiny_lm

from bass import Generator
from bass.ops import flex
from bass.testing import assert_greedy_equivalent, greedy_reference

PROMPTS = [[3, 7, 3, 7, 3, 7, 1], [5], [9, 2, 9, 2, 9, 2, 9, 2, 9, 2, 4, 4], [1, 2, 3]]


@pytest.fixture(scope="module")
def llama():
    return tiny_lm("llama", hidden=128, heads=4, kv_heads=2, dtype=torch.float32, seed=5)


@pytest.mark.parametrize("draft", ["ngram", pytest.param("model", marks=pytest.mark.slow)])
def test_eager_passes_are_greedy_equivalent_with_one_flex_call_per_layer(llama, draft, monkeypatch):
    calls = []
    real = flex._compiled
    monkeypatch.setattr(flex, "_compiled", lambda key: lambda *a: calls.append(1) or real(key)(*a))
    d = perturbed(llama) if draft == "model" else "ngram"
    gen = Generator(llama, d, attention="flex", policy="constant", policy_options={"k": 4})
    res = gen.generate(PROMPTS, max_new_tokens=12)
    passes = res.stats.main_passes + res.stats.draft_passes
    assert len(calls) == passes * llama.config.num_hidden_layers  # whatever the q lengths
    assert_greedy_equivalent(gen, PROMPTS, max_new_tokens=12)
    assert gen.passes.attention("cpu") == {"eager": "flex: named explicitly"}


def test_rows_come_out_as_alone(llama):
    gen = Generator(llama, "ngram", attention="flex")
    batch = gen.generate(PROMPTS, max_new_tokens=10).sequences
    for prompt, row in zip(PROMPTS, batch):
        assert gen.generate([prompt], max_new_tokens=10).sequences[0] == row


def test_compiled_passes_trace_flex_and_stay_equivalent(llama):
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    counter = CompileCounter()  # Dynamo's graphs, run eagerly: counts them, no Inductor
    # at most 3 tokens a step (a fixed draft length): more steps than graphs
    policy = dict(policy="constant", policy_options={"k": 2})
    gen = Generator(llama, perturbed(llama), attention="flex", compile=counter, **policy)
    res = gen.generate(PROMPTS, max_new_tokens=27)
    assert res.sequences == [greedy_reference(llama, p, 27) for p in PROMPTS]
    assert 0 < counter.frame_count <= 8 < len(res.stats.steps)
    picks = gen.passes.attention("cpu")
    assert picks["compiled"].startswith("flex") and picks["eager"].startswith("flex")


@pytest.mark.slow
def test_compiled_with_inductor_on_cpu(llama):
    """The C++ flex template inside Inductor's graph of the whole pass (minutes here)."""
    torch._dynamo.reset()
    gen = Generator(llama, "ngram", attention="flex", compile=True)
    res = gen.generate(PROMPTS, max_new_tokens=8)
    assert res.sequences == [greedy_reference(llama, p, 8) for p in PROMPTS]
