"""The engine's errors on tiny random models: bad prompts and arguments refused before
any work, models whose attention cannot be routed, non-finite logits;
and what a generation leaves unchanged (the model, the config's defaults)."""

from __future__ import annotations

import copy

import pytest
import torch
from models import perturbed, reference_greedy, tiny_lm

from bass import Generator, hf, testing
from bass.hf import UnsupportedModelError

PROMPTS = [[1, 2, 3, 4, 5], [7, 8], [9, 10, 11, 12, 13, 14, 15, 16, 3], [5], [6, 6, 6, 2]]


@pytest.fixture(scope="module")
def llama():
    return tiny_lm("llama")


# ----------------------------------------------------------------------------- errors


def test_prompts_as_tensors_arrays_and_numpy_ints_are_token_ids(llama):
    """Each prompt may be a list, a tuple, or a 1-D tensor or array of integers (numpy's
    included): the same output as the lists of Python ints."""
    import numpy as np

    gen = Generator(llama, "ngram")
    want = gen.generate([[1, 2, 3], [4, 5]], max_new_tokens=6).sequences
    forms = [
        [torch.tensor([1, 2, 3]), torch.tensor([4, 5])],
        [np.array([1, 2, 3]), (4, 5)],
        [[np.int64(1), np.int32(2), 3], [4, 5]],
    ]
    for prompts in forms:
        assert gen.generate(prompts, max_new_tokens=6).sequences == want


def test_errors_before_any_work(llama):
    gen = Generator(llama, llama)
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        gen.generate([[1], []], max_new_tokens=4)
    with pytest.raises(ValueError, match="prompts is empty"):
        gen.generate([], max_new_tokens=4)
    with pytest.raises(
        ValueError, match="max_new_tokens=0 is not allowed; expected an integer >= 1"
    ):
        gen.generate([[1]], max_new_tokens=0)
    with pytest.raises(ValueError, match=r"exceeds the main model .* context of 256"):
        gen.generate([[1] * 200], max_new_tokens=60)
    short = Generator(gen.main, tiny_lm(seed=1, max_positions=16))
    with pytest.raises(ValueError, match=r"exceeds the draft model .* context of 16.*longer"):
        short.generate([[1] * 5], max_new_tokens=30)
    with pytest.raises(ValueError, match="temperature"):
        gen.generate([[1]], max_new_tokens=4, do_sample=True, temperature=0.0)
    with pytest.raises(
        ValueError, match=r"outside \[0, 64\): \[64\], the ids the model embeds \(from"
    ):
        gen.generate([[1, 64]], max_new_tokens=4)
    with pytest.raises(TypeError, match=r"flat list of ints; for one prompt pass \[ids\]"):
        gen.generate([1, 2, 3], max_new_tokens=4)
    with pytest.raises(TypeError, match="2-D Tensor: a padded batch would feed its padding"):
        gen.generate(torch.tensor([[1, 2], [3, 4]]), max_new_tokens=4)
    with pytest.raises(TypeError, match=r"1-D Tensor; for one prompt pass \[ids\]"):
        gen.generate(torch.tensor([1, 2]), max_new_tokens=4)
    with pytest.raises(TypeError, match=r"prompt 1 is a string.*generate_text"):
        gen.generate([[1], "hello"], max_new_tokens=4)
    with pytest.raises(TypeError, match=r"prompt 0 has token ids that are not integers: \[1.0"):
        gen.generate([[1.0, 2]], max_new_tokens=4)
    with pytest.raises(TypeError, match="not integers: \\[True"):
        gen.generate([[True, 2]], max_new_tokens=4)
    # what a tokenizer or list(tensor) hands over: said what to pass, or taken
    from transformers import BatchEncoding

    with pytest.raises(TypeError, match=r"got BatchEncoding; pass its \['input_ids'\]"):
        gen.generate(BatchEncoding({"input_ids": [[1, 2]]}), max_new_tokens=4)
    with pytest.raises(TypeError, match=r"prompt 0 is a 2-D Tensor of shape \(1, 2\); .* t\[0\]"):
        gen.generate([torch.tensor([[1, 2]])], max_new_tokens=4)
    want = gen.generate([[1, 2, 3]], max_new_tokens=4).sequences
    assert gen.generate([list(torch.tensor([1, 2, 3]))], max_new_tokens=4).sequences == want
    with pytest.raises(ValueError, match="policy='bas' is not allowed; expected an installed "
                       "policy: adaptive, bass"):  # fmt: skip
        Generator(llama, llama, policy="bas")
    with pytest.raises(ValueError, match="vocabularies differ"):
        Generator(llama, tiny_lm("llama", vocab=80))
    with pytest.raises(ValueError, match="unknown drafter 'gram'; installed: ngram"):
        Generator(llama, "gram")
    with pytest.raises(
        ValueError, match=r"attention='pad' is not allowed; expected one of auto, ref"
    ):
        Generator(llama, attention="pad")  # BASS-PAD: CUDA and a built CUTLASS library
    with pytest.raises(ValueError, match=r"attention='sdpa_padded' is not allowed"):
        Generator(llama, attention="sdpa_padded")  # a padded-op kernel: passes are packed


def test_unroutable_model_is_named():
    from transformers import LlamaForCausalLM

    from bass import hf

    class LegacyAttentionLM(LlamaForCausalLM):  # as a model with hand-written attention
        _supports_attention_backend = False

    model = LegacyAttentionLM(tiny_lm("llama").config)
    with pytest.raises(UnsupportedModelError, match=r"LegacyAttentionLM.*AttentionInterface"):
        hf.prepare(model)
    with pytest.raises(UnsupportedModelError, match="LegacyAttentionLM"):
        Generator(model, "ngram").generate([[1, 2]], max_new_tokens=2)


def test_a_prompt_filling_the_context_gets_its_one_new_token():
    """A row's last new token is never fed back: prompt + max_new_tokens may be one more
    than the context (transformers' own generate gives that token), and two more are
    refused. GPT-2's learned positions would fail on a position past its table."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=4,
                        bos_token_id=0, eos_token_id=0)  # fmt: skip
    model = GPT2LMHeadModel(config).eval().double()
    full = [list(range(1, 17)), [3, 4]]  # 16 tokens: the whole context
    testing.assert_greedy_equivalent(Generator(model, "ngram"), full, 1)
    testing.assert_greedy_equivalent(Generator(model, model), [[5, 6, 7]], 14)  # draft model
    with pytest.raises(ValueError, match=r"16 tokens\) \+ max_new_tokens \(2\) = 18 exceeds"):
        Generator(model, "ngram").generate(full, max_new_tokens=2)


def test_a_window_no_layer_uses_is_no_limit():
    """Qwen2 with use_sliding_window but every layer full attention (max_window_layers =
    its layers: layer_types all full_attention) has no window: not refused past it, and
    equal to transformers' own greedy decoding."""
    model = tiny_lm("qwen2")
    config = model.config
    model = type(model)(
        type(config)(**{**config.to_dict(), "use_sliding_window": True, "sliding_window": 8,
                        "max_window_layers": config.num_hidden_layers, "layer_types": None})
    ).eval().double()  # fmt: skip
    assert set(model.config.layer_types) == {"full_attention"}
    testing.assert_greedy_equivalent(Generator(model, "ngram"), [[1, 2, 3, 4, 5], [6, 7]], 12)


def test_longrope_generations_stay_below_its_switch_to_the_long_factors():
    """Phi-3's longrope takes its long factors once a pass's largest position passes
    original_max_position_embeddings, for the whole pass: packed rows of different
    lengths would mix them. Within the switch, equal to transformers' own decoding; past
    it, refused by name."""
    from transformers import Phi3Config, Phi3ForCausalLM

    torch.manual_seed(0)
    factors = {"short_factor": [1.0] * 4, "long_factor": [4.0, 8.0, 16.0, 32.0]}
    rope = {"rope_type": "longrope", "original_max_position_embeddings": 16, **factors}
    config = Phi3Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        original_max_position_embeddings=16, tie_word_embeddings=False, pad_token_id=0,
        rope_scaling=rope,
    )  # fmt: skip
    model = Phi3ForCausalLM(config).eval().double()
    with torch.no_grad():  # sharp logits and attention: the frequencies matter
        model.lm_head.weight.mul_(25.0)
        for layer in model.model.layers:
            layer.self_attn.qkv_proj.weight.mul_(30.0)
    prompts = [[5, 9, 2, 33, 7], [11, 4, 60]]
    testing.assert_greedy_equivalent(Generator(model, "ngram"), prompts, 12)  # 16 fed
    with pytest.raises(UnsupportedModelError, match=r"longrope.*past 16 .*feeds 17"):
        Generator(model, "ngram").generate(prompts, max_new_tokens=13)


def test_model_is_handed_back_unchanged(llama):
    before = llama.config._attn_implementation
    Generator(llama, "ngram").generate([[1, 2]], max_new_tokens=3)
    assert llama.config._attn_implementation == before


def test_config_file_sets_defaults_and_arguments_win(llama, tmp_path):
    cfg = tmp_path / "bass.toml"
    cfg.write_text(
        '[policy]\nname = "constant"\n[policy.options]\nk = 2\n[generation]\nmax_new_tokens = 5\n'
    )
    gen = Generator(llama, "ngram", config=cfg)
    res = gen.generate(PROMPTS)
    assert all(len(s) == 5 for s in res.sequences)
    assert set(res.stats.draft_length_trace()) <= {0, 1, 2}
    assert all(len(s) == 3 for s in gen.generate(PROMPTS, max_new_tokens=3).sequences)
    with pytest.warns(UserWarning, match=r"\(k\) are for the policy 'constant', not 'bass'"):
        gen = Generator(llama, "ngram", policy="bass", config=cfg)
    assert type(gen.new_policy()).__name__ == "BassPolicy"


# ----------------------------------------------------------------------------- non-finite


def poisoned(model, token: int, value: float = float("nan")):
    """A copy of ``model`` whose input embedding of ``token`` is ``value``: every
    position at or after that token gets non-finite hidden states and logits."""
    out = copy.deepcopy(model)
    with torch.no_grad():
        out.get_input_embeddings().weight[token] = value
    return out


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
@pytest.mark.parametrize("do_sample", [False, True])
def test_nonfinite_main_logits_raise_at_the_prefill(llama, value, do_sample):
    from bass import NonFiniteLogitsError

    prompts = [[1, 2, 3], [4, 5], [6, 63, 7], [8]]
    gen = Generator(poisoned(llama, 63, value), "ngram")
    with pytest.raises(NonFiniteLogitsError, match=r"main model .* prompt 2 at the prefill"):
        gen.generate(prompts, max_new_tokens=4, do_sample=do_sample, seed=0)


@pytest.mark.parametrize("do_sample", [False, True])
def test_nonfinite_logits_of_a_prompt_riding_in_a_verify_pass_raise(llama, do_sample):
    """A prompt admitted while others run is prefilled in their verify pass: non-finite
    logits there name it, at the prefill, as a prefill pass of its own would."""
    from bass import NonFiniteLogitsError

    prompts = [[1, 2, 3], [4, 5], [6, 63, 7]]
    kw = dict(max_new_tokens=8, do_sample=do_sample, seed=0, max_rows=2)
    row0 = Generator(llama).generate(prompts[:1], **kw).sequences[0]
    kw["eos_token_id"] = row0[1]  # row 0 ends early; row 1 runs on
    assert Generator(llama, "ngram").generate(prompts, **kw).stats.riding_admissions == 1
    gen = Generator(poisoned(llama, 63), "ngram")
    with pytest.raises(NonFiniteLogitsError, match=r"main model .* prompt 2 at the prefill"):
        gen.generate(prompts, **kw)


@pytest.mark.parametrize("draft", [None, "ngram", "model"])
def test_nonfinite_main_logits_raise_mid_generation(llama, draft):
    """Row 1 emits a token whose embedding is NaN: the step that feeds it raises, naming
    the row and the step, instead of emitting token 0 forever."""
    from bass import NonFiniteLogitsError

    prompts = [PROMPTS[0], PROMPTS[4]]
    other = set(prompts[0] + reference_greedy(llama, prompts[0], 8) + prompts[1])
    solo = reference_greedy(llama, prompts[1], 8)
    bad = next(t for i, t in enumerate(solo) if i >= 2 and t not in other | set(solo[:i]))
    main = poisoned(llama, bad)
    d = perturbed(llama) if draft == "model" else draft
    gen = Generator(main, d, policy="constant", policy_options={"k": 2})
    with pytest.raises(NonFiniteLogitsError, match=r"main model .* prompt 1 at step \d+"):
        gen.generate(prompts, max_new_tokens=8)


def test_nonfinite_draft_logits_raise(llama):
    from bass import NonFiniteLogitsError

    gen = Generator(llama, poisoned(llama, 5), policy="constant", policy_options={"k": 2})
    with pytest.raises(NonFiniteLogitsError, match=r"draft model .* prompt 0 at step 0"):
        gen.generate([[5, 1, 2], [3, 4]], max_new_tokens=4)


@pytest.mark.parametrize(
    "name, value",
    [
        ("indices", torch.zeros(1, 1, dtype=torch.long)),  # sparse attention (glm_moe_dsa)
        ("position_bias", torch.zeros(1)),
        ("attention_mask", torch.zeros(1, 1, 3, 3)),  # a mask the model built itself
    ],
)
def test_attention_arguments_bass_would_ignore_are_refused_by_name(name, value):
    q, k = torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 5, 4)
    cu, kv = torch.tensor([0, 3], dtype=torch.int32), torch.tensor([3], dtype=torch.int32)
    given = {"attention_mask": None, name: value}
    with pytest.raises(UnsupportedModelError, match=f"Linear passes {name} to its attention"):
        hf.bass_attention_forward(
            torch.nn.Linear(1, 1), q, k, k, bass_cu_q_lens=cu, bass_kv_lens=kv, **given
        )
