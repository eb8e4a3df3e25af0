"""Every example of README.md and docs/ runs, so none can rot (issue #27).

Each ```python block runs; a file's blocks run in order in one namespace, as a reader
would run them (a later example uses the names an earlier one made). Model loading is
replaced by tiny random stand-ins, since no weights can be downloaded here and the
embedded model takes ~20 s to load: ``bass.load_default_pair``, ``bass.load_causal_lm``
and ``bass.models.load_tokenizer`` (what ``Generator.from_pretrained`` loads through), and
transformers' ``AutoModelForCausalLM.from_pretrained`` and
``AutoTokenizer.from_pretrained``, return a tiny random float64 Llama (``models.tiny_lm``,
a vocabulary of 64; one model per name) and a word-level tokenizer over its ids
(``cli_support.word_tokenizer``). The requested dtype and device are ignored (float64 on
the CPU). Everything else runs as written: the engine, the ops, ``bass.testing``, models
built from a transformers config.

Each ```toml block with a bass config table (``[model]``, ``[generation]``, ``[policy]``)
is loaded by ``bass.config.load_config``; other TOML (entry points) and shell blocks are
not run. Fences that are not closed, and ```py or unlabelled blocks that hold Python, are
refused, so an example cannot escape the test by its label.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import transformers
from cli_support import WORDS, word_tokenizer
from models import tiny_lm

import bass.models

ROOT = Path(__file__).resolve().parents[2]
FILES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^(`{3,}|~{3,})\s*([\w+-]*)")
CONFIG_TABLE = re.compile(r"^\[(model|generation|policy)(\.options)?\]\s*$", re.MULTILINE)


def blocks(path: Path) -> list[tuple[int, str, str]]:
    """``(line, language, code)`` of every fenced block in ``path``, in order."""
    out, lines, i = [], path.read_text().splitlines(), 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, lang, start = m.group(1), m.group(2).lower(), i + 1
        end = next((j for j in range(start, len(lines)) if lines[j].strip() == fence), None)
        if end is None:
            raise AssertionError(f"{path.name}:{i + 1}: a fence that is never closed")
        out.append((i + 1, lang, "\n".join(lines[start:end]) + "\n"))
        i = end + 1
    return out


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


WITH_PYTHON = [f for f in FILES if any(lang == "python" for _, lang, _ in blocks(f))]
WITH_CONFIG = [
    f for f in FILES if any(lang == "toml" and CONFIG_TABLE.search(c) for _, lang, c in blocks(f))
]


@pytest.fixture
def stand_ins(monkeypatch):
    """Model loading replaced by tiny random models and a word tokenizer (see the module
    docstring); returns the models made, by name."""
    made: dict[str, object] = {}

    def model(name, *args, **kwargs):
        key = str(name)
        if key not in made:
            made[key] = tiny_lm(seed=len(made))
        return made[key]

    def tokenizer(*args, **kwargs):
        return word_tokenizer(WORDS)

    def default_pair(**kwargs):
        return model("default"), tokenizer()

    monkeypatch.setattr(bass.models, "load_default_pair", default_pair)
    monkeypatch.setattr(bass.models, "load_causal_lm", model)
    monkeypatch.setattr(bass.models, "load_tokenizer", tokenizer)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", model)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", tokenizer)
    return made


def test_every_document_with_code_is_found():
    """The examples this test runs: the README's and the docs site's (a page moved out of
    docs/ or a renamed README would otherwise silently leave the test)."""
    names = {_rel(f) for f in WITH_PYTHON}
    assert "README.md" in names
    assert {"docs/guides/generation.md", "docs/reference/ops.md"} <= names
    for f in FILES:
        for line, lang, code in blocks(f):
            looks_like_python = re.search(r"^(import |from \w[\w.]* import )", code, re.M)
            if lang in ("", "py", "python3", "pycon") and looks_like_python:
                raise AssertionError(
                    f"{_rel(f)}:{line}: Python in a block labelled {lang or 'nothing'!r}; "
                    "label it ```python so that it runs here"
                )


def test_readme_links_resolve():
    """The README's relative links (to the docs pages, CHANGELOG.md) name files that exist:
    mkdocs checks the links between docs pages, nothing else checks the README's."""
    text = (ROOT / "README.md").read_text()
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if not re.match(r"[a-z]+:", target):
            assert (ROOT / target).is_file(), f"README.md links to {target}, which is missing"


@pytest.mark.parametrize("path", WITH_PYTHON, ids=_rel)
def test_python_examples_run(path, stand_ins):
    namespace: dict = {"__name__": f"example:{_rel(path)}"}
    for line, lang, code in blocks(path):
        if lang != "python":
            continue
        try:
            exec(compile(code, f"{_rel(path)}:{line}", "exec"), namespace)
        except Exception as e:
            raise AssertionError(
                f"the example at {_rel(path)}:{line} failed: {type(e).__name__}: {e}"
            ) from e


@pytest.mark.parametrize("path", WITH_CONFIG, ids=_rel)
def test_config_examples_load(path, tmp_path):
    from bass.config import load_config

    for line, lang, code in blocks(path):
        if lang == "toml" and CONFIG_TABLE.search(code):
            f = tmp_path / f"line{line}.toml"
            f.write_text(code)
            load_config(f)  # raises ConfigError naming the key on a bad example
