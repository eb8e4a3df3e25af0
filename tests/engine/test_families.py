"""Model families beyond the four the other suites use: tiny random models of each, run
through bass with n-gram drafts and a draft model (two rows at once: a prompt admitted as
another row runs), equal to the model's own greedy decoding (logit soft-capping and attention sinks
included); families whose attention bass cannot reach are refused by name."""

from __future__ import annotations

import pytest
import torch
import transformers
from models import perturbed
from packaging.version import Version

from bass import Generator, compat, hf, passes, testing
from bass.cache import RaggedKVCache
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
LLAMA4 = HEAD8 | NO_PAD | dict(attention_chunk_size=None, no_rope_layers=[1, 0])
LLAMA4 |= dict(num_local_experts=4, num_experts_per_tok=1, intermediate_size_mlp=64)

# family: (config class, model class, config overrides)
SUPPORTED = {
    "gemma": ("GemmaConfig", "GemmaForCausalLM", HEAD8),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", HEAD8),
    # head dims that differ per layer (global layers': 16), read per layer (bass.compat)
    "gemma4": ("Gemma4TextConfig", "Gemma4ForCausalLM", HEAD8 | NO_PAD | dict(global_head_dim=16)),
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
    # Llama 4 without chunked attention, its layers without rotary embeddings untuned
    "llama4": (
        "Llama4TextConfig",
        "Llama4ForCausalLM",
        LLAMA4 | dict(attn_temperature_tuning=False),
    ),
    # a BERT-like built as a decoder (causal); without is_decoder it is refused (REFUSED)
    "roberta_decoder": ("RobertaConfig", "RobertaForCausalLM", dict(is_decoder=True)),
}
# attention beyond the ops' contract, computed by bass's attention function (bass.hf): logit
# soft-capping (Gemma 2, a cap small enough to bend these scores) and sinks (gpt-oss);
# their own decoding in eager attention (transformers 5.3's sdpa drops Gemma 2's cap)
EAGER = dict(attn_implementation="eager")
BEYOND = {
    "gemma2": (
        "Gemma2Config",
        "Gemma2ForCausalLM",
        HEAD8 | EAGER | dict(attn_logit_softcapping=1.0),
    ),
    "gpt_oss": (
        "GptOssConfig",
        "GptOssForCausalLM",
        HEAD8 | EAGER | dict(num_local_experts=4, num_experts_per_tok=2),
    ),
}
SUPPORTED |= BEYOND
# multi-head latent attention: values narrower than keys (and, from transformers 5.24, the
# cache holds the compressed latents), computed by the reference too
MLA = dict(kv_lora_rank=16, q_lora_rank=None, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=4)
MLA |= dict(num_key_value_heads=4)  # transformers repeats no latent heads
MLA_MOE = dict(n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16)
LATENT = {
    "deepseek_v3": (
        "DeepseekV3Config",
        "DeepseekV3ForCausalLM",
        MLA | MLA_MOE | dict(first_k_dense_replace=1, n_group=1, topk_group=1),
    ),
    "deepseek_v2": ("DeepseekV2Config", "DeepseekV2ForCausalLM", MLA | MLA_MOE),
    "minicpm3": ("MiniCPM3Config", "MiniCPM3ForCausalLM", MLA | NO_PAD),
}
SUPPORTED |= LATENT
REFUSED = {
    "stablelm": ("StableLmConfig", "StableLmForCausalLM", {}, "AttentionInterface"),
    "falcon": ("FalconConfig", "FalconForCausalLM", {}, "AttentionInterface"),
    "roberta": ("RobertaConfig", "RobertaForCausalLM", {}, "attention is not causal"),
    # layers that are not attention (hybrids: named by their layer types)
    "lfm2": ("Lfm2Config", "Lfm2ForCausalLM", dict(layer_types=["conv", "full_attention"]), "conv"),
    "qwen3_next": (
        "Qwen3NextConfig",
        "Qwen3NextForCausalLM",
        dict(layer_types=["linear_attention", "full_attention"], linear_num_value_heads=4)
        | dict(linear_num_key_heads=2, linear_key_head_dim=8, linear_value_head_dim=8),
        "layers of types",
    ),
    # a recurrent state, named by transformers' stateful mark where no layer types say it
    "rwkv": (
        "RwkvConfig",
        "RwkvForCausalLM",
        dict(attention_hidden_size=32, context_length=64),
        "keeps a recurrent state",
    ),
    "mamba": ("MambaConfig", "MambaForCausalLM", dict(state_size=4), "recurrent state|types"),
    "jamba": (
        "JambaConfig",
        "JambaForCausalLM",
        dict(attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2, num_experts=2)
        | dict(mamba_d_state=4),
        "recurrent state|types",
    ),
    # its layers without rotary embeddings scale queries by positions read from the cache
    "llama4_tuned": (
        "Llama4TextConfig",
        "Llama4ForCausalLM",
        LLAMA4 | dict(attn_temperature_tuning=True),
        "Llama4TextAttention scales its queries by their positions",
    ),
    # their forwards read parts of transformers' Cache bass's cache lacks
    "dory": ("DoryConfig", "DoryForCausalLM", {}, "reads 'layers' of transformers' Cache"),
    "hrm": ("HrmTextConfig", "HrmTextForCausalLM", {}, "reads 'is_initialized'"),
    # its decoder layers drop the forward's kwargs that carry bass's lengths (5.24; before,
    # it had no AttentionInterface)
    "nemotron": (
        "NemotronConfig",
        "NemotronForCausalLM",
        {},
        "does not hand the keyword arguments|AttentionInterface",
    ),
}
MOE = {
    "llama4",
    "qwen3_moe",
    "mixtral",
    "gpt_oss",
    "deepseek_v3",
    "deepseek_v2",
}  # transformers' grouped expert products take no float64


def build(config_name, model_name, overrides, dtype=torch.float64):
    config_cls = getattr(transformers, config_name, None)
    model_cls = getattr(transformers, model_name, None)
    if config_cls is None or model_cls is None:
        pytest.skip(f"transformers {transformers.__version__} has no {model_name}")
    torch.manual_seed(0)
    config = config_cls(**(BASE | overrides))
    chunked = "chunked_attention" in (getattr(config, "layer_types", None) or [])
    if chunked and "chunked_attention" not in str(overrides):  # Llama 4 before 5.24 or so
        pytest.skip(f"transformers {transformers.__version__} chunks {model_name}'s attention")
    model = model_cls(config).eval().to(dtype)
    with torch.no_grad():  # decisive greedy choices (as tests/models.py's tiny_lm)
        model.get_output_embeddings().weight.mul_(25.0)
        if model_name in {m for _, m, _ in BEYOND.values()}:  # scores large enough that a
            for layer in model.model.layers:  # cap or a sink changes the attention
                layer.self_attn.q_proj.weight.mul_(8.0)
                layer.self_attn.k_proj.weight.mul_(8.0)
                if hasattr(layer.self_attn, "sinks"):
                    layer.self_attn.sinks.normal_(0.0, 2.0)
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
    # what ran, as the statistics say: the reference where the model needs more
    beyond = [v.startswith("reference: the model's") for v in res.stats.attention.values()]
    assert beyond == [family in BEYOND or family in LATENT] * len(beyond)


@pytest.mark.parametrize("family", list(BEYOND))
def test_the_cap_and_the_sinks_change_these_models_outputs(family):
    """The soft-capping and sinks families above would pass without bass computing them
    only if they made no difference: they do, to the model's own logits."""
    config_name, model_name, overrides = BEYOND[family]
    model = build(config_name, model_name, overrides, torch.float32)
    ids = torch.tensor([PROMPTS[0]])
    with torch.no_grad():
        full = model(ids).logits
        for layer in model.model.layers:
            if family == "gemma2":
                layer.self_attn.attn_logit_softcapping = None
            else:
                layer.self_attn.sinks.fill_(-1e4)  # a sink no query attends to
        without = model(ids).logits
    assert (full - without).abs().max() > 1e-2


@pytest.mark.parametrize("family", list(REFUSED))
def test_family_bass_cannot_compute_is_refused_by_name(family):
    config_name, model_name, overrides, why = REFUSED[family]
    model = build(config_name, model_name, overrides)
    with pytest.raises(UnsupportedModelError, match=f"{model_name}.*{why}|{why}.*"):
        Generator(model, "ngram").generate([[1, 2, 3]], max_new_tokens=4)


def test_a_layer_asking_the_cache_for_its_length_is_refused_naming_the_model(monkeypatch):
    """Past the up-front check (a model it does not know): Llama 4's tuned layer asks
    bass's cache for its length in the first pass, refused naming the model."""
    from bass.cache import LayerReadsLength

    model = build(*REFUSED["llama4_tuned"][:3])
    monkeypatch.setattr(compat, "scales_queries_by_position", lambda module: False)
    with pytest.raises(LayerReadsLength, match="layer 1 of Llama4ForCausalLM asks the cache"):
        Generator(model, "ngram").generate([[1, 2, 3]], max_new_tokens=4)


# Gemma 2 in float32 with a head dim flex takes on a CPU (>= 32): its cap runs as flex's
# score_mod (float64 and head dims of 8 above run the reference)
FLEX_GEMMA2 = ("Gemma2Config", "Gemma2ForCausalLM", BEYOND["gemma2"][2] | dict(head_dim=32))


def counting_flex(monkeypatch) -> list:
    from bass.ops import flex

    calls, real = [], flex.run
    monkeypatch.setattr(flex, "run", lambda *a, **kw: calls.append(a[-1]) or real(*a, **kw))
    return calls


def no_reference(*args, **kwargs):
    raise AssertionError("the reference attention ran")


def test_soft_capping_runs_flex_with_the_cap_as_a_score_mod(monkeypatch):
    from bass.ops import reference

    model = build(*FLEX_GEMMA2, torch.float32)
    calls = counting_flex(monkeypatch)
    with monkeypatch.context() as mp:
        mp.setattr(reference, "attention", no_reference)  # flex computes every layer
        res = testing.assert_greedy_equivalent(Generator(model, "ngram"), PROMPTS, 10, max_rows=2)
    assert res.stats.attention["eager"].startswith("flex: the model's logit soft-capping")
    assert calls and set(calls) == {1.0}  # with the model's cap
    # asked for another implementation, the reference computes the cap
    calls.clear()
    ref = Generator(model, "ngram", attention="sdpa").generate(PROMPTS, max_new_tokens=10)
    assert ref.stats.attention["eager"].startswith("reference: the model's logit soft-capping")
    assert not calls and ref.sequences == res.sequences
    # a draft model flex does not take (head dim 8): the statistics name its passes' too
    config_name, model_name, overrides = FLEX_GEMMA2
    draft = build(config_name, model_name, overrides | dict(head_dim=8), torch.float32)
    gen = Generator(model, draft, policy="constant", policy_options={"k": 2})
    both = gen.generate(PROMPTS, max_new_tokens=10)
    assert both.stats.attention["eager"].startswith("flex: the model's logit soft-capping")
    assert both.stats.attention["draft eager"].startswith("reference: the model's logit")
    assert both.sequences == res.sequences


def test_the_cap_planned_is_the_one_the_layers_pass():
    """A compiled pass reads the plan's cap (bass.hf.needs): the layers' own, which they
    hand their attention, not the config's (edited after the model was built here); a
    cap of 0 is none."""
    from bass import hf

    model = build(*FLEX_GEMMA2, torch.float32)
    model.config.attn_logit_softcapping = 1000.0
    assert hf.needs(model) == hf.Beyond(hf.SOFTCAP, 1.0, True)
    assert hf.needs(model.double()).flex is False
    for layer in model.model.layers:
        layer.self_attn.attn_logit_softcapping = 0.0
    model.config.attn_logit_softcapping = 0.0
    assert hf.needs(model) is None


@pytest.mark.slow  # a first compile of ~40 s on 2 cores
@pytest.mark.parametrize("head_dim", [8, 32])
def test_soft_capping_runs_in_compiled_passes(head_dim, monkeypatch):
    from bass.ops import reference

    config_name, model_name, overrides = FLEX_GEMMA2
    model = build(config_name, model_name, overrides | dict(head_dim=head_dim), torch.float32)
    model.config.attn_logit_softcapping = 1000.0  # the layers keep theirs (1.0): bass too
    if head_dim == 32:  # flex computes every layer, traced
        monkeypatch.setattr(reference, "attention", no_reference)
    res = testing.assert_greedy_equivalent(Generator(model, "ngram", compile=True), PROMPTS, 10)
    impl = "flex" if head_dim == 32 else "reference"
    assert res.stats.attention["compiled"].startswith(f"{impl}: the model's logit soft-capping")


def multimodal(name: str):
    """A tiny multimodal model (its text model as BASE), or a skip where this transformers
    lacks it."""
    if not hasattr(transformers, f"{name}ForConditionalGeneration"):
        pytest.skip(f"transformers {transformers.__version__} has no {name}")
    vision = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2)
    if name == "GotOcr2":
        vision |= dict(image_size=64, patch_size=16, output_channels=32, mlp_dim=64)
        extra = dict(image_token_index=63)
    else:  # Gemma3: a SigLIP vision tower (bidirectional attention)
        vision |= dict(image_size=32, patch_size=16, intermediate_size=32)
        extra = dict(mm_tokens_per_image=4, image_token_index=63, boi_token_index=61)
        extra |= dict(eoi_token_index=62)
    text = BASE | (HEAD8 if name == "Gemma3" else {})
    config = getattr(transformers, f"{name}Config")(text_config=text, vision_config=vision, **extra)
    torch.manual_seed(0)
    model = getattr(transformers, f"{name}ForConditionalGeneration")(config).eval().double()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(25.0)
    return model


@pytest.mark.parametrize("name", ["GotOcr2", "Gemma3"])
def test_a_multimodal_model_runs_its_text_model(name):
    """GOT-OCR2's vision tower cannot switch attention, so its top config stays as it was
    while its text model switches: bass runs (and restores) the text model's. Gemma 3's
    vision tower attends both ways: only the text decoder's attention must be causal."""
    model = multimodal(name)
    # a vision tower running another implementation than the text model gets its own back
    model.set_attn_implementation({"text_config": "sdpa", "vision_config": "eager"})
    before = compat.attn_implementations(model)
    assert before["vision_config"] == "eager" and before["text_config"] == "sdpa"
    if name == "Gemma3" and Version(transformers.__version__) < Version("5.24"):
        # transformers 5.3's Gemma 3 reads the Cache's is_initialized: refused by name
        with pytest.raises(UnsupportedModelError, match="reads 'is_initialized'"):
            Generator(model, "ngram").generate(PROMPTS, max_new_tokens=12)
    else:
        testing.assert_greedy_equivalent(Generator(model, "ngram"), PROMPTS, 12)
    assert compat.attn_implementations(model) == before


def test_a_model_that_cannot_compile_is_refused_by_name(monkeypatch):
    """A forward Dynamo cannot trace whole (here: a data-dependent host read, as MoE
    routing by expert counts) is named with what to do instead."""
    from torch._dynamo.testing import CompileCounter

    model = gpt2()
    norm = model.transformer.ln_f
    real = norm.forward
    monkeypatch.setattr(norm, "forward", lambda x: real(x) * len(x.sum(-1).tolist()))
    gen = Generator(model, "ngram", compile=CompileCounter())
    with pytest.raises(UnsupportedModelError, match="could not compile GPT2LMHeadModel"):
        gen.generate([[1, 2, 3]], max_new_tokens=4)


def test_a_model_that_does_not_switch_to_bass_attention_is_refused_by_name(monkeypatch):
    model = gpt2()
    before, calls = model.config._attn_implementation, []
    monkeypatch.setattr(model, "set_attn_implementation", calls.append)  # switches nothing
    with pytest.raises(UnsupportedModelError, match="GPT2LMHeadModel did not switch"):
        Generator(model, "ngram").generate([[1, 2, 3]], max_new_tokens=4)
    calls.clear()
    with pytest.raises(UnsupportedModelError, match="GPT2LMHeadModel did not switch"):
        hf.prepare(model)
    assert calls == ["bass", before]  # a direct prepare hands it back as it came


@pytest.mark.parametrize("family", [*SUPPORTED, "gpt2"])
def test_the_kv_budget_counts_at_least_what_the_cache_holds(family):
    """The KV budget's bytes per position (``RaggedKVCache.bytes_per_token``) against the
    buffers a prefill allocates: exact, or an overestimate where the cache holds MLA's
    compressed latents or layers differ (never fewer bytes: the budget would admit rows
    memory lacks)."""
    if family == "gpt2":
        model = gpt2()
    else:
        config_name, model_name, overrides = SUPPORTED[family]
        model = build(config_name, model_name, overrides, torch.float32)
    text = model.config.get_text_config()
    layers = getattr(text, "num_hidden_layers", None) or text.n_layer
    cache = RaggedKVCache(1, 16, layers, torch.device("cpu"))
    hf.prepare(model)
    passes.prefill(model, cache, [[1, 2, 3]])
    held = sum(t.numel() * t.element_size() for t in cache.buffers()) // 16
    assert held > 0
    if family in LATENT or family == "gemma4":  # latents; the largest layer's head dim
        assert held <= RaggedKVCache.bytes_per_token(model)
    else:
        assert held == RaggedKVCache.bytes_per_token(model)
