"""Minutes-long checks (``nox -s slow``): the embedded default model and compiled paths."""

from __future__ import annotations

import pytest
import torch
from models import perturbed, tiny_lm

from bass import Generator
from bass.testing import assert_greedy_equivalent

pytestmark = pytest.mark.slow


def test_default_model_rows_are_exact():
    """SmolLM2-135M with n-gram drafting and the default policy: every row of ragged,
    unsorted, duplicated chat and code prompts equals the model decoding it alone."""
    pytest.importorskip("gguf")
    from bass import load_default_pair
    from bass.models import encode_prompt

    main, tok = load_default_pair()
    texts = ["def fib(n):", "Write a haiku about the sea.", "List three colors.", "def add(a, b):"]
    prompts = [encode_prompt(tok, t, chat=not t.startswith("def")) for t in texts]
    prompts = [prompts[2], prompts[0], prompts[1], prompts[0], prompts[3]]  # unsorted, a dup
    gen = Generator(main, "ngram")
    assert_greedy_equivalent(gen, prompts, 24, eos_token_id=tok.eos_token_id)


def test_reduce_overhead_compile_matches_eager_on_cpu():
    """compile="reduce-overhead" (static shapes; CUDA graphs on a GPU, plain Inductor
    here) gives the eager output; its graphs are one per model, pass kind and bucket."""
    torch._dynamo.reset()
    main = tiny_lm("llama")
    draft = perturbed(main)
    prompts = [[1, 2, 3, 4, 5], [7, 8], [9, 10, 11, 12, 13, 14, 15, 16, 3], [5], [6, 6, 6, 2]]
    eager = Generator(main, draft).generate(prompts, max_new_tokens=20)
    res = Generator(main, draft, compile="reduce-overhead").generate(prompts, max_new_tokens=20)
    assert res.sequences == eager.sequences
    assert res.stats.padding_share > 0  # bucketed token counts
