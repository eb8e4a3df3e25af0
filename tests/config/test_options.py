"""bass.options: every keyword of Generator(), generate() and generate_text() over the
space of types and values (hypothesis): a value is refused with an OptionError that names
the keyword and the value before any work, or it reaches the work normalised and valid;
a config file and the command line refuse the same values with the same words."""

from __future__ import annotations

import math
from numbers import Integral, Real
from unittest import mock

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from models import tiny_lm
from profiles import examples

from bass import Generator, backends, engine, options
from bass.batch_state import PromptError
from bass.config import Config, ConfigError
from bass.options import OptionError

PROMPTS = [[1, 2, 3], [4, 5]]
VOCAB = 64

ints = st.one_of(
    st.integers(-3, 300),
    st.integers(-(2**70), 2**70),
    st.sampled_from([np.int64(3), np.int32(0), np.uint8(7), 2**63 - 1, 2**63]),
)
reals = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(-2, 2),
    st.sampled_from([np.float32(0.5), np.float64(-1.0), 0.0, 1.0]),
)
id_lists = st.lists(st.one_of(st.integers(-2, 70), st.floats(0, 5), st.booleans()), max_size=4)
ANYTHING = st.one_of(
    st.none(),
    st.booleans(),
    ints,
    reals,
    st.text(max_size=4),
    st.binary(max_size=2),
    id_lists,
    st.tuples(st.integers(0, 70), st.integers(0, 70)),
    st.lists(st.text(max_size=3), max_size=3),
    st.lists(id_lists, max_size=3),
    st.lists(st.lists(st.integers(0, 63), min_size=1, max_size=3), min_size=1, max_size=3),
    st.lists(st.integers(0, 80), min_size=1, max_size=3).map(torch.tensor),
    st.integers(0, 80).map(torch.tensor),
    st.sampled_from([np.bool_(True), {}, {"k": 1}, object(), torch.tensor([[1, 2]]), print]),
)


def is_int(v) -> bool:
    return isinstance(v, Integral) and not isinstance(v, (bool, np.bool_))


def is_real(v) -> bool:
    return isinstance(v, Real) and not isinstance(v, (bool, np.bool_)) and math.isfinite(v)


def ids_of(v):
    """``v`` as a list of ids when it is a 1-D sequence of them, else None."""
    if isinstance(v, torch.Tensor):
        return v.tolist() if v.dim() == 1 else None
    if isinstance(v, (list, tuple)):
        return list(v)
    return None


def token(t) -> bool:
    return is_int(t) and 0 <= t < VOCAB


# What generate() must accept, written independently of bass.options (None: the default).
VALID = {
    "max_new_tokens": lambda v: is_int(v) and v >= 1,
    "do_sample": lambda v: isinstance(v, (bool, np.bool_)),
    "temperature": lambda v: is_real(v) and v >= 0,
    "top_k": lambda v: is_int(v) and v >= 1,
    "top_p": lambda v: is_real(v) and 0 < v <= 1,
    "seed": lambda v: is_int(v) and 0 <= v < 2**63,
    "time_budget": lambda v: is_real(v) and v >= 0,
    "eos_token_id": lambda v: (
        (isinstance(v, torch.Tensor) and v.dim() == 0 and token(v.item()))
        or token(v)
        or (ids_of(v) is not None and len(ids_of(v)) > 0 and all(map(token, ids_of(v))))
    ),
    "stop_strings": lambda v: (
        (isinstance(v, str) and v != "")
        or (isinstance(v, (list, tuple)) and all(isinstance(s, str) and s for s in v))
    ),
    "stop_sequences": lambda v: (
        ids_of(v) is not None and all(ids_of(s) and all(map(token, ids_of(s))) for s in ids_of(v))
    ),
}


@pytest.fixture(scope="module")
def gen():
    return Generator(tiny_lm(), "ngram", cpu_linear="torch")


class Reached(Exception):
    """The call got past the checks to the generation itself."""


def call_generate(gen, kw):
    """``gen.generate(PROMPTS, **kw)`` up to the work: returns what ``_generate`` got, or
    raises what the checks raised; asserts no model was touched before."""
    seen = {}

    def work(self, job, *more):  # (the attention the models came with)
        kw = job.kw
        seen.update(max_new=kw["max_new_tokens"], params=job.params, stops=job.stops)
        seen.update(seed=kw["seed"], budget=kw["time_budget"])
        raise Reached

    with (
        mock.patch.object(engine.Generator, "_generate", work),
        mock.patch.object(engine.hf, "prepare", wraps=engine.hf.prepare) as prepare,
    ):
        try:
            gen.generate(PROMPTS, **kw)
        except Reached:
            return seen
        except Exception:
            assert prepare.call_count == 0, "a model was prepared before the error"
            raise
    raise AssertionError("generate returned without generating")


@settings(
    max_examples=examples(300),
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(key=st.sampled_from(sorted(VALID)), value=ANYTHING)
def test_generate_keywords_are_refused_before_work_or_reach_it_valid(gen, key, value):
    kw = {"max_new_tokens": 3, key: value}
    if key == "stop_strings":
        kw["tokenizer"] = mock.Mock(decode=lambda ids, **k: "")
    valid = value is None or VALID[key](value)
    if key == "max_new_tokens" and value is None:
        valid = False  # required: no config default here
    try:
        seen = call_generate(gen, kw)
    except OptionError as exc:
        assert not valid, f"{key}={value!r} refused: {exc}"
        if value is not None:
            assert f"generate(): {key}={options.show(value)} is not allowed; expected " in str(exc)
        return
    except PromptError as exc:  # a valid max_new_tokens past the model's context
        assert key == "max_new_tokens" and valid and "exceeds" in str(exc)
        return
    assert valid, f"{key}={value!r} was accepted"
    # what reaches the work is normalised: Python ints and floats, ids as ints
    assert type(seen["max_new"]) is int and seen["max_new"] >= 1
    assert seen["seed"] is None or type(seen["seed"]) is int
    assert seen["budget"] is None or type(seen["budget"]) is float
    p = seen["params"]
    assert type(p.do_sample) is bool and type(p.temperature) is float
    eos, stops, _ = seen["stops"]
    assert all(type(t) is int and 0 <= t < VOCAB for t in eos)
    assert all(type(t) is int and 0 <= t < VOCAB for s in stops for t in s)
    assert all(len(s) > 0 for s in stops)


@settings(max_examples=examples(300))
@given(key=st.sampled_from(options.GENERATE), value=ANYTHING)
def test_a_config_file_refuses_what_generate_refuses_in_the_same_words(key, value):
    """The config's [generation] table and generate()'s keywords share one validator: the
    same verdict and the same 'expected ...' phrase (ids checked without a vocabulary)."""
    if value is None:
        return
    opt = options.OPTIONS[key]
    try:
        api = options.check(key, value, where="generate()")
    except OptionError as exc:
        api = exc
    try:
        cfg = Config.from_dict({"generation": {key: value}}, source="my.toml")
        cfg = getattr(cfg.generation, key)
    except ConfigError as exc:
        cfg = exc
    if isinstance(api, OptionError):
        assert isinstance(cfg, ConfigError), f"{key}={value!r}: the config took it"
        allowed = opt.kind.allowed({})
        assert f"expected {allowed}" in str(api) and f"expected {allowed}" in str(cfg)
        assert str(cfg).startswith(f"my.toml: [generation].{key} = {options.show_toml(value)} ")
    else:
        assert not isinstance(cfg, ConfigError), f"{key}={value!r}: {cfg}"
        assert cfg == api


GENERATOR_VALID = {
    "static_shapes": lambda v: isinstance(v, (bool, np.bool_)),
    "prefill_chunk_tokens": lambda v: is_int(v) and v >= 1,
    "forced_acceptance": lambda v: is_real(v) and 0 <= v <= 1,
    "cpu_linear": lambda v: v in ("auto", "unpacked", "torch"),
    "attention": lambda v: v in ("auto", "reference", "sdpa"),
    "compile": lambda v: isinstance(v, (bool, np.bool_)) or v == "reduce-overhead" or v is print,
    # with the n-gram drafter of the test: only None (a draft model's: test_shared_vocab.py)
    "shared_vocab": lambda v: v is None,
}
GENERATOR_VALUES = st.one_of(
    ANYTHING, st.sampled_from(["auto", "torch", "unpacked", "reference", "sdpa", "fused", "eager"])
)


@settings(
    max_examples=examples(200),
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(key=st.sampled_from(sorted(GENERATOR_VALID)), value=GENERATOR_VALUES)
def test_generator_keywords_are_refused_or_taken(gen, key, value):
    valid = GENERATOR_VALID[key](value) or (value is None and key != "prefill_chunk_tokens")
    if key == "compile" and isinstance(value, str):  # backend names: torch's list
        valid = valid or value in torch._dynamo.list_backends(exclude_tags=())
    # the CPU backend's calibration is not what is tested here
    with mock.patch.object(backends.CPUBackend, "prepare", lambda self, models: None):
        try:
            made = Generator(gen.main, "ngram", **{key: value})
        except OptionError as exc:
            assert not valid, f"{key}={value!r} refused: {exc}"
            assert f"Generator(): {key}={options.show(value)} is not allowed" in str(exc)
            return
    assert valid, f"{key}={value!r} was accepted"
    assert type(made.prefill_chunk_tokens) is int


@pytest.mark.parametrize(
    "main", [None, "HuggingFaceTB/SmolLM2-135M", "./model-dir", 3, torch.nn.Linear(2, 2)]
)
def test_a_main_model_that_is_not_one_points_to_from_pretrained(main):
    with pytest.raises(OptionError, match=r"Generator\(\): main=.* is not allowed; expected a "):
        Generator(main)
    if main is None or isinstance(main, str):
        with pytest.raises(OptionError, match=r"use Generator\.from_pretrained\(main, draft\)"):
            Generator(main)


def test_a_config_that_is_not_one_is_refused(gen):
    with pytest.raises(OptionError, match=r"Generator\(\): config=5 is not allowed; expected a "):
        Generator(gen.main, config=5)


def test_policy_plugin_lengths_are_checked(gen):
    """A policy's lengths: a non-negative integer (capped at what a row may draft), or a
    ValueError naming the policy and the row."""

    class Plugin:
        name = "plugin"

        def __init__(self, k):
            self.k = k

        def draft_length(self):
            return 0

        def draft_lengths(self, ctx):
            return [self.k] * ctx.num_rows

        def update(self, stats):
            pass

    @settings(max_examples=examples(15), deadline=None)
    @given(k=ANYTHING)
    def check(k):
        ok = (is_int(k) and k >= 0) or (
            isinstance(k, torch.Tensor)
            and k.numel() == 1
            and not k.dtype.is_floating_point
            and k.dtype != torch.bool
            and k.item() >= 0
        )
        g = Generator(gen.main, "ngram", policy=Plugin(k), cpu_linear="torch")
        try:
            res = g.generate(PROMPTS, max_new_tokens=4)
        except ValueError as exc:
            assert not ok, exc
            assert "policy 'plugin' (Plugin).draft_lengths returned, for row 0 (prompt 0)," in str(
                exc
            )
            assert "must be an integer >= 0" in str(exc)
            return
        assert ok, f"draft length {k!r} was taken"
        for step in res.stats.steps:  # capped at what each row may still draft
            assert all(0 <= d <= min(int(k), 3) for d in step.drafted)

    check()


def test_generate_text_refuses_what_is_not_text(gen):
    tok = mock.Mock(decode=lambda ids, **k: "", chat_template=None)
    for texts, why in [
        ("a string", "for one text pass [text]"),
        ([[1, 2]], "is not a string (token ids go to generate())"),
        (["x", ""], "text 1 is empty: every text needs some text"),
        ([" \n"], "text 0 is empty"),
        (None, "expected a list of strings"),
    ]:
        with pytest.raises(OptionError, match=r"generate_text\(\): texts=") as info:
            gen.generate_text(texts, tok, max_new_tokens=2)
        assert why in str(info.value)
    with pytest.raises(OptionError, match=r"generate_text\(\): chat='no' is not allowed"):
        gen.generate_text(["x"], tok, chat="no", max_new_tokens=2)
    with pytest.raises(OptionError, match="this tokenizer has no chat template"):
        gen.generate_text(["x"], tok, chat=True, max_new_tokens=2)
    with pytest.raises(OptionError, match=r"generate_text\(\): tokenizer=None is not allowed"):
        gen.generate_text(["x"], None, max_new_tokens=2)
    # its generation keywords are named as its own (before: "generate(): ...")
    from cli_support import WORDS, word_tokenizer

    tok = word_tokenizer(WORDS)
    with pytest.raises(OptionError, match=r"^generate_text\(\): max_new_tokens=0 is not"):
        gen.generate_text(["x"], tok, max_new_tokens=0)
    with pytest.raises(TypeError, match=r"^generate_text\(\) got unexpected keyword arg"):
        gen.generate_text(["x"], tok, max_new_tokens=2, foo=1)


@pytest.mark.parametrize(
    ("flag", "value", "key"),
    [
        ("--seed", "-1", "seed"),
        ("--time-budget", "nan", "time_budget"),
        ("--temperature", "inf", "temperature"),
        ("--top-p", "2", "top_p"),
        ("--top-k", "0", "top_k"),
        ("--max-new-tokens", "0", "max_new_tokens"),
        ("--compile", "fast", "compile"),
    ],
)
def test_the_command_line_refuses_in_the_same_words(capsys, flag, value, key):
    from cli_support import run

    rc, _, err = run(capsys, f"generate hi {flag} {value}")
    allowed = options.OPTIONS[key].kind.allowed({})
    assert rc == 2 and f"bass: error: command line: {flag} = " in err
    assert f"is not allowed; expected {allowed}" in err


def test_show_names_a_module_by_its_type_and_puts_other_values_on_one_line():
    import torch

    assert options.show(torch.nn.Sequential(torch.nn.Linear(2, 2))) == "<Sequential>"
    assert options.show(torch.zeros(2, 2)) == "tensor([[0., 0.], [0., 0.]])"
    assert options.show("x" * 100) == repr("x" * 100)[:77] + "..."


def test_max_new_tokens_is_required_without_a_config_and_the_file_default_with_one(gen):
    """generate() of a Generator built without a config needs max_new_tokens, and says
    what else gives it; one built with a config takes the file's (128 where it leaves the
    key out, as the options table says)."""
    with pytest.raises(OptionError, match=r"max_new_tokens is required: pass max_new_tokens=N"):
        gen.generate([[1, 2, 3]])
    with pytest.raises(OptionError, match=r"build the Generator with a config"):
        gen.generate([[1, 2, 3]])
    configured = Generator(tiny_lm(), "ngram", cpu_linear="torch", config={})
    res = configured.generate([[1, 2, 3]], eos_token_id=None)
    assert len(res.sequences[0]) == 128 == options.OPTIONS["max_new_tokens"].default
