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


def test_default_model_cached_copy_is_the_gguf_exactly(tmp_path, monkeypatch):
    """The de-quantized copy a second load reads back has the GGUF's weights, config and
    tokenizer exactly."""
    pytest.importorskip("gguf")
    from bass import load_default_pair

    monkeypatch.setenv("BASS_GGUF_CACHE", str(tmp_path))
    (main, tok), (again, tok2) = load_default_pair(), load_default_pair()
    assert len(list(tmp_path.iterdir())) == 2  # the model and the tokenizer
    differ = {"quantization_config", "_name_or_path"}  # a plain model, from another folder

    def config(model):
        return {k: v for k, v in model.config.to_dict().items() if k not in differ}

    assert type(again) is type(main) and config(again) == config(main)
    a, b = main.state_dict(), again.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    text = "def fib(n):\n    return n  # \u00e9 \u4e2d"
    assert tok2(text)["input_ids"] == tok(text)["input_ids"]
    assert tok2.eos_token_id == tok.eos_token_id and tok2.chat_template == tok.chat_template


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
