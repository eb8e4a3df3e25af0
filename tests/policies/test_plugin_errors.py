"""Every exception a plugin raises is reported as that plugin's (issue #32): a policy or a
drafter of another package that fails when built or in any hook is named, with its class
and package, in a :class:`bass.errors.PluginError` (the original chained), from the API and
from the command line (one ``bass: error:`` line, not "internal error ... a bug in bass")."""

from __future__ import annotations

import importlib.metadata

import pytest
import torch
from cli_support import one_error_line, run, save_model_dir
from models import tiny_lm

import bass
from bass.drafters import Drafter, Proposal
from bass.errors import PluginError, PluginOutputError
from bass.policies import Policy, registry

PROMPTS = [[1, 2, 3, 4], [5, 6]]
MODULE = "bass_test_broken_plugins"
SOURCE = """
from bass.drafters import Drafter, Proposal
from bass.policies import Policy


class FailsToBuild(Policy):
    name = "fails-to-build"

    def __init__(self):
        raise KeyError("no such table")

    def draft_length(self):
        return 2


class FailsInLengths(Policy):
    name = "fails-in-lengths"

    def draft_lengths(self, ctx):
        return [1 / 0 for _ in ctx.prompts]


class FailsInUpdate(Policy):
    name = "fails-in-update"

    def draft_length(self):
        return 2

    def update(self, stats):
        raise IndexError("history is empty")


class NoHooks:  # registered as a policy, with none of a policy's hooks
    pass


def takes_any(**options):  # a factory: every --policy-option reaches it
    return FailsInUpdate()


class FailsInPropose(Drafter):
    name = "fails-in-propose"

    def propose(self, view, lengths):
        raise RuntimeError("lookup table missing")
"""


@pytest.fixture
def plugins(tmp_path, monkeypatch):
    """A module of broken plugins on sys.path, registered as fake entry points."""
    (tmp_path / f"{MODULE}.py").write_text(SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    policies = {
        n: f"{MODULE}:{c}"
        for n, c in [
            ("fails-to-build", "FailsToBuild"),
            ("fails-in-lengths", "FailsInLengths"),
            ("fails-in-update", "FailsInUpdate"),
            ("no-hooks", "NoHooks"),
            ("takes-any", "takes_any"),
        ]
    }
    eps = [importlib.metadata.EntryPoint(n, v, registry.GROUP) for n, v in policies.items()]
    eps += [ep for n, ep in registry.available().items() if n not in policies]
    monkeypatch.setattr(registry, "entry_points", lambda: eps)
    drafter = importlib.metadata.EntryPoint(
        "fails-in-propose", f"{MODULE}:FailsInPropose", bass.drafters.GROUP
    )
    monkeypatch.setattr(bass.drafters, "entry_points", lambda: [drafter])
    yield
    import sys

    sys.modules.pop(MODULE, None)


@pytest.mark.parametrize(
    ("policy", "hook", "cause"),
    [
        ("fails-to-build", "__init__", KeyError),
        ("fails-in-lengths", "draft_lengths", ZeroDivisionError),
        ("fails-in-update", "update", IndexError),
    ],
)
def test_a_policy_plugin_that_raises_is_named_with_its_package(plugins, policy, hook, cause):
    with pytest.raises(PluginError) as info:
        bass.Generator(tiny_lm(), "ngram", policy=policy).generate(PROMPTS, max_new_tokens=6)
    msg = str(info.value)
    assert f"policy {policy!r}" in msg and f"raised in {hook}()" in msg, msg
    assert MODULE in msg  # where it comes from (its package, or its module outside one)
    assert isinstance(info.value.__cause__, cause)


def test_a_drafter_plugin_that_raises_is_named(plugins):
    gen = bass.Generator(tiny_lm(), "fails-in-propose", policy="constant")
    with pytest.raises(PluginError, match=r"drafter 'fails-in-propose' .* raised in propose\(\)"):
        gen.generate(PROMPTS, max_new_tokens=6)
    assert type(gen.drafter).__name__ == "FailsInPropose"  # the user's object, unwrapped


def test_a_policy_instance_of_the_user_is_named_by_its_class():
    class Mine(Policy):
        def draft_length(self):
            raise ValueError("not tuned yet")

    with pytest.raises(PluginError, match=r"policy \(.*Mine, from .*\) raised in draft_length"):
        bass.Generator(tiny_lm(), "ngram", policy=Mine()).generate(PROMPTS, max_new_tokens=4)


def test_a_drafter_instance_that_returns_nonsense_is_a_plugin_output_error():
    class Odd(Drafter):
        def propose(self, view, lengths):
            return Proposal(
                drafted=[99] * len(view.slots), host_tokens=[[1] * 99] * len(view.slots)
            )

    gen = bass.Generator(tiny_lm(), Odd(), policy="constant")
    with pytest.raises(PluginOutputError, match=r"drafter \(.*Odd, from module .*\) proposed"):
        gen.generate(PROMPTS, max_new_tokens=4)


def test_bass_s_own_errors_stay_bass_s():
    """A bad option of a built-in policy is an OptionError, not a plugin's failure."""
    with pytest.raises(bass.options.OptionError):
        bass.Generator(tiny_lm(), "ngram", policy="bass", policy_options={"l0": -3})


@pytest.mark.parametrize("policy", ["fails-to-build", "fails-in-update"])
def test_the_cli_reports_a_plugin_s_failure_as_the_plugin_s(plugins, capsys, tmp_path, policy):
    model = save_model_dir(tmp_path / "m")
    rc, _, err = run(
        capsys, f"generate --main {model} --draft ngram --policy {policy} --max-new-tokens 6",
        "hello world",
    )  # fmt: skip
    line = one_error_line(err)
    assert rc == 2 and f"policy {policy!r}" in line and "internal error" not in line, err
    assert "a bug in bass" not in line


def test_compiled_and_meta_models_are_refused_when_the_generator_is_built():
    main, draft = tiny_lm(), tiny_lm(seed=1)
    with pytest.raises(TypeError, match=r"torch.compile'd .*pass the model itself"):
        bass.Generator(main, torch.compile(draft))
    with pytest.raises(TypeError, match=r"torch.compile'd .*pass the model itself"):
        bass.Generator(torch.compile(main))
    with torch.device("meta"):
        empty = tiny_lm()
    with pytest.raises(ValueError, match=r"meta device .* never loaded"):
        bass.Generator(empty)
    with pytest.raises(ValueError, match=r"meta device .* never loaded"):
        bass.Generator(main, empty)
    with pytest.raises(ValueError, match=r"^the main model LlamaForCausalLM has weights on"):
        bass.Generator(empty)  # its own message: no repr of the module, no "expected"


def test_a_model_without_a_language_model_head_is_refused_when_the_generator_is_built():
    """AutoModel instead of AutoModelForCausalLM: named, not an AttributeError later."""
    main = tiny_lm()
    for args, role in (((main.model,), "main"), ((main, main.model), "draft")):
        with pytest.raises(ValueError, match=rf"the {role} model LlamaModel has no language-model"):
            bass.Generator(*args)


def test_a_meta_prompt_and_a_tokenizer_that_does_not_return_text_are_named():
    gen = bass.Generator(tiny_lm())
    with pytest.raises(TypeError, match="prompt 1 is a tensor on the meta device"):
        gen.generate([[1, 2], torch.tensor([1, 2], device="meta")], max_new_tokens=2)

    class Ids:
        def decode(self, ids, skip_special_tokens=True):
            return list(ids)

    with pytest.raises(TypeError, match=r"tokenizer.decode returned list .*not text"):
        gen.generate([[1, 2, 3]], max_new_tokens=4, stop_strings=["x"], tokenizer=Ids())


def test_a_plugins_package_is_looked_up_only_when_it_fails(monkeypatch):
    """Naming a plugin's package reads every installed package's metadata (~0.1 s): done
    for an error's message, never for each generation a working plugin runs."""

    class Works(Policy):
        def draft_length(self):
            return 1

    def looked_up(*args, **kwargs):
        raise AssertionError("a working plugin's package was looked up")

    gen = bass.Generator(tiny_lm(), "ngram", policy=Works())
    monkeypatch.setattr(bass.plugins, "describe", looked_up)
    for _ in range(2):
        gen.generate(PROMPTS, max_new_tokens=3)


def test_a_drafter_plugin_that_fails_to_load_is_named_with_the_file_and_key(
    tmp_path, capsys, monkeypatch, no_model_load
):
    """Like a policy's: reported with where it was chosen, before any model loads."""
    broken = importlib.metadata.EntryPoint(
        "broken", "bass_test_no_such_module:Drafter", bass.drafters.GROUP
    )
    monkeypatch.setattr(bass.drafters, "entry_points", lambda: [broken])
    config = tmp_path / "c.toml"
    config.write_text('[model]\ndraft = "broken"\n')
    for args, where in (
        (f"--config {config}", f"{config}: [model].draft"),
        ("--draft broken", "command line: --draft"),
    ):
        rc, _, err = run(capsys, f"generate --main {tmp_path} {args} hello")
        line = one_error_line(err)
        assert rc == 2 and line.startswith(f"bass: error: {where} = 'broken': drafter"), err
        assert "failed to load: ModuleNotFoundError" in line


def test_bass_policies_says_which_plugin_is_no_policy(plugins, capsys):
    rc, out, _ = run(capsys, "policies")
    assert rc == 0
    entry = out[out.index("no-hooks  (") :].split("\n\n")[0]
    assert "not a policy: lacks draft_length()" in entry and "decides" not in entry
    assert "fails-in-update  (" in out and "constant  (" in out  # the others listed
    # another package's is named with where it comes from; a **kwargs factory has options
    assert f"no-hooks  ({MODULE}:NoHooks, from module {MODULE})" in out
    assert "constant  (bass.policies" in out and "from bass" not in out
    entry = out[out.index("takes-any  (") :].split("\n\n")[0]
    assert "(takes any option" in entry and "(no options)" not in entry
