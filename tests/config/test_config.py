"""bass.config: TOML parsing, defaults, every validation error, and the engine kwargs."""

from __future__ import annotations

import itertools
import re
import textwrap
from pathlib import Path

import pytest

import bass.config
from bass.config import (
    TABLES,
    Config,
    ConfigError,
    GenerationConfig,
    ModelConfig,
    PolicyConfig,
    apply_config,
    load_config,
)
from bass.options import show_toml

BUILTINS = ["adaptive", "bass", "confidence", "constant", "goodput", "hf-heuristic"]


def docstring_example() -> str:
    """The example config quoted in bass.config's docstring (and the README)."""
    doc = bass.config.__doc__
    lines = doc[doc.index("    # bass.toml") :].splitlines()
    block = itertools.takewhile(lambda line: not line or line.startswith("    "), lines)
    return textwrap.dedent("\n".join(block))


def write(tmp_path, text: str, name: str = "bass.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_defaults():
    c = Config()
    assert c.policy == PolicyConfig("adaptive", {})
    assert c.generation == GenerationConfig()
    # do_sample: None until set (generate's default: greedy, said where a model samples)
    assert c.generation.max_new_tokens == 128 and c.generation.do_sample is None
    assert c.model == ModelConfig(None, "ngram", "auto", "float32", None)
    assert Config.from_dict({}) == c


def test_docstring_example_loads_names_every_key_and_is_the_guides(tmp_path):
    """The example ``pydoc bass.config`` shows (config errors point to it) is the config
    guide's, loads, and names every key of every table (a key or in a comment)."""
    example = docstring_example()
    guide = Path(__file__).parents[2] / "docs" / "guides" / "config-and-cli.md"
    assert example == guide.read_text().split("```toml\n", 1)[1].split("```", 1)[0]
    c = load_config(write(tmp_path, example))
    assert c.model.main == "HuggingFaceTB/SmolLM2-360M-Instruct"
    assert c.model.draft == "ngram" and c.model.chat is True
    assert c.generation.top_p == 0.95 and c.generation.presence_penalty == 0.5
    assert c.generation.eos_token_id == 2 and c.generation.time_budget == 30.0
    assert c.generation.stop_strings == ["\n\n"]
    assert c.policy == PolicyConfig("adaptive", {"k_max": 16})
    for table, keys in TABLES.items():
        section = example[example.index(f"[{table}]") :]
        assert not [k for k in keys if not re.search(rf"\b{k}\b", section)], table


def test_engine_kwargs_leave_out_none(tmp_path):
    path = write(
        tmp_path,
        "[generation]\nmax_new_tokens = 9\ntemperature = 1\n"
        '[policy]\nname = "constant"\n[policy.options]\nk = 2\n',
    )
    gen_kw, run_kw = apply_config(path)
    assert gen_kw == {
        "policy": "constant",
        "policy_options": {"k": 2},
        "attention": "auto",
        "compile": False,
        "cpu_linear": "auto",
        "draft_sampling": "coupled",
    }
    # do_sample left out by the file: generate's own default (greedy, said where the
    # model's generation_config samples)
    assert run_kw == {"max_new_tokens": 9, "temperature": 1.0}
    assert isinstance(run_kw["temperature"], float)
    c = load_config(path)
    assert apply_config(c) == (gen_kw, run_kw)
    assert apply_config(c.to_dict()) == (gen_kw, run_kw)
    assert Config.from_dict(c.to_dict()) == c
    with pytest.raises(TypeError, match="path to a TOML file"):
        apply_config(42)


def test_kwargs_drive_the_engine():
    """generator_kwargs/generate_kwargs are accepted as-is by Generator and generate."""
    from models import tiny_lm

    from bass import Generator

    c = Config.from_dict(
        {
            "generation": {"max_new_tokens": 4, "seed": 0, "eos_token_id": [60]},
            "policy": {"name": "constant", "options": {"k": 2}},
        }
    )
    gen = Generator(tiny_lm(), "ngram", **c.generator_kwargs())
    res = gen.generate([[1, 2, 3, 1, 2]], **c.generate_kwargs())
    assert 1 <= len(res.sequences[0]) <= 4


def test_config_policy_options_follow_its_policy():
    """A config's [policy.options] are kept when policy= names its policy again, and left
    out when it names another (as the command line does)."""
    from models import tiny_lm

    from bass import Generator

    config = {"policy": {"name": "constant", "options": {"k": 2}}}
    main = tiny_lm()
    same = Generator(main, "ngram", policy="constant", config=config)
    assert same.policy_spec == ("constant", {"k": 2})
    with pytest.warns(UserWarning, match=r"\[policy.options\] \(k\) are for the policy 'constant'"):
        other = Generator(main, "ngram", policy="adaptive", config=config)
    assert other.policy_spec == ("adaptive", {})
    explicit = Generator(main, "ngram", policy="constant", policy_options={"k": 3}, config=config)
    assert explicit.policy_spec == ("constant", {"k": 3})
    # options given for the file's policy merge over the file's, as --policy-option does
    two = {"policy": {"name": "bass", "options": {"l_limit": 8, "l0": 3}}}
    merged = Generator(main, "ngram", policy_options={"l_incre": 3}, config=two)
    assert merged.policy_spec == ("bass", {"l_limit": 8, "l0": 3, "l_incre": 3})


def test_from_pretrained_checks_its_arguments_before_loading_a_model(monkeypatch, tmp_path):
    """Unknown keywords, bad values, a bad config file, a policy that cannot be built and
    a dtype no model can take are refused before any model loads (a hub model: minutes)."""
    import torch

    from bass import Generator, models
    from bass.errors import ConfigError, OptionError

    def load_pair(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(models, "load_pair", load_pair)
    typo = tmp_path / "typo.toml"
    typo.write_text("[generation]\nmax_new_token = 4\n")
    cases = [
        (dict(foo=1), TypeError, r"unexpected keyword arguments: \['foo'\]"),
        (dict(attention="nope"), OptionError, "attention='nope' is not allowed"),
        (dict(policy_options={"zz": 1}), OptionError, "has no option 'zz'"),
        (dict(dtype="float32", config=str(typo)), ConfigError, "max_new_token"),
        (dict(dtype=torch.int8), OptionError, "a floating torch dtype"),
    ]
    for kw, error, said in cases:
        with pytest.raises(error, match=said):
            Generator.from_pretrained(str(tmp_path), **kw)


def test_a_config_dict_with_keys_of_any_type_is_a_config_error():
    """Keys that are not strings (a dict built in code) are named, not a TypeError."""
    from bass.config import Config, ConfigError

    with pytest.raises(ConfigError, match=r"unknown key in \[generation\] 'x', 5"):
        Config.from_dict({"generation": {"x": 1, 5: 2}})


def test_unknown_keys_say_where_they_belong_or_what_they_are_close_to():
    """A key of another table names its table; a typo names the key it is close to; a
    policy option put in [policy] points to [policy.options]; a policy option mistyped
    names the close one."""
    from bass import policies
    from bass.config import Config, ConfigError
    from bass.errors import OptionError

    for doc, said in [
        ({"model": {"max_new_tokens": 3}}, "'max_new_tokens' belongs in [generation]"),
        ({"generation": {"max_new_token": 3}}, "did you mean 'max_new_tokens'?"),
        ({"Generaton": {}}, "did you mean 'generation'?"),
        ({"policy": {"k_max": 3}}, "'k_max' too, go in [policy.options]"),
        (
            {"generation": {"n": 3}},
            "'n' is an argument of generate(), --samples on the command line, not a config key",
        ),
        ({"generation": {"max_rows": 3}}, "generate(), --batch-size on the command line"),
        ({"generation": {"kv_budget_gib": 3}}, "generate(), --kv-budget-gib on the command"),
        ({"generation": {"row_ids": [3]}}, "'row_ids' is an argument of generate(), not a"),
    ]:
        with pytest.raises(ConfigError, match=re.escape(said)):
            Config.from_dict(doc)
    with pytest.raises(OptionError, match=re.escape("no option 'K0' (did you mean 'k0'?)")):
        policies.load("adaptive", K0=3)


BAD_VALUES = [
    ("generation", "max_new_tokens", 0, "an integer >= 1"),
    ("generation", "max_new_tokens", "8", "an integer >= 1"),
    ("generation", "max_new_tokens", True, "an integer >= 1"),
    ("generation", "do_sample", "yes", "true or false"),
    ("generation", "temperature", -0.5, "a finite number >= 0"),
    ("generation", "temperature", float("nan"), "a finite number >= 0"),
    ("generation", "top_k", 0, "an integer >= 1"),
    ("generation", "top_p", 1.5, "0 < top_p <= 1"),
    ("generation", "top_p", 0, "0 < top_p <= 1"),
    ("generation", "seed", -1, "an integer >= 0"),
    ("generation", "eos_token_id", "eos", "a token id >= 0"),
    ("generation", "eos_token_id", [], "a token id >= 0"),
    ("generation", "eos_token_id", [1, -2], "a token id >= 0"),
    ("generation", "time_budget", -1, "a finite number of seconds >= 0"),
    ("generation", "stop_strings", "", "a list of non-empty strings"),
    ("generation", "stop_strings", ["x", ""], "a list of non-empty strings"),
    ("generation", "stop_strings", [1], "a list of non-empty strings"),
    ("model", "main", 3, "a model name, directory or .gguf file"),
    ("model", "draft", "", "'ngram' or 'none'"),
    ("model", "dtype", "int8", "one of float32, float16, bfloat16, float64"),
    ("model", "attention", "nope", "one of auto, reference"),
    ("model", "chat", "yes", "true or false"),
    ("policy", "name", "bas", "an installed policy: " + ", ".join(BUILTINS)),
    ("policy", "options", [1], "a table of option names to values"),
]


@pytest.mark.parametrize(("table", "key", "value", "allowed"), BAD_VALUES)
def test_bad_value_names_key_value_and_allowed(table, key, value, allowed):
    with pytest.raises(ConfigError) as info:
        Config.from_dict({table: {key: value}}, source="my.toml")
    msg = str(info.value)
    assert msg.startswith("my.toml: ")
    assert f"[{table}].{key} = {show_toml(value)}" in msg  # as the file spells it
    assert allowed in msg


def test_bad_value_in_a_file_names_the_file(tmp_path):
    path = write(tmp_path, "[generation]\ntemperature = -1\n")
    with pytest.raises(ConfigError, match=re.escape(f"{path}: [generation].temperature = -1 ")):
        load_config(path)


def test_sampling_needs_positive_temperature():
    with pytest.raises(ConfigError, match="a number > 0 when do_sample is true"):
        Config.from_dict({"generation": {"do_sample": True, "temperature": 0}})
    assert Config.from_dict({"generation": {"temperature": 0}}).generation.temperature == 0.0


def test_a_conflict_of_a_file_and_a_flag_names_both(tmp_path):
    """``temperature = 0`` in the file with ``--sample``: the file's key is named in
    the file's terms, and the error says the file and the command line are at fault
    together (it said "command line: [generation].temperature")."""
    from bass.cli.parser import build_parser
    from bass.cli.settings import resolve_config

    path = write(tmp_path, "[generation]\ntemperature = 0\n")
    args = build_parser().parse_args(["generate", "--config", str(path), "--sample", "hi"])
    with pytest.raises(ConfigError) as info:
        resolve_config(args)
    assert str(info.value).startswith(
        f"{path} and the command line: [generation].temperature = 0.0 is not allowed"
    )


def test_unknown_table_and_key_list_the_allowed_ones():
    with pytest.raises(ConfigError) as info:
        Config.from_dict({"generaton": {}})
    assert "unknown table 'generaton'" in str(info.value)
    assert "[policy], [generation], [model]" in str(info.value)
    with pytest.raises(ConfigError) as info:
        Config.from_dict({"generation": {"max_tokens": 3}})
    msg = str(info.value)
    assert "unknown key in [generation] 'max_tokens'" in msg
    assert "min_p, repetition_penalty, frequency_penalty, presence_penalty, seed" in msg
    with pytest.raises(ConfigError, match="allowed: main, draft, attention, dtype, chat"):
        Config.from_dict({"model": {"device": "cuda"}})
    with pytest.raises(ConfigError, match=r"\[model\] = 'x' is not allowed; expected a table"):
        Config.from_dict({"model": "x"})
    # a boolean where a number goes, as the file spells it (it said True)
    with pytest.raises(ConfigError, match=r"f.toml: \[generation\].max_new_tokens = true is not"):
        Config.from_dict({"generation": {"max_new_tokens": True}}, source="f.toml")


def test_policy_options_are_validated_by_the_policy():
    ok = Config.from_dict({"policy": {"name": "constant", "options": {"k": 3}}})
    assert ok.policy == PolicyConfig("constant", {"k": 3})
    with pytest.raises(ConfigError) as info:
        Config.from_dict({"policy": {"name": "bass", "options": {"l0": 0}}}, source="f.toml")
    msg = str(info.value)
    assert msg.startswith("f.toml: [policy].options for policy 'bass'")
    assert "l0" in msg and "got 0" in msg and "bass policies" in msg
    assert isinstance(info.value.__cause__, ValueError)
    with pytest.raises(
        ConfigError, match=r"has no option 'k' \(did you mean 'k0'\?\); options: k_max=32"
    ):
        Config.from_dict({"policy": {"options": {"k": 3}}})


def test_labels_name_command_line_flags():
    with pytest.raises(ConfigError) as info:
        Config.from_dict(
            {"generation": {"top_k": 0}},
            source="command line",
            labels={"generation.top_k": "--top-k"},
        )
    assert str(info.value).startswith("command line: --top-k = 0 is not allowed")


@pytest.mark.parametrize(
    ("text", "match"),
    [("[generation\n", "not valid TOML"), ("x = 1\n", "unknown table 'x'")],
)
def test_file_errors(tmp_path, text, match):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match=match) as info:
        load_config(path)
    assert str(path) in str(info.value)


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(ConfigError, match="does not exist; check the path"):
        load_config(tmp_path / "nope.toml")
    with pytest.raises(ConfigError, match="is a directory"):
        load_config(tmp_path)
    assert issubclass(ConfigError, ValueError)


def test_compile_and_attention_values(tmp_path):
    c = Config.from_dict({"model": {"compile": "reduce-overhead", "attention": "sdpa"}})
    assert c.generator_kwargs()["compile"] == "reduce-overhead"
    with pytest.raises(ConfigError, match=r'\[model\].compile = .fast. .*"reduce-overhead"'):
        Config.from_dict({"model": {"compile": "fast"}})
    # the engine's packed passes have no padded-only implementation
    with pytest.raises(ConfigError, match=r"\[model\].attention = 'sdpa_padded'"):
        Config.from_dict({"model": {"attention": "sdpa_padded"}})
