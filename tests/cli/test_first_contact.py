"""What a new user meets first: ``bass --version`` answers (and says which bass runs), and
every install command in the README and the docs names the distribution pyproject
declares, which is not the index's unrelated ``bass``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from cli_support import run

import bass
from bass.config import read_toml

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = read_toml(ROOT / "pyproject.toml")


def test_version_says_which_bass_runs(capsys):
    rc, out, err = run(capsys, "--version")
    assert rc == 0 and err == ""
    where = Path(bass.__file__).resolve().parent
    assert out.startswith(f"bass {bass.__version__} from {where} (Python "), out
    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", bass.__version__)


def test_the_version_has_one_source():
    """pyproject reads the version from ``bass.__version__`` (so an install and a source
    tree report the version of the code that runs)."""
    project = PYPROJECT["project"]
    assert "version" in project.get("dynamic", []) and "version" not in project
    dynamic = PYPROJECT["tool"]["setuptools"]["dynamic"]["version"]
    assert dynamic == {"attr": "bass.__version__"}


def install_commands() -> list[tuple[str, str]]:
    """(file, command) for every ``pip install`` of the README and the docs."""
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for match in re.finditer(r"pip install [^`\n]*", path.read_text(encoding="utf-8")):
            found.append((str(path.relative_to(ROOT)), match.group(0)))
    return found


def test_install_commands_name_our_distribution():
    name = PYPROJECT["project"]["name"]
    assert name != "bass"  # on the package index: an unrelated static-site generator
    assert PYPROJECT["project"]["scripts"]["bass"] == "bass.cli:main"  # the command keeps
    commands = install_commands()
    assert commands
    for where, command in commands:
        # an extra is installed from the checkout ("-e .[x]") or by our name ("name[x]")
        for extra in re.findall(r"""(?:^|\s)['"]?([\w.-]*)\[[\w,-]+\]""", command):
            assert extra in ("", ".", name), (where, command)
        assert not re.search(r"pip install (-[-\w]+ )*['\"]?bass\b(?!-)", command), (
            where,
            command,
        )


@pytest.mark.parametrize("extra", ["testing", "eval", "plot", "progress", "distributed"])
def test_the_extras_the_docs_name_exist(extra):
    assert extra in PYPROJECT["project"]["optional-dependencies"]


def test_ctrl_c_while_the_command_imports_is_one_line(monkeypatch, capsys):
    """Ctrl-C in a command's first seconds (its modules importing, before its own handler)
    printed a 40-line KeyboardInterrupt traceback, and the process died of the signal."""
    import bass.cli

    def importing(argv):
        raise KeyboardInterrupt

    monkeypatch.setattr(bass.cli, "_main", importing)
    assert bass.cli.main() == 130
    assert capsys.readouterr().err == "bass: interrupted\n"
