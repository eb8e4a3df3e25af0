"""Model families beyond the four the other suites use: tiny random models of each, run
through bass with n-gram drafts and a draft model (two rows at once: a prompt admitted as
another row runs), equal to the model's own greedy decoding; families whose attention bass
cannot compute exactly are refused by name."""

from __future__ import annotations

import pytest
import torch
import transformers
from models import perturbed

from bass import Generator, testing
from bass.hf import UnsupportedModelError

BASE = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    tie_word_embeddings=False,
)
HEAD8 = dict(head_dim=8)
NO_PAD = dict(pad_token_id=None)  # their default pad id lies past a 64-token vocabulary

# family: (config class, model class, config overrides)
SUPPORTED = {
    "gemma": ("GemmaConfig", "GemmaForCausalLM", HEAD8),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", HEAD8),
    "phi": ("PhiConfig", "PhiForCausalLM", {}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", NO_PAD),
    "granite": ("GraniteConfig", "GraniteForCausalLM", {}),
    "olmo": ("OlmoConfig", "OlmoForCausalLM", {}),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", {}),
    "starcoder2": ("Starcoder2Config", "Starcoder2ForCausalLM", {}),
    "cohere": ("CohereConfig", "CohereForCausalLM", {}),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", {}),
    "opt": (
        "OPTConfig",
        "OPTForCausalLM",
        dict(ffn_dim=64, word_embed_proj_dim=32, num_key_value_heads=4),
    ),
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM", NO_PAD),
    "glm": ("GlmConfig", "GlmForCausalLM", HEAD8 | NO_PAD),
    "glm4": ("Glm4Config", "Glm4ForCausalLM", HEAD8 | NO_PAD),
    "exaone4": ("Exaone4Config", "Exaone4ForCausalLM", {}),
    "qwen3_moe": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, head_dim=8),
    ),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(num_local_experts=4)),
}
REFUSED = {
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", HEAD8, "soft-capping"),
    "stablelm": ("StableLmConfig", "StableLmForCausalLM", {}, "AttentionInterface"),
    "falcon": ("FalconConfig", "FalconForCausalLM", {}, "AttentionInterface"),
}
MOE = {"qwen3_moe", "mixtral"}  # transformers' grouped expert products take no float64


def build(config_name, model_name, overrides, dtype=torch.float64):
    config_cls = getattr(transformers, config_name, None)
    model_cls = getattr(transformers, model_name, None)
    if config_cls is None or model_cls is None:
        pytest.skip(f"transformers {transformers.__version__} has no {model_name}")
    torch.manual_seed(0)
    model = model_cls(config_cls(**(BASE | overrides))).eval().to(dtype)
    with torch.no_grad():  # decisive greedy choices (as tests/models.py's tiny_lm)
        model.get_output_embeddings().weight.mul_(25.0)
    return model


def gpt2():
    config = transformers.GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=256)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).eval().double()
    with torch.no_grad():
        model.lm_head.weight.mul_(25.0)
    return model


PROMPTS = [[1, 2, 3, 4, 5, 1, 2, 3], [7, 8, 9], [10, 11, 12, 10, 11]]


@pytest.mark.parametrize("family", [*SUPPORTED, "gpt2"])
def test_family_greedy_equals_its_own_decoding(family):
    if family == "gpt2":
        model = gpt2()
    else:
        config_name, model_name, overrides = SUPPORTED[family]
        dtype = torch.float32 if family in MOE else torch.float64
        model = build(config_name, model_name, overrides, dtype)
    testing.assert_greedy_equivalent(Generator(model, "ngram"), PROMPTS, 12)
    draft = perturbed(model, scale=0.1)
    gen = Generator(model, draft, policy="constant", policy_options={"k": 3})
    # two rows at once: the third prompt is admitted when one finishes, its prompt fed in
    # the other row's verify pass (continuous batching), and its rows stay the model's own
    res = testing.assert_greedy_equivalent(gen, PROMPTS, 12, max_rows=2)
    assert res.stats.mean_accepted > 0  # the draft model's tokens were verified too
    assert res.stats.admissions == 2


@pytest.mark.parametrize("family", list(REFUSED))
def test_family_bass_cannot_compute_is_refused_by_name(family):
    config_name, model_name, overrides, why = REFUSED[family]
    model = build(config_name, model_name, overrides)
    with pytest.raises(UnsupportedModelError, match=f"{model_name}.*{why}|{why}.*"):
        Generator(model, "ngram").generate([[1, 2, 3]], max_new_tokens=4)
