"""Tests of bass.policies' loading: the entry-point registry (built-ins and third-party
plugins, their failures), option parsing and validation, ``describe``, the public API.

Nothing is installed: the ``bass.policies`` entry points are faked by monkeypatching
``bass.policies.registry.entry_points``, the registry's only reader of installed metadata.
"""

from __future__ import annotations

import importlib.metadata
import math
import re
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import bass.policies
from bass.policies import (
    PolicyLoadError,
    StepRecord,
    available,
    describe,
    is_policy,
    load,
    parse_options,
    registry,
)
from bass.policies.builtin import (
    BUILTIN_ENTRY_POINTS,
    BassPolicy,
    ConfidencePolicy,
    ConstantPolicy,
)
from bass.policies.goodput import GoodputPolicy

GROUP = "bass.policies"


def _eps(mapping: dict[str, str]) -> list[importlib.metadata.EntryPoint]:
    return [importlib.metadata.EntryPoint(name=n, value=v, group=GROUP) for n, v in mapping.items()]


@pytest.fixture
def builtin_eps(monkeypatch):
    """Pretend exactly the built-ins are installed (what pyproject will declare); returns
    a function adding more fake entry points."""
    installed = dict(BUILTIN_ENTRY_POINTS)
    monkeypatch.setattr(registry, "entry_points", lambda: _eps(installed))

    def add(**more: str) -> None:
        installed.update(more)

    return add


@pytest.fixture
def plugin_dir(tmp_path, monkeypatch):
    """A directory on sys.path for throwaway plugin modules, unloaded afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:
        if name.startswith("tests_helper") or name.startswith("broken_plugin"):
            del sys.modules[name]


# --------------------------------------------------------------------------- options


@pytest.mark.parametrize(
    ("policy", "options", "bad", "listing"),
    [
        ("constant", {"k": -1}, "k", "k=4"),
        ("constant", {"k": 2.5}, "k", "k=4"),
        ("constant", {"k": True}, "k", "k=4"),
        ("bass", {"l0": 0}, "l0", "l0=7, l_incre=2, l_mod=10, l_limit=32"),
        ("bass", {"l0": 33}, "l0", "l0=7"),
        ("bass", {"l0": "7"}, "l0", "l0=7"),
        ("bass", {"l_incre": 0}, "l_incre", "l_incre=2"),
        ("bass", {"l_mod": 0}, "l_mod", "l_mod=10"),
        ("bass", {"l_limit": 0}, "l_limit", "l_limit=32"),
        ("hf-heuristic", {"k0": 0}, "k0", "k0=5, max_k=64"),
        ("hf-heuristic", {"k0": 65}, "k0", "k0=5"),
        ("hf-heuristic", {"max_k": 0}, "max_k", "max_k=64"),
        ("confidence", {"k_max": 0}, "k_max", "k_max=8, min_top1=0.4, max_entropy=None"),
        ("confidence", {"min_top1": 1.5}, "min_top1", "min_top1=0.4"),
        ("confidence", {"min_top1": math.nan}, "min_top1", "min_top1=0.4"),
        ("confidence", {"max_entropy": -1.0}, "max_entropy", "max_entropy=None"),
        ("goodput", {"k_max": 0}, "k_max", "k_max=8, k0=4, ema=0.3, probe_every=8"),
        ("goodput", {"k0": 9}, "k0", "k0=4"),
        ("goodput", {"ema": 0}, "ema", "ema=0.3"),
        ("goodput", {"ema": 1.5}, "ema", "ema=0.3"),
        ("goodput", {"probe_every": 0}, "probe_every", "probe_every=8"),
    ],
)
def test_builtin_option_validation(builtin_eps, policy, options, bad, listing):
    with pytest.raises(ValueError) as info:
        load(policy, **options)
    msg = str(info.value)
    assert f"policy {policy!r}" in msg
    assert f"option {bad!r}" in msg
    assert "must be" in msg and listing in msg


def test_option_error_says_what_is_allowed():
    with pytest.raises(ValueError, match=re.escape("an int in [1, l_limit=32], got 40")):
        BassPolicy(l0=40)
    with pytest.raises(ValueError, match=re.escape("a number in (0, 1], got 0")):
        GoodputPolicy(ema=0)
    with pytest.raises(ValueError, match=re.escape("a number >= 0 or None, got -1")):
        ConfidencePolicy(max_entropy=-1)
    assert isinstance(ConfidencePolicy(min_top1=1).min_top1, float)  # ints become floats


def test_load_unknown_option_name(builtin_eps):
    msg = "policy 'bass' has no option 'l1'; options: l0=7, l_incre=2, l_mod=10, l_limit=32"
    with pytest.raises(ValueError, match=re.escape(msg)):
        load("bass", l1=3)


def test_describe_builtins(builtin_eps):
    for name in BUILTIN_ENTRY_POINTS:
        infos = describe(name)
        assert infos and all(isinstance(i.help, str) and i.help for i in infos)
    assert [(i.name, i.default) for i in describe("bass")] == [
        ("l0", 7),
        ("l_incre", 2),
        ("l_mod", 10),
        ("l_limit", 32),
    ]
    option, default, _help = describe("constant")[0]
    assert (option, default) == ("k", 4)


def test_parse_options(builtin_eps):
    assert parse_options("bass", ["l0=5", "l_limit = 16"]) == {"l0": 5, "l_limit": 16}
    opts = parse_options("confidence", {"min_top1": "0.5", "max_entropy": "2"})
    assert opts == {"min_top1": 0.5, "max_entropy": 2}
    assert load("confidence", **opts).max_entropy == 2.0
    assert parse_options("constant", ["k=1.5"]) == {"k": 1.5}  # load then rejects it
    # a string option takes "none" as its text, as a config file's "none" (else: None)
    from bass.policies.registry import _parse_value

    assert [_parse_value("none", d) for d in ("fast", 0.4, None)] == ["none", None, None]
    with pytest.raises(ValueError, match="name=value"):
        parse_options("bass", ["l0"])


# --------------------------------------------------------------------------- registry


def test_builtins_are_there_without_installed_metadata(monkeypatch):
    """bass's own policies do not depend on its distribution's metadata (a source tree)."""
    from bass import plugins

    monkeypatch.setattr(registry, "entry_points", lambda: [])
    assert {n: ep.value for n, ep in available().items()} == plugins.BUILTIN["bass.policies"]
    assert isinstance(load("bass"), BassPolicy)


def test_available_sorted_and_a_shared_name_is_ambiguous(monkeypatch):
    eps = _eps({"zeta": "a:B", "alpha": "c:D"}) + _eps({"zeta": "other:E"})
    monkeypatch.setattr(registry, "entry_points", lambda: eps)
    found = available()
    assert list(found) == sorted(found) and {"alpha", "zeta", "constant"} <= set(found)
    assert found["zeta"].value == "a:B or other:E"
    with pytest.raises(PolicyLoadError, match="'zeta' is registered by 2 packages"):
        load("zeta")


def test_load_unknown_name_lists_installed(builtin_eps):
    installed = "adaptive, bass, confidence, constant, goodput, hf-heuristic"
    msg = f"unknown policy 'bas'; installed: {installed}"
    with pytest.raises(ValueError, match=re.escape(msg)):
        load("bas")


def test_builtins_load_and_satisfy_protocol(builtin_eps):
    assert set(available()) == set(BUILTIN_ENTRY_POINTS)
    for name in BUILTIN_ENTRY_POINTS:
        policy = load(name)
        assert is_policy(policy)
        assert type(policy).name == name
        assert isinstance(policy.draft_length(), int)
    assert load("bass", l0=5, l_limit=8).draft_length() == 5


def test_builtin_entry_points_match_installed_metadata():
    """Once pyproject declares the table, installed metadata must mirror the constant."""
    from pathlib import Path

    from bass.config import read_toml

    name = read_toml(Path(__file__).parents[2] / "pyproject.toml")["project"]["name"]
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"bass is not installed as {name!r} (reinstall: pip install -e .)")
    declared = {ep.name: ep.value for ep in dist.entry_points if ep.group == GROUP}
    if not declared:
        pytest.skip("pyproject.toml declares no bass.policies entry points yet (reinstall)")
    assert declared == BUILTIN_ENTRY_POINTS


HELPER = """
    class MyPolicy:
        option_help = {"k": "tokens per step"}

        def __init__(self, k=3, *, scale=1.0):
            self.k, self.scale, self.seen = k, scale, []

        def draft_length(self):
            return self.k

        def update(self, stats):
            self.seen.append(stats.max_accepted())


    def make_policy(**options):
        return MyPolicy(**options)


    class NotAPolicy:
        pass
"""


def test_third_party_policy_through_fake_entry_point(builtin_eps, plugin_dir):
    (plugin_dir / "tests_helper_module.py").write_text(textwrap.dedent(HELPER))
    builtin_eps(
        mine="tests_helper_module:MyPolicy",
        factory="tests_helper_module:make_policy",
    )
    assert "mine" in available() and "factory" in available()
    p = load("mine", k=2)
    assert is_policy(p) and p.draft_length() == 2
    p.update(StepRecord(draft_length=2, accepted=[1, 2], drafted=None))
    assert p.seen == [2]
    assert describe("mine") == [("k", 3, "tokens per step"), ("scale", 1.0, "")]
    with pytest.raises(
        ValueError, match=re.escape("no option 'kk' (did you mean 'k'?); options: k=3, scale=1.0")
    ):
        load("mine", kk=1)
    # A **options factory: names are the factory's business.
    assert load("factory", k=6).draft_length() == 6
    assert describe("factory") == []


def test_plugin_not_a_policy(builtin_eps, plugin_dir):
    (plugin_dir / "tests_helper_bad.py").write_text(textwrap.dedent(HELPER))
    builtin_eps(nope="tests_helper_bad:NotAPolicy", missing="tests_helper_bad:Missing")
    with pytest.raises(
        PolicyLoadError, match=r"'nope' \(NotAPolicy, from module tests_helper_bad\) lacks"
    ):
        load("nope")
    with pytest.raises(PolicyLoadError, match="'tests_helper_bad:Missing'") as info:
        load("missing")
    assert isinstance(info.value.__cause__, AttributeError)


def test_plugin_import_failure(builtin_eps, plugin_dir):
    (plugin_dir / "broken_plugin_module.py").write_text(
        'raise ImportError("No module named frobnicate")\n'
    )
    builtin_eps(broken="broken_plugin_module:Policy")
    with pytest.raises(PolicyLoadError) as info:
        load("broken")
    msg = str(info.value)
    assert "'broken'" in msg and "'broken_plugin_module:Policy'" in msg and "frobnicate" in msg
    assert isinstance(info.value.__cause__, ImportError)
    assert isinstance(info.value, ImportError)
    with pytest.raises(PolicyLoadError):
        describe("broken")
    # The other policies still load.
    assert load("constant").draft_length() == 4


def test_public_api():
    assert set(bass.policies.__all__) >= {
        "StepRecord",
        "Policy",
        "EarlyStop",
        "available",
        "load",
        "describe",
        "PolicyLoadError",
    }


def test_builtin_plugins_are_the_ones_pyproject_registers():
    import tomllib

    from bass import plugins

    root = Path(__file__).resolve().parents[2]
    declared = tomllib.loads((root / "pyproject.toml").read_text())["project"]["entry-points"]
    assert {g: declared[g] for g in plugins.BUILTIN} == plugins.BUILTIN
    assert set(declared) == set(plugins.BUILTIN)


def test_a_generator_looks_its_named_policy_up_once(monkeypatch):
    """Finding a named policy scans every installed package's metadata (~10 ms): a
    Generator does it once per ``policy_spec``, and still builds a fresh policy for every
    generation."""
    import torch
    from models import tiny_lm

    from bass import Generator

    scans = []
    real = registry.entry_points
    monkeypatch.setattr(registry, "entry_points", lambda: scans.append(1) or real())
    gen = Generator(tiny_lm("llama", dtype=torch.float32), "ngram", policy="constant",
                    policy_options={"k": 1})  # fmt: skip
    built = len(scans)  # the constructor checks the name and builds one
    first, second = gen.new_policy(), gen.new_policy()
    assert first is not second and first.k == second.k == 1
    gen.generate([[1, 2, 3]], max_new_tokens=3)
    gen.generate([[1, 2, 3]], max_new_tokens=3)
    assert len(scans) == built
    gen.policy_spec[1]["k"] = 2  # the options changed in place: looked up again
    assert gen.new_policy().k == 2 and len(scans) == built + 1
    gen.policy_spec = ("adaptive", {})
    assert type(gen.new_policy()).__name__ == "AdaptivePolicy" and len(scans) == built + 2
    # instances by identity: a dataclass policy equal to the last one is still another
    one, other = ConstantPolicy(k=3), ConstantPolicy(k=3)
    gen.policy_spec = (one, {})
    assert gen.new_policy() is one
    gen.policy_spec = (other, {})
    assert gen.new_policy() is other


GATE = """
    class Gate:
        def __init__(self, enabled=False, k=2, label="x", cap=None):
            self.enabled, self.k = enabled, k

        def draft_length(self):
            return self.k if self.enabled else 0

        def update(self, record):
            pass
"""


def test_a_value_its_options_default_type_refuses_is_refused_naming_it(builtin_eps, plugin_dir):
    """Text that did not convert reached the plugin as text: ``enabled=flase`` (a non-empty
    string: true) drafted silently, ``k=abc`` failed mid-generation naming no option."""
    (plugin_dir / "tests_helper_gate.py").write_text(textwrap.dedent(GATE))
    builtin_eps(gate="tests_helper_gate:Gate")
    assert load("gate", **parse_options("gate", ["enabled=false"])).draft_length() == 0
    assert load("gate", enabled=True, k=3.0, label=5, cap="anything").draft_length() == 3
    assert load("gate", k=None).k is None  # "none" for a number: the policy's to check
    assert load("gate", enabled=np.bool_(True), k=np.int64(4)).draft_length() == 4  # numpy's
    for given, said in [
        (["enabled=flase"], "option 'enabled' = 'flase': expected true or false (its default"),
        (["k=abc"], "option 'k' = 'abc': expected a number (its default: 2)"),
    ]:
        with pytest.raises(ValueError, match=re.escape(f"policy 'gate' {said}")):
            load("gate", **parse_options("gate", given))
    with pytest.raises(ValueError, match="option 'enabled' = 'false': expected true or false"):
        load("gate", enabled="false")  # a config file's string
    with pytest.raises(ValueError, match="option 'k' = True: expected a number"):
        load("gate", k=True)
