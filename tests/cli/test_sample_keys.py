"""Seeded samples are a function of (seed, prompt, sample, settings) only (issue #32): with a
draft model and sampling, ``bass generate`` gives every row the same completion whatever
``--batch-size``, a ``--resume`` that adds samples (``--n``), and the drafter (none: plain
sampling); rows are keyed by (prompt, sample), not by their place in the job."""

from __future__ import annotations

import pytest
from cli_support import WORDS, read_jsonl, run, save_model_dir, word_tokenizer
from models import tiny_lm

FAST = "--cpu-linear torch --dtype float64 --sample --temperature 1.5 --seed 3"
PROMPTS = ("hello world", "the sea is blue", "a cat")


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("pair")
    main = save_model_dir(root / "main")
    tiny_lm(seed=5).save_pretrained(root / "draft")
    word_tokenizer(WORDS).save_pretrained(root / "draft")
    return main, str(root / "draft")


def _rows(capsys, out, command):
    rc, _, err = run(capsys, f"{command} -o {out}", *PROMPTS)
    assert rc == 0, err
    return {(r["prompt_index"], r["sample"]): r["completion"] for r in read_jsonl(out)}


def test_samples_do_not_depend_on_batches_resume_or_the_drafter(dirs, tmp_path, capsys):
    main, draft = dirs
    base = f"generate --main {main} {FAST} --max-new-tokens 10"
    whole = _rows(capsys, tmp_path / "a.jsonl", f"{base} --draft {draft} --n 3 --batch-size 2")
    assert len(whole) == 9 and len(set(whole.values())) > 3  # real, varied samples
    other = _rows(capsys, tmp_path / "b.jsonl", f"{base} --draft {draft} --n 3 --batch-size 5")
    assert other == whole
    # two samples, then --resume asks for three: the old rows keep theirs, the new ones
    # are those an uninterrupted run draws
    out = tmp_path / "c.jsonl"
    first = _rows(capsys, out, f"{base} --draft {draft} --n 2 --batch-size 4")
    assert first == {k: v for k, v in whole.items() if k[1] < 2}
    assert _rows(capsys, out, f"{base} --draft {draft} --n 3 --resume") == whole
    # coupled drafting: the same samples as plain sampling
    plain = _rows(capsys, tmp_path / "d.jsonl", f"{base} --draft none --n 3 --batch-size 3")
    assert plain == whole
