"""Sliding-window attention past the window (Mistral, Gemma 2/3, gpt-oss, Cohere 2, Phi-3,
Starcoder 2, Qwen2 with sliding layers): beyond the ops' contract, computed by the
reference or flex (:func:`bass.hf.needs`); generations longer than the window equal the
model's own greedy decoding, with n-gram drafts, a draft model and rows admitted as others
finish. The window is 4 tokens here, the generations 8 + 20: it changes these models'
tokens (checked), so a bass that ignored it would fail."""

from __future__ import annotations

import pytest
import torch
from models import perturbed, tiny_lm
from test_families import BASE, EAGER, HEAD8, MOE, NO_PAD, PROMPTS, build, no_reference

from bass import Generator, hf, testing
from bass.errors import UnsupportedModelError

WINDOW = dict(sliding_window=4)
# family: (config class, model class, config overrides); their layers slide (every layer,
# or alternate ones: Gemma 2/3, gpt-oss, Cohere 2, Qwen2's upper layers)
WINDOWED = {
    "mistral": ("MistralConfig", "MistralForCausalLM", {}),
    "gemma2": (
        "Gemma2Config",
        "Gemma2ForCausalLM",
        HEAD8 | EAGER | dict(attn_logit_softcapping=1.0),
    ),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", HEAD8),
    "gpt_oss": (
        "GptOssConfig",
        "GptOssForCausalLM",
        HEAD8 | EAGER | dict(num_local_experts=4, num_experts_per_tok=2),
    ),
    "cohere2": ("Cohere2Config", "Cohere2ForCausalLM", NO_PAD),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", NO_PAD),
    "starcoder2": ("Starcoder2Config", "Starcoder2ForCausalLM", {}),
    "qwen2": (
        "Qwen2Config",
        "Qwen2ForCausalLM",
        dict(use_sliding_window=True, max_window_layers=1),
    ),
}
NEW = 20


def windowed(family, window=4, dtype=None, **extra):
    config_name, model_name, overrides = WINDOWED[family]
    dtype = dtype or (torch.float32 if family in MOE else torch.float64)
    model = build(config_name, model_name, overrides | extra | dict(sliding_window=window), dtype)
    with torch.no_grad():  # scores spread enough that what a window hides changes tokens
        for layer in model.model.layers:
            for name, proj in layer.self_attn.named_children():
                if name in ("q_proj", "k_proj", "qkv_proj"):  # Phi-3's fused
                    proj.weight.mul_(4.0)
    return model


@pytest.mark.parametrize("family", list(WINDOWED))
def test_generations_past_the_window_equal_the_models_own_decoding(family):
    model = windowed(family)
    assert hf.sliding_window(model) == 4
    res = testing.assert_greedy_equivalent(Generator(model, "ngram"), PROMPTS, NEW, max_rows=2)
    assert all("sliding-window attention" in v for v in res.stats.attention.values())
    # a draft model with the same window, drafting three tokens a step
    gen = Generator(model, perturbed(model, scale=0.1), policy="constant", policy_options={"k": 3})
    drafted = testing.assert_greedy_equivalent(gen, PROMPTS, NEW, max_rows=2)
    assert drafted.stats.mean_accepted > 0 and drafted.stats.admissions == 2
    # the window matters here: the same weights with a window past the generation (the
    # ops' own attention) give other tokens
    wide = windowed(family, window=1000)
    assert hf.needs(wide, fed=40) == hf.needs(model, fed=3)  # nothing for the window
    assert Generator(wide, "ngram").generate(PROMPTS, max_new_tokens=NEW).sequences != res.sequences


def test_flex_computes_the_window_on_a_cpu(monkeypatch):
    """float32 with a head dim flex takes on a CPU: ``auto`` runs flex with the window in
    its score_mod (Gemma 3: sliding layers and full ones in the same pass), never the
    reference; the reference, asked for, gives the same tokens."""
    from bass.ops import reference

    model = windowed("gemma3", dtype=torch.float32, head_dim=32)
    with monkeypatch.context() as mp:
        mp.setattr(reference, "attention", no_reference)
        res = testing.assert_greedy_equivalent(Generator(model, "ngram"), PROMPTS, NEW, max_rows=2)
    assert res.stats.attention["eager"].startswith("flex: the model's sliding-window attention")
    ref = Generator(model, "ngram", attention="sdpa").generate(PROMPTS, max_new_tokens=NEW)
    assert ref.stats.attention["eager"].startswith("reference: the model's sliding-window")
    assert ref.sequences == res.sequences


@pytest.mark.slow  # a first compile of ~40 s on 2 cores
def test_the_window_in_compiled_passes(monkeypatch):
    from bass.ops import reference

    model = windowed("gemma3", dtype=torch.float32, head_dim=32)
    monkeypatch.setattr(reference, "attention", no_reference)  # flex, traced, every layer
    gen = Generator(model, "ngram", compile=True)
    res = testing.assert_greedy_equivalent(gen, PROMPTS, NEW)
    assert res.stats.attention["compiled"].startswith("flex: the model's sliding-window")


def test_a_generation_within_the_window_runs_the_ops_own_attention():
    """A window no generation position reaches needs nothing: the contract's attention (the
    longest prompt plus max_new_tokens, less the last new token never fed back, within it)."""
    model = tiny_lm("mistral")
    model.config.sliding_window = 13  # Mistral reads its config's window in each forward
    prompts = [[1, 2, 3, 4, 5], [6, 7, 8]]
    res = testing.assert_greedy_equivalent(Generator(model, "ngram"), prompts, 9)  # 13 fed
    assert "sliding" not in res.stats.attention["eager"]
    past = testing.assert_greedy_equivalent(Generator(model, model), prompts, 10)  # 14 fed
    assert "sliding-window" in past.stats.attention["eager"]


def test_each_model_is_planned_by_its_own_window():
    """A main model whose window the generation stays within, beside a draft whose window
    it outgrows: the cache is not rounded past the main model's window, so its passes run
    the ops' own attention while the draft's compute its window."""
    main, draft = tiny_lm("mistral"), tiny_lm("mistral", seed=1)
    main.config.sliding_window, draft.config.sliding_window = 12, 4
    gen = Generator(main, draft, policy="constant", policy_options={"k": 2})
    res = testing.assert_greedy_equivalent(gen, [[1, 2, 3, 4, 5, 6, 7, 8]], 2)  # 9 fed
    assert "sliding" not in res.stats.attention["eager"]
    assert "sliding-window" in res.stats.attention["draft eager"]


def test_a_window_the_layers_never_pass_is_refused_by_name():
    """A config with a window whose layers pass none to their attention function (Llama's
    ignore one): bass cannot tell which layers slide, so it refuses past the window instead
    of guessing."""
    model = tiny_lm("llama")
    model.config.sliding_window = 4
    with pytest.raises(UnsupportedModelError, match="LlamaForCausalLM's config sets a sliding"):
        Generator(model, "ngram").generate(PROMPTS, max_new_tokens=NEW)
    Generator(model, "ngram").generate([[1, 2, 3]], max_new_tokens=2)  # within it: runs


def test_padded_calls_refuse_a_window_shorter_than_the_cache():
    """``ragged_attention``'s padded form (a model called with ``bass_q_lens``) computes the
    contract only: a layer whose window hides cached keys is refused, not computed full."""
    q = torch.randn(1, 4, 2, 8)
    k = v = torch.zeros(1, 2, 6, 8)
    lens = dict(bass_q_lens=torch.tensor([2], dtype=torch.int32))
    lens["bass_kv_lens"] = torch.tensor([6], dtype=torch.int32)
    attn = torch.nn.Module()
    with pytest.raises(UnsupportedModelError, match="sliding window shorter than the cache"):
        hf.bass_attention_forward(attn, q, k, v, None, sliding_window=4, **lens)
    out, _ = hf.bass_attention_forward(attn, q, k, v, None, sliding_window=6, **lens)
    assert out.shape == (1, 2, 4, 8)


assert BASE  # the families' base config (test_families), which build() applies
