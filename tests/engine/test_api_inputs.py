"""Values at the edges of what the Python API takes: each gets a clear error naming it
before any work, or correct behaviour (a second pass over bad inputs, after
tests/config/test_options.py's hypothesis sweep)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from cli_support import save_model_dir
from hypothesis import given, settings
from hypothesis import strategies as st
from models import tiny_lm
from transformers import AutoTokenizer

from bass import Generator
from bass.errors import ConfigError
from bass.options import OptionError
from bass.policies.builtin import ConstantPolicy
from bass.sampling import SamplingParams, warp_probs

PROMPTS = [[1, 2, 3, 1, 2], [4, 5]]


@pytest.fixture(scope="module")
def gen():
    return Generator(tiny_lm(), "ngram", cpu_linear="torch")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_model_dir(tmp_path_factory.mktemp("api") / "m")


@settings(max_examples=60, deadline=None)
@given(
    logits=st.lists(st.floats(-1e4, 1e4), min_size=2, max_size=6),
    temperature=st.sampled_from([1e-45, 1e-38, 1e-30, 1e-12, 1e-6]),
    double=st.booleans(),
)
def test_a_tiny_temperature_is_a_one_hot_at_the_argmax(logits, temperature, double):
    x = torch.tensor([logits], dtype=torch.float64 if double else torch.float32)
    p = warp_probs(x, SamplingParams(do_sample=True, temperature=temperature))
    assert torch.isfinite(p).all()
    top = x[0] == x[0].max()
    assert p[0][top].sum().item() == pytest.approx(1.0)  # all mass on the (tied) maxima


def test_sampling_at_a_tiny_temperature_is_greedy_decoding(gen):
    greedy = gen.generate(PROMPTS, max_new_tokens=8).sequences
    cold = gen.generate(PROMPTS, max_new_tokens=8, do_sample=True, temperature=1e-38, seed=1)
    assert cold.sequences == greedy


def test_texts_that_are_not_valid_unicode_are_refused_naming_which(gen, model_dir):
    tok = AutoTokenizer.from_pretrained(model_dir)
    with pytest.raises(OptionError, match=r"text 1 is not valid Unicode .*surrogate"):
        gen.generate_text(["fine", "bad \udcff byte"], tok)


def test_generate_text_refuses_logprobs_it_would_drop(model_dir, tmp_path):
    """generate_text returns text: ``logprobs=`` is refused (pointing to generate() and
    on_finish); with ``on_finish`` the rows carry them, and a config's ``[generation]
    logprobs`` is no error (the same settings on every rank, with a callback or not)."""
    tok = AutoTokenizer.from_pretrained(model_dir)
    config = tmp_path / "bass.toml"
    config.write_text('[generation]\nlogprobs = "raw"\nmax_new_tokens = 3\n')
    g = Generator(tiny_lm(), "ngram", config=config)
    with pytest.raises(OptionError, match=r"generate_text\(\): logprobs='raw' .* on_finish"):
        g.generate_text(["one"], tok, chat=False, logprobs="raw")
    rows = []
    assert len(g.generate_text(["one"], tok, chat=False, on_finish=rows.append)) == 1
    assert len(rows[0].logprobs) == len(rows[0].tokens) == 3  # the config's, to the callback
    assert len(g.generate_text(["one"], tok, chat=False, logprobs=False)) == 1


def test_a_policy_class_instead_of_an_instance_is_refused(gen):
    with pytest.raises(OptionError, match=r"ConstantPolicy is a class: pass an instance"):
        Generator(gen.main, "ngram", policy=ConstantPolicy)


def test_policy_options_take_numpy_numbers(gen):
    g = Generator(gen.main, "ngram", policy="constant", policy_options={"k": np.int64(2)})
    assert g.new_policy().k == 2 and type(g.new_policy().k) is int
    with pytest.raises(ValueError, match="option 'k'"):
        Generator(gen.main, "ngram", policy="constant", policy_options={"k": np.float64(2.5)})
    # an option the policy does not have: an OptionError, as every bad keyword value
    with pytest.raises(OptionError, match="policy 'constant' has no option 'k_max'; options: k="):
        Generator(gen.main, "ngram", policy="constant", policy_options={"k_max": 3})


def test_row_ids_take_numpy_and_refuse_what_the_keys_cannot_hold(gen):
    a = gen.generate(PROMPTS, max_new_tokens=4, do_sample=True, seed=3, row_ids=[7, 9])
    b = gen.generate(PROMPTS, max_new_tokens=4, do_sample=True, seed=3, row_ids=np.array([7, 9]))
    assert a.sequences == b.sequences
    for bad in ([2**70, 1], [2**63, 1], [1.0, 2], [True, 2]):
        with pytest.raises(OptionError, match=r"row_ids=.* < 2\*\*63"):
            gen.generate(PROMPTS, max_new_tokens=2, row_ids=bad)


@pytest.mark.parametrize("key", ["time_budget", "temperature", "top_p"])
def test_ints_past_the_float_range_are_refused_by_name(gen, key):
    with pytest.raises(OptionError, match=rf"{key}=1000.* too large for a float"):
        gen.generate(PROMPTS, max_new_tokens=2, do_sample=True, **{key: 10**400})


def test_none_names_no_drafter_as_in_the_config_file_and_the_cli(gen, model_dir):
    assert Generator(gen.main, "none").drafter is None
    assert Generator(gen.main, " ngram ").drafter.name == "ngram"
    assert Generator.from_pretrained(model_dir, "none").drafter is None
    assert Generator.from_pretrained(model_dir, " ngram").drafter.name == "ngram"


@pytest.mark.parametrize(
    "args, kw, match",
    [
        ((3,), {}, r"main=3 is not allowed; expected a model name"),
        (("M",), {"draft": 5}, r"draft=5 is not allowed"),
        (("M",), {"dtype": "int8"}, r"dtype='int8' is not allowed; expected one of float32"),
        (("M",), {"dtype": 5}, r"dtype=5 is not allowed; expected a floating torch dtype"),
        (("M",), {"device": "nope"}, r"device='nope' is not allowed; expected a torch device"),
    ],
)
def test_from_pretrained_checks_its_arguments_before_loading(model_dir, args, kw, match):
    args = tuple(model_dir if a == "M" else a for a in args)
    with pytest.raises(OptionError, match=match):
        Generator.from_pretrained(*args, **kw)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_from_pretrained_on_cuda_without_a_gpu_says_so_before_loading(model_dir):
    with pytest.raises(OptionError, match=r"device='cuda' .* no CUDA device"):
        Generator.from_pretrained(model_dir, device="cuda")


def test_the_configs_model_dtype_and_chat_apply_to_the_python_api(model_dir, tmp_path):
    cfg = tmp_path / "bass.toml"
    cfg.write_text('[model]\ndtype = "float64"\nchat = false\n')
    g = Generator.from_pretrained(model_dir, "ngram", config=cfg)
    assert g.main.dtype == torch.float64
    assert Generator.from_pretrained(model_dir, dtype=torch.float32, config=cfg).main.dtype == (
        torch.float32  # an explicit argument wins
    )
    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.chat_template = "{% for m in messages %}w3 {{ m['content'] }}{% endfor %}"
    plain = g.generate_text(["w1 w2"], tok, max_new_tokens=4)
    assert plain == g.generate_text(["w1 w2"], tok, max_new_tokens=4, chat=False)
    assert plain != g.generate_text(["w1 w2"], tok, max_new_tokens=4, chat=True)
    cfg.write_text("[model]\nchat = true\n")
    tok.chat_template = None
    with pytest.raises(OptionError, match="chat=True is not allowed"):
        Generator(g.main, config=cfg).generate_text(["w1"], tok, max_new_tokens=2)


def test_a_config_eos_past_the_vocabulary_is_refused_when_the_generator_is_built(gen):
    with pytest.raises(OptionError, match=r"\[generation\]\.eos_token_id = 99 .* \[0, 64\)"):
        Generator(gen.main, config={"generation": {"eos_token_id": 99}})


def test_a_config_files_eos_past_the_vocabulary_names_the_file(gen, tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("[generation]\neos_token_id = 99\n")
    with pytest.raises(
        ConfigError, match=rf"^{re.escape(str(path))}: \[generation\]\.eos_token_id = 99"
    ):
        Generator(gen.main, config=path)


def test_no_texts_and_a_default_that_breaks_a_bound_say_so(gen, model_dir):
    tok = AutoTokenizer.from_pretrained(model_dir)
    with pytest.raises(OptionError, match=r"texts=\[\] .* no texts: pass at least one"):
        gen.generate_text([], tok, max_new_tokens=2)
    with pytest.raises(ValueError, match=r"'k0' .* got 4, its default: set k0 too"):
        Generator(gen.main, "ngram", policy="adaptive", policy_options={"k_max": 2})


@pytest.mark.parametrize("draft", [None, "ngram", "none"])
def test_shared_vocab_without_a_draft_model_is_refused(gen, draft):
    with pytest.raises(
        OptionError, match=r"shared_vocab=10 .* applies to a draft model .* not draft="
    ):
        Generator(gen.main, draft, shared_vocab=10)


def test_compile_takes_no_array(gen):
    with pytest.raises(OptionError, match=r"compile=array"):
        Generator(gen.main, compile=np.array(["reduce-overhead"]))
