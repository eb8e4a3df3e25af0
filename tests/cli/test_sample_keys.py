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


def test_sampling_without_a_seed_draws_one_that_resume_continues_with(dirs, tmp_path, capsys):
    """--sample without --seed: the run draws a seed, says it and records it in every row,
    and --resume (still without --seed) continues with it: the rows an uninterrupted run
    draws."""
    main, _ = dirs
    base = f"generate --main {main} --cpu-linear torch --dtype float64 --sample --max-new-tokens 8"
    out = tmp_path / "s.jsonl"
    rc, _, err = run(capsys, f"{base} --n 2 -o {out}", *PROMPTS)
    assert rc == 0, err
    rows = read_jsonl(out)
    seed = rows[0]["settings"]["seed"]
    assert isinstance(seed, int) and f"this run's seed is {seed}" in err
    assert {r["settings"]["seed"] for r in rows} == {seed}
    out.write_text("".join(line + "\n" for line in out.read_text().splitlines()[:2]))
    rc, _, err = run(capsys, f"{base} --n 2 -o {out} --resume", *PROMPTS)
    assert rc == 0, err
    assert "this run's seed" not in err
    key = lambda r: (r["prompt_index"], r["sample"], r["completion"], r["settings"])  # noqa: E731
    assert sorted(map(key, read_jsonl(out))) == sorted(map(key, rows))  # appended as done
    again = tmp_path / "again.jsonl"
    rc, _, err = run(capsys, f"{base} --n 2 -o {again} --seed {seed}", *PROMPTS)
    assert rc == 0, err
    # rows are written as they finish: the default policy's timings may reorder them
    assert sorted(map(key, read_jsonl(again))) == sorted(map(key, rows))
