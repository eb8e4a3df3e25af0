"""A config's policy that cannot be used, reported with the file (or the command line) and
the key at fault: ``[policy].name`` (``--policy``) for a policy that does not load,
``[policy].options`` (``--policy-option``) for options it refuses, and the plugin's own
failure while being built as its :class:`~bass.errors.PluginError`, the file and key first.
And the note of ``--policy`` over a file's policy, which says what the new one runs with."""

from __future__ import annotations

import importlib.metadata
import sys

import pytest

from bass.cli.parser import build_parser
from bass.cli.settings import resolve_config
from bass.config import Config, ConfigError, load_config
from bass.errors import PluginError
from bass.policies import registry
from bass.policies.registry import PolicyLoadError

MODULE = "bass_test_config_policies"
SOURCE = '''
class BadInit:
    """Fails while being built."""

    def __init__(self, k=1):
        raise RuntimeError("init failed")

    def draft_length(self):
        return 1

    def update(self, record):
        pass
'''


@pytest.fixture(autouse=True)
def installed(tmp_path, monkeypatch):
    (tmp_path / f"{MODULE}.py").write_text(SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    eps = [
        importlib.metadata.EntryPoint(name, value, registry.GROUP)
        for name, value in [
            ("bad-import", "no_such_module_for_bass:Policy"),
            ("bad-init", f"{MODULE}:BadInit"),
            ("not-policy", "collections:OrderedDict"),
        ]
    ]
    monkeypatch.setattr(registry, "entry_points", lambda: eps)
    yield
    sys.modules.pop(MODULE, None)


def write(tmp_path, text: str):
    path = tmp_path / "bass.toml"
    path.write_text(text)
    return str(path)


def cli_config(*argv: str):
    return resolve_config(build_parser().parse_args(["generate", *argv, "hello"]))


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("bad-import", "(entry point 'no_such_module_for_bass:Policy') failed to load: Module"),
        ("not-policy", "(OrderedDict, from module collections) lacks draft_length()"),
    ],
)
def test_a_policy_that_does_not_load_is_the_names_fault(tmp_path, name, why):
    path = write(tmp_path, f'[policy]\nname = "{name}"\n')
    with pytest.raises(ConfigError) as err:
        load_config(path)
    msg = str(err.value)
    assert msg.startswith(f"{path}: [policy].name = {name!r} cannot be used: policy {name!r}")
    assert why in msg and "options" not in msg
    assert isinstance(err.value.__cause__, PolicyLoadError) and err.value.option == "policy"

    with pytest.raises(ConfigError) as err:  # a flag: named as typed
        Config.from_dict(
            {"policy": {"name": name}}, source="command line", labels={"policy.name": "--policy"}
        )
    assert str(err.value).startswith(f"command line: --policy = {name!r} cannot be used: ")
    for argv in (["--policy", name], ["--policy", name, "--policy-option", "k=1"]):
        with pytest.raises(ConfigError) as err:
            cli_config(*argv)
        assert str(err.value).startswith(f"command line: --policy = {name!r} cannot be used: ")
        assert why in str(err.value)


def test_a_policy_failing_to_build_is_its_own_error_after_the_file_and_key(tmp_path):
    path = write(tmp_path, '[policy]\nname = "bad-init"\n')
    with pytest.raises(PluginError) as err:
        load_config(path)
    msg = str(err.value)
    assert msg.startswith(f"{path}: [policy].name = 'bad-init': policy 'bad-init' (BadInit")
    assert msg.endswith("raised in __init__(): RuntimeError: init failed")
    assert isinstance(err.value.__cause__, RuntimeError)
    assert err.value.hook == "__init__" and "BadInit" in err.value.plugin

    path = write(tmp_path, '[policy]\nname = "bad-init"\n[policy.options]\nk = 2\n')
    with pytest.raises(PluginError, match="init failed") as err:
        load_config(path)
    assert str(err.value).startswith(
        f"{path}: [policy].name = 'bad-init' with [policy].options = {{'k': 2}}: policy 'bad-init'"
    )
    with pytest.raises(PluginError) as err:
        cli_config("--policy", "bad-init", "--policy-option", "k=2")
    assert str(err.value).startswith(
        "command line: --policy = 'bad-init' with --policy-option = {'k': 2}: policy 'bad-init'"
    )


def test_options_a_plugin_refuses_are_the_options_fault(tmp_path):
    path = write(tmp_path, '[policy]\nname = "bad-init"\n[policy.options]\nx = 2\n')
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value).startswith(
        f"{path}: [policy].options for policy 'bad-init': policy 'bad-init' has no option 'x'"
    )
    with pytest.raises(ConfigError) as err:
        cli_config("--policy", "bad-init", "--policy-option", "x=2")
    assert str(err.value).startswith("command line: --policy-option for policy 'bad-init': ")


def test_the_note_of_policy_over_the_files_says_what_it_runs_with(tmp_path, capsys):
    path = write(tmp_path, '[policy]\nname = "bass"\n[policy.options]\nl0 = 5\n')
    config = cli_config("--config", path, "--policy", "constant", "--policy-option", "k=1")
    assert (config.policy.name, config.policy.options) == ("constant", {"k": 1})
    err = capsys.readouterr().err
    assert (
        "note: --policy constant runs with --policy-option k=1 (its own defaults for the "
        f"rest): the [policy.options] in {path} (l0) are for policy 'bass', and left out"
    ) in err
    assert "its own defaults:" not in err

    config = cli_config("--config", path, "--policy", "constant")
    assert (config.policy.name, config.policy.options) == ("constant", {})
    assert (
        f"note: --policy constant runs with its own defaults: the [policy.options] in {path} "
        "(l0) are for policy 'bass' (set constant's with --policy-option)"
    ) in capsys.readouterr().err
