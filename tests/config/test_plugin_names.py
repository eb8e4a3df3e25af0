"""One name, one plugin: bass's own policies and drafters always win over another
package's entry point of the same name (ignored, with a warning naming it), and a name
that two other packages register selects neither (an error naming both), while listings
still show it. The entry points here are real ones, read from distributions written to
temporary directories, so that each knows the package that registered it."""

from __future__ import annotations

import importlib.metadata
import re
import warnings

import pytest
from models import tiny_lm

import bass
import bass.drafters
from bass import cli, plugins
from bass.config import Config, ConfigError
from bass.drafters import DrafterLoadError, NGramDrafter
from bass.errors import PluginError
from bass.policies import registry
from bass.policies.registry import PolicyLoadError

POLICIES, DRAFTERS = registry.GROUP, bass.drafters.GROUP


def distribution(root, name: str, version: str, entries: dict[str, dict[str, str]]) -> list:
    """The entry points of a distribution ``name`` written under ``root`` (its own
    directory): ``entries`` is group -> name -> "module:attr"."""
    where = root / name
    info = where / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(
        "".join(
            f"[{group}]\n" + "".join(f"{n} = {v}\n" for n, v in eps.items()) + "\n"
            for group, eps in entries.items()
        )
    )
    (dist,) = importlib.metadata.distributions(path=[str(where)])
    return list(dist.entry_points)


@pytest.fixture
def install(monkeypatch):
    """``install(*entry_points)``: these (with bass's own) are what is installed; each
    shadow is warned about anew."""
    monkeypatch.setattr(plugins, "_warned", set())

    def set_up(*eps):
        def group(name):
            return lambda: [ep for ep in eps if ep.group == name]

        monkeypatch.setattr(registry, "entry_points", group(POLICIES))
        monkeypatch.setattr(bass.drafters, "entry_points", group(DRAFTERS))

    return set_up


def test_another_package_cannot_replace_bass_own_plugins(tmp_path, install):
    install(
        *distribution(
            tmp_path,
            "shadow-pkg",
            "0.3",
            {DRAFTERS: {"ngram": "shadow_mod:Evil"}, POLICIES: {"adaptive": "shadow_mod:Zero"}},
        )
    )
    with pytest.warns(UserWarning) as seen:
        drafters = bass.drafters.available()
        policies = registry.available()
    assert drafters["ngram"].value == plugins.BUILTIN[DRAFTERS]["ngram"]
    assert policies["adaptive"].value == plugins.BUILTIN[POLICIES]["adaptive"]
    texts = sorted(str(w.message) for w in seen)
    assert len(texts) == 2
    for text, kind, name, value in [
        (texts[0], "drafter", "ngram", "shadow_mod:Evil"),
        (texts[1], "policy", "adaptive", "shadow_mod:Zero"),
    ]:
        assert f"bass ignores the {kind} {name!r} that shadow-pkg 0.3 registers" in text
        assert f"(entry point {value!r})" in text
        assert f"{name!r} is bass's own {kind}" in text
        assert "cannot be selected under this name (ask its authors to rename it)" in text
    assert all(w.filename == __file__ for w in seen)  # the caller's line, not bass's
    with warnings.catch_warnings():  # once: selecting them warns no more
        warnings.simplefilter("error")
        assert type(bass.Generator(tiny_lm(), "ngram").drafter) is NGramDrafter
        assert type(bass.policies.load("adaptive")).__name__ == "AdaptivePolicy"


def test_the_command_shows_a_shadowed_plugin_as_one_warning_line(
    tmp_path, install, capsys, monkeypatch
):
    """Run as a command: ``bass: warning: ...`` on stderr, not Python's two lines (the
    script's path and line number, then its source line ``sys.exit(main())``)."""
    install(*distribution(tmp_path, "shadow-pkg", "0.3", {POLICIES: {"bass": "m:Zero"}}))
    monkeypatch.setattr("sys.argv", ["bass", "policies"])
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        before = warnings.showwarning
        assert cli.main() == 0
        assert warnings.showwarning is before  # (only for the command's duration)
    err = capsys.readouterr().err
    line = "bass: warning: bass ignores the policy 'bass' that shadow-pkg 0.3 registers"
    assert line in err and "UserWarning" not in err and "sys.exit" not in err, err


def test_a_name_two_packages_register_selects_neither(tmp_path, install, capsys):
    a = distribution(
        tmp_path,
        "pkg-a",
        "1.0",
        {POLICIES: {"long": "a_mod:Long"}, DRAFTERS: {"twin": "a_mod:Twin"}},
    )
    b = distribution(
        tmp_path,
        "pkg_b",
        "2.0",
        {POLICIES: {"long": "b_mod:Long"}, DRAFTERS: {"twin": "b_mod:Twin"}},
    )
    install(*a, *b)
    both = r"is registered by 2 packages: pkg-a 1.0 \('a_mod:{0}'\) and pkg_b 2.0 \('b_mod:{0}'\)"
    rename = "uninstall all but one of them, or ask their authors to register distinct names"

    listed = registry.available()["long"]  # listed, as both
    assert isinstance(listed, plugins.AmbiguousEntryPoint)
    assert listed.value == "a_mod:Long or b_mod:Long"
    with pytest.raises(PolicyLoadError, match="policy 'long' " + both.format("Long")) as err:
        bass.policies.load("long")
    assert rename in str(err.value) and err.value.plugin == "long"
    assert isinstance(err.value, PluginError)
    with pytest.raises(PolicyLoadError, match=both.format("Long")):
        bass.Generator(tiny_lm(), None, policy="long")

    assert "twin" in bass.drafters.available()
    with pytest.raises(DrafterLoadError, match="drafter 'twin' " + both.format("Twin")):
        bass.Generator(tiny_lm(), "twin")

    with pytest.raises(ConfigError) as err:  # in a config file: the file, the key
        Config.from_dict({"policy": {"name": "long"}}, source="f.toml")
    assert str(err.value).startswith("f.toml: [policy].name = 'long' cannot be used: ")
    assert re.search(both.format("Long"), str(err.value))

    assert cli.main(["policies"]) == 0  # `bass policies` lists the others, and the clash
    out = capsys.readouterr().out
    assert "long  (a_mod:Long or b_mod:Long)\n    policy 'long' is registered by 2 packages" in out
    assert re.search(both.format("Long"), out)
    assert "constant  (bass.policies.builtin:ConstantPolicy)" in out


def test_one_object_under_one_name_is_no_clash(tmp_path, install):
    """Two packages naming the very same object, or a package naming a built-in's own
    object under its name, change nothing: no warning, no error. A built-in stays listed
    when another name points at its object too."""
    same = {POLICIES: {"mine": "bass.policies.builtin:ConstantPolicy"}}
    install(
        *distribution(tmp_path, "pkg-a", "1.0", same),
        *distribution(tmp_path, "pkg-b", "1.0", same),
        *distribution(tmp_path, "pkg-c", "1.0", {DRAFTERS: plugins.BUILTIN[DRAFTERS]}),
        *distribution(
            tmp_path, "pkg-d", "1.0", {DRAFTERS: {"lookup": "bass.drafters:NGramDrafter"}}
        ),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert type(bass.policies.load("mine")).__name__ == "ConstantPolicy"
        assert {"ngram", "lookup"} <= set(bass.drafters.available())
        assert type(bass.Generator(tiny_lm(), "lookup").drafter) is NGramDrafter


def test_bass_own_distribution_is_bass_own(tmp_path, install):
    """bass's own metadata (its distribution's name spelled any way pip allows) is no
    shadow; where it is stale (another object for a built-in's name), the code's wins."""
    stale = {**plugins.BUILTIN[POLICIES], "constant": "old_bass:Constant"}
    install(*distribution(tmp_path, "Bass_Decoding", "0.0.1", {POLICIES: stale}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        found = registry.available()
    assert {n: ep.value for n, ep in found.items()} == plugins.BUILTIN[POLICIES]
    assert found["adaptive"].dist is not None  # the installed entry point, kept
