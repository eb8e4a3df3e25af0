"""Helpers of the command-line tests: a tiny model directory with a word-level
tokenizer over its 64 ids (so ``bass generate --main DIR`` runs as on a real model), and
running ``bass`` in-process."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

from models import tiny_lm

import bass
from bass import cli

WORDS = ["<unk>", "<s>", "</s>", "hello", "world", "the", "sea", "is", "blue", "a", "cat"]
WORDS += [f"w{i}" for i in range(64 - len(WORDS))]


def word_tokenizer(words):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )


def save_model_dir(path) -> str:
    """A tiny random Llama and its word tokenizer saved in ``path``."""
    tiny_lm().save_pretrained(path)
    word_tokenizer(WORDS).save_pretrained(path)
    return str(path)


def run(capsys, command: str, *prompts: str):
    """``bass COMMAND PROMPT...``; returns (exit status, stdout, stderr)."""
    rc = cli.main([*shlex.split(command), *prompts])
    out, err = capsys.readouterr()
    return rc, out, err


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def one_error_line(err: str) -> str:
    """The one ``bass: error:`` line of ``err`` (no traceback, no usage block)."""
    lines = [line for line in err.splitlines() if line.startswith("bass: error:")]
    assert len(lines) == 1 and "Traceback" not in err and "usage:" not in err, err
    return lines[0]


def refuse_model_loads(monkeypatch) -> None:
    """Loading a model fails the test: the command must refuse before it."""
    import bass.cli.generate
    import bass.cli.humaneval

    def load(*a, **kw):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(bass.cli.generate, "load_models", load)
    monkeypatch.setattr(bass.cli.humaneval, "load_models", load)


def subprocess_env() -> dict:
    """The environment of a ``bass`` subprocess: this test's bass (its source tree first
    on ``PYTHONPATH``), output unbuffered, no ``BASS_DEBUG``."""
    src = str(Path(bass.__file__).resolve().parents[1])
    path = os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    env.pop("BASS_DEBUG", None)
    return env


def hold(command: str) -> subprocess.Popen:
    """A second ``bass COMMAND`` process (tests/cli/hold_outputs.py) that has locked its
    outputs and waits, instead of loading models, until :func:`release`."""
    holder = Path(__file__).parent / "cli" / "hold_outputs.py"
    proc = subprocess.Popen(
        [sys.executable, str(holder), *shlex.split(command)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=subprocess_env(),
    )
    line = proc.stdout.readline()  # blocks until it holds (or ends)
    if line != "holding\n":
        proc.kill()
        raise AssertionError(f"the holder did not start: {line!r} {proc.communicate()}")
    return proc


def release(proc: subprocess.Popen) -> None:
    """End a :func:`hold` process normally (its locks dropped, its lock files removed)."""
    _, err = proc.communicate(input="", timeout=60)
    assert proc.returncode == 0, err
