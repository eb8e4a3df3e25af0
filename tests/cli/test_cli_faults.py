"""``bass generate`` under faults: bad paths are refused before any model loads, finished
rows survive a later failure and Ctrl-C, ``--resume`` completes a stopped run, and every
user error is one ``bass: error:`` line (exit status 2; the traceback with ``--debug``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from cli_support import (
    WORDS,
    one_error_line,
    read_jsonl,
    run,
    save_model_dir,
    word_tokenizer,
)
from models import tiny_lm

import bass.cli.generate
from bass.models import ModelNotFoundError

FAST = "--cpu-linear torch --dtype float64"  # no calibration; exact greedy in any batch


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_model_dir(tmp_path_factory.mktemp("tiny"))


# ------------------------------------------------------------------ paths, before any work


def test_a_blank_path_is_refused_not_ignored(capsys, no_model_load):
    """``--config "$CONFIG"`` with the variable unset ran with the defaults (the flag
    taken as not given); so did --plot and --prompts-file beside PROMPT arguments."""
    for flag, said in {
        "--config": "--config '': pass the path of a TOML file",
        "--plot": "--plot '': pass a file path",
        "--prompts-file": "--prompts-file '': pass a file path",
    }.items():
        rc, _, err = run(capsys, f"generate {flag} '' hello")
        assert rc == 2 and said in one_error_line(err), (flag, err)


def test_a_draft_that_cannot_load_is_refused_before_the_main_model_loads(
    model_dir, tmp_path, capsys, no_model_load
):
    """A draft path that does not exist, a file that is no model, and a drafter's name
    mistyped (tried on the hub after the main model loaded) are refused first."""
    (tmp_path / "notes.txt").write_text("x")
    for draft, said in {
        "/nonexistent/draft": "model path /nonexistent/draft does not exist",
        str(tmp_path / "notes.txt"): "is a file, not a model directory",
        "ngramm": "did you mean 'ngram'?",
        "None": "did you mean 'none'?",
    }.items():
        rc, _, err = run(capsys, f"generate --main {model_dir} --draft {draft} hello")
        assert rc == 2 and said in one_error_line(err), (draft, err)
    rc, _, err = run(capsys, "generate --main /nonexistent/main hello")
    assert rc == 2 and "model path /nonexistent/main does not exist" in err


def test_a_draft_name_found_nowhere_lists_the_installed_drafters(model_dir, capsys, monkeypatch):
    """A name far from every drafter's is tried as a hub model; when that fails, the error
    also lists the drafters ``--draft`` takes (a plugin's name mistyped, not installed)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    rc, _, err = run(capsys, f"generate --main {model_dir} --draft my-drafter hello")
    line = one_error_line(err)
    assert rc == 2 and "cannot load 'my-drafter'" in line, err
    assert "--draft also takes an installed drafter: ngram" in line
    from bass import Generator

    with pytest.raises(
        ModelNotFoundError, match=r"draft also takes an installed drafter: ngram.*; or None\)"
    ):
        Generator.from_pretrained(str(model_dir), "my-drafter")


def test_paths_the_command_writes_are_checked_before_any_model_loads(
    model_dir, tmp_path, capsys, no_model_load
):
    (tmp_path / "dir").mkdir()
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello\n")
    (tmp_path / "p.svg").write_text("hello\n")
    config = tmp_path / "c.toml"
    config.write_text("[generation]\nmax_new_tokens = 2")  # no final newline
    (tmp_path / "link.toml").symlink_to(config)
    os.mkfifo(tmp_path / "fifo")
    overwrites = "writing it would overwrite that input; choose another path"
    cases = {
        f"-o {tmp_path / 'missing' / 'out.jsonl'}": "the directory",
        f"-o {tmp_path / 'dir'}": "is a directory",
        f"-o {prompts} --prompts-file {prompts}": f"{prompts} is the --prompts-file: {overwrites}",
        f"-o {config} --config {config}": f"--output {config} is the --config file: {overwrites}",
        f"-o {config} --config {config} --resume": "is the --config file",
        f"-o {tmp_path / 'link.toml'} --config {config}": "is the --config file",
        f"--plot {tmp_path / 'p.svg'} --prompts-file {tmp_path / 'p.svg'}": "is the --prompts-file",
        f"-o {model_dir}/config.json --main {model_dir}": "is a file in the --main model directory",
        f"-o {model_dir}/config.json --draft {model_dir}": "in the --draft model directory",
        f"-o {tmp_path / 'fifo'}": "fifo is a named pipe (FIFO); --output takes a regular file",
        f"-o {tmp_path / 'fifo'} --resume": "--output with --resume takes a regular file",
        "-o /dev/null --resume": "/dev/null is a character device; --output with --resume",
        f"--plot {tmp_path / 'missing' / 'p.png'}": "does not exist",
        f"--plot {tmp_path / 'p.xyz'}": "cannot write .xyz files",
        f"--plot {tmp_path / 'o.png'} -o {tmp_path / 'o.png'}": "--plot",
        "--resume": "--resume needs --output FILE",
    }
    for flags, expected in cases.items():
        rc, _, err = run(capsys, f"generate hello {flags}")
        assert rc == 2 and expected in one_error_line(err), (flags, err)
    assert config.read_text() == "[generation]\nmax_new_tokens = 2"  # untouched
    rc, _, err = run(capsys, f"generate hello --plot {tmp_path / 'o.png'} -o {tmp_path / 'o.png'}")
    assert f"--plot {tmp_path / 'o.png'} is also the --output file" in one_error_line(err)


def test_an_unwritable_output_is_refused_before_any_model_loads(
    tmp_path, capsys, monkeypatch, no_model_load
):
    import bass.cli.results

    monkeypatch.setattr(bass.cli.results.os, "access", lambda path, mode: False)  # (as root)
    rc, _, err = run(capsys, f"generate hello -o {tmp_path / 'out.jsonl'}")
    assert rc == 2 and "cannot create a file in" in one_error_line(err)
    assert "permission denied" in err
    (tmp_path / "out.jsonl").touch()
    rc, _, err = run(capsys, f"generate hello -o {tmp_path / 'out.jsonl'}")
    assert rc == 2 and "out.jsonl is not writable (permission denied)" in one_error_line(err)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_a_write_that_fails_is_one_error_line_and_the_batch_is_printed(model_dir, capsys):
    """A full disk (/dev/full): one error line naming --output, what the file holds, and
    the batch that could not be written printed before the write (not lost)."""
    rc, out, err = run(capsys, f"generate --main {model_dir} {FAST} hello -o /dev/full")
    line = one_error_line(err)
    assert rc == 2 and "--output /dev/full: cannot write it: No space left on device" in line
    # a device: no --resume to suggest (it reads the file)
    assert err.rstrip().endswith("bass: 0 of 1 rows were written to /dev/full")
    assert out.startswith(">>> hello\n")
    rc, out, err = run(capsys, f"generate --main {model_dir} {FAST} hello -o /dev/null")
    assert rc == 0 and "results             /dev/null" in out, err


def test_a_write_that_fails_later_keeps_the_earlier_rows(model_dir, tmp_path, capsys, monkeypatch):
    import bass.cli.results

    writes = []
    real = bass.cli.results.LineWriter.write

    def second_fails(self, text):
        writes.append(text)
        if len(writes) == 2:
            raise bass.cli.UsageError(f"--output {self.path}: cannot write it: disk full")
        real(self, text)

    monkeypatch.setattr(bass.cli.results.LineWriter, "write", second_fails)
    out = tmp_path / "out.jsonl"
    rc, stdout, err = run(
        capsys, f"generate --main {model_dir} {FAST} --batch-size 1 -o {out}", "hello", "the sea"
    )
    assert rc == 2 and "cannot write it: disk full" in one_error_line(err)
    assert f"1 of 2 rows are in {out}" in err
    assert [r["prompt"] for r in read_jsonl(out)] == ["hello"]
    assert ">>> hello\n" in stdout and ">>> the sea\n" in stdout


def test_ctrl_c_during_a_rows_write_counts_that_row_as_kept(
    model_dir, tmp_path, capsys, monkeypatch
):
    """Ctrl-C held back while a row is written lands once it is whole: the file keeps the
    row, and the count printed says so (it once said one row fewer)."""
    import bass.cli.results

    real = bass.cli.results.LineWriter.write
    calls = []

    class InterruptedFile:  # SIGINT arrives as the second row's bytes go out
        def __init__(self, file):
            self.file = file

        def write(self, data):
            signal.raise_signal(signal.SIGINT)
            return self.file.write(data)

    def write(self, text):
        calls.append(text)
        if len(calls) != 2:
            return real(self, text)
        self.file = InterruptedFile(self.file)
        try:
            return real(self, text)
        finally:
            self.file = self.file.file

    monkeypatch.setattr(bass.cli.results.LineWriter, "write", write)
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        out = tmp_path / "out.jsonl"
        rc, _, err = run(
            capsys,
            f"generate --main {model_dir} {FAST} --draft none --batch-size 1 -o {out}",
            "hello", "the sea", "world",
        )  # fmt: skip
    finally:
        signal.signal(signal.SIGINT, old)
    assert rc == 130, err
    assert len(read_jsonl(out)) == 2
    assert f"bass: 2 of 3 rows are in {out}; rerun" in err


def test_unreadable_inputs_are_one_error_line(model_dir, tmp_path, capsys):
    binary = tmp_path / "bin.txt"
    binary.write_bytes(b"hello\n\xff\xfe\x00x\n")
    rc, _, err = run(capsys, f"generate --prompts-file {binary}")
    assert rc == 2 and f"{binary}:2: not UTF-8 text" in one_error_line(err)
    rc, _, err = run(capsys, f"generate --prompts-file {tmp_path}")
    assert rc == 2 and "is a directory" in one_error_line(err)
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text('{"prompt": "a"}\n\n{"prompt": 5}\n')
    rc, _, err = run(capsys, f"generate --prompts-file {jsonl}")
    assert rc == 2 and f'{jsonl}:3: expected a JSON object with a "prompt" string' in err
    rc, _, err = run(capsys, f"generate --config {binary} hi")
    assert rc == 2 and "not a TOML file: not UTF-8 text" in one_error_line(err)
    rc, _, err = run(capsys, f"generate --main {binary} hi")
    assert rc == 2 and "is a file, not a model directory or a .gguf file" in one_error_line(err)
    not_a_model = tmp_path / "empty"
    not_a_model.mkdir()
    (not_a_model / "config.json").write_text("{}")
    for flag in ("--main", "--draft"):
        main = "" if flag == "--main" else f"--main {model_dir}"
        rc, _, err = run(capsys, f"generate {main} {flag} {not_a_model} hi")
        line = one_error_line(err)
        assert rc == 2 and f"cannot load the {flag[2:]} model from {not_a_model}" in line
        assert f"{flag} takes a Hugging Face model name" in line


# --------------------------------------------------- finished rows survive a later failure


def test_a_too_long_prompt_is_refused_before_any_row_and_resume_completes_the_run(
    model_dir, tmp_path, capsys
):
    """Every prompt's length is checked before the first batch (the library's check and
    message, named by its line), so nothing is generated and --output keeps its rows."""
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello world\n\nthe sea\n")
    out = tmp_path / "out.jsonl"
    command = f"generate --main {model_dir} {FAST} --batch-size 1 --max-new-tokens 4 -o {out}"
    rc, stdout, err = run(capsys, f"{command} --prompts-file {prompts}")
    assert rc == 0, err
    rows = read_jsonl(out)
    long_prompt = " ".join(["w20"] * 300)  # past the model's 256 positions
    prompts.write_text(f"hello world\n\nthe sea\n{long_prompt}\na cat\n")
    for resume in ("--overwrite", "--resume"):
        rc, stdout, err = run(capsys, f"{command} --prompts-file {prompts} {resume}")
        line = one_error_line(err)
        assert rc == 2 and f"the prompt at {prompts}:4 (300 tokens) + max_new_tokens (4)" in line
        assert "exceeds" in line and "rows are in" not in err
        assert ">>>" not in stdout and read_jsonl(out) == rows  # nothing generated, file kept
    # the prompt fixed, --resume generates only the rest (after the rows: blank lines a
    # user's editor left there are dropped, not left between the rows)
    prompts.write_text("hello world\n\nthe sea\nthe sea is blue\na cat\n")
    out.write_text(out.read_text() + "\n  \n")
    rc, stdout, err = run(capsys, f"{command} --prompts-file {prompts} --resume")
    assert rc == 0, err
    assert "\n\n" not in out.read_text() and out.read_text().endswith("}\n")
    assert "2 of 4 rows are already in" in err and ">>> hello world" not in stdout
    resumed = read_jsonl(out)
    assert resumed[:2] == rows
    assert [r["prompt"] for r in resumed] == ["hello world", "the sea", "the sea is blue", "a cat"]
    fresh = tmp_path / "fresh.jsonl"
    rc, _, err = run(capsys, f"{command.replace(str(out), str(fresh))} --prompts-file {prompts}")
    assert rc == 0, err
    pairs = lambda rows: sorted((r["prompt"], r["completion"]) for r in rows)  # noqa: E731
    assert pairs(read_jsonl(fresh)) == pairs(resumed)  # rows are written as they finish
    rc, stdout, err = run(capsys, f"{command} --prompts-file {prompts} --resume")
    assert rc == 0 and "nothing to generate: all 4 rows" in err and not stdout  # not a row


def test_nonfinite_logits_in_a_later_batch_name_the_prompt(tmp_path, capsys):
    """A model whose logits turn NaN on one prompt: one error line naming that prompt by its
    PROMPT argument, the rows before it kept."""
    model = tiny_lm()
    with torch.no_grad():
        model.get_input_embeddings().weight[WORDS.index("cat")] = float("nan")
    path = tmp_path / "nan"
    model.save_pretrained(path)
    word_tokenizer(WORDS).save_pretrained(path)
    out = tmp_path / "out.jsonl"
    rc, _, err = run(
        capsys,
        f"generate --main {path} {FAST} --batch-size 1 --max-new-tokens 3 -o {out} --n 2",
        "hello world",
        "a cat",
    )
    line = one_error_line(err)
    assert rc == 2 and "produced non-finite logits" in line
    assert "for the prompt at PROMPT argument 2 (sample 1 of 2)" in line
    assert [(r["prompt_index"], r["sample"]) for r in read_jsonl(out)] == [(0, 0), (0, 1)]


def test_resume_checks_the_file_belongs_to_the_run(model_dir, tmp_path, capsys):
    out = tmp_path / "out.jsonl"
    command = f"generate --main {model_dir} {FAST} --max-new-tokens 3 -o {out} --resume"
    out.write_text('{"prompt": "hello", "prompt_index": 0, "sample": 0}\n')
    rc, _, err = run(capsys, f"{command} other")
    assert rc == 2 and f"{out}:1: a row of prompt 0 ('hello'), but prompt 0 is 'other'" in err
    rc, _, err = run(capsys, f"{command} --n 1 hello world")
    assert rc == 0, err
    out.write_text('{"prompt": "hello", "prompt_index": 0, "sample": 3}\n')
    rc, _, err = run(capsys, f"{command} hello")
    assert rc == 2 and "a row of sample 3, but --samples (--n) is 1" in one_error_line(err)
    out.write_text("not json\n")
    rc, _, err = run(capsys, f"{command} hello")
    assert rc == 2 and f"{out}:1: not a row that bass generate wrote" in one_error_line(err)
    # a last line cut short by a kill is dropped and its row generated again
    good = '{"prompt": "hello", "prompt_index": 0, "sample": 0, "completion": "x"}\n'
    for cut in ('{"prompt": "world", "prompt_in', '{"pro'):  # cut anywhere: a full disk
        out.write_text(good + cut)
        rc, _, err = run(capsys, f"{command} hello world")
        assert rc == 0, err
        rows = read_jsonl(out)
        assert rows[0]["completion"] == "x" and [r["prompt"] for r in rows] == ["hello", "world"]
        assert "1 rows in" in err and "carry no settings (written by an older bass)" in err


def test_a_refused_resume_leaves_the_output_and_its_shards_as_they_were(
    model_dir, tmp_path, capsys
):
    out = tmp_path / "out.jsonl"
    good = '{"prompt": "hello", "prompt_index": 0, "sample": 0, "completion": "x"}\n'
    out.write_text(good)
    shard = tmp_path / "out.jsonl.rank1"
    shard.write_text('{"prompt": "other", "prompt_index": 1, "sample": 0}\n')
    before = {p.name: p.read_text() for p in tmp_path.iterdir()}
    rc, _, err = run(capsys, f"generate --main {model_dir} {FAST} -o {out} --resume hello world")
    assert rc == 2 and f"{shard}:1: a row of prompt 1 ('other')" in one_error_line(err)
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == before
    # blank lines are no rows: such a file is no run's work and is replaced
    out.write_text("\n\n  \n")
    shard.unlink()
    rc, _, err = run(capsys, f"generate --main {model_dir} {FAST} -o {out} hello")
    assert rc == 0, err
    assert [r["prompt"] for r in read_jsonl(out)] == ["hello"]


def test_resume_never_cuts_a_file_that_bass_did_not_write(model_dir, tmp_path, capsys):
    """A file without a final newline is cut only when every line is a bass row and the
    last one starts as a row does; otherwise it is left as it was."""
    command = f"generate --main {model_dir} {FAST} --max-new-tokens 3 --resume"
    cases = {
        "notes.txt": ("line one\nimportant last line", 1),
        "only.txt": ("important", 1),
        "rows.jsonl": ('{"prompt": "hello", "prompt_index": 0, "sample": 0}\nnotes', 2),
    }
    for name, (text, number) in cases.items():
        path = tmp_path / name
        path.write_text(text)
        rc, _, err = run(capsys, f"{command} -o {path} hello")
        assert rc == 2 and f"{path}:{number}: not a row that bass generate wrote" in err, err
        assert path.read_text() == text


def test_resume_refuses_rows_made_with_other_settings(model_dir, tmp_path, capsys):
    out = tmp_path / "out.jsonl"
    base = f"generate --main {model_dir} {FAST} -o {out}"
    rc, _, err = run(capsys, f"{base} --max-new-tokens 2 --batch-size 1", "hello", "the sea")
    assert rc == 0, err
    rows = read_jsonl(out)
    assert rows[0]["settings"]["max_new_tokens"] == 2
    assert rows[0]["settings"]["do_sample"] is False and rows[0]["settings"]["seed"] is None
    out.write_text(out.read_text().splitlines(keepends=True)[0])  # as if stopped after one
    kept = out.read_text()
    rc, _, err = run(
        capsys,
        f"{base} --resume --max-new-tokens 6 --sample --seed 5",
        "hello",
        "the sea",
    )
    line = one_error_line(err)
    assert rc == 2 and f"--output {out}:1: a row generated with other settings (" in line
    assert "max_new_tokens: 2 there, 6 now; do_sample: false there, true now" in line
    assert "seed: null there, 5 now" in line and out.read_text() == kept
    # what does not change the rows may differ: the draft, the policy, the batch size,
    # the time budget, and sampling options under greedy decoding
    rc, _, err = run(
        capsys,
        f"{base} --resume --max-new-tokens 2 --draft none --policy constant --seed 3 "
        "--time-budget 100",
        "hello",
        "the sea",
    )
    assert rc == 0 and "1 of 2 rows are already in" in err, err
    assert [r["prompt"] for r in read_jsonl(out)] == ["hello", "the sea"]


# ----------------------------------------------------------------- errors and --debug


def test_a_bug_raising_a_value_error_mid_generation_is_an_internal_error(
    model_dir, tmp_path, capsys, monkeypatch
):
    """A ValueError from bass's own code during the generation is a bug, reported as one
    (exit status 1, its type, the traceback on request), not as a usage error; what was
    written is still said."""

    def broken(self, prompts, **kw):
        raise ValueError("boom")

    monkeypatch.setattr(bass.Generator, "stream", broken)
    out = tmp_path / "out.jsonl"
    rc, _, err = run(capsys, f"generate --main {model_dir} {FAST} hi --output {out}")
    assert rc == 1 and "bass: error: internal error: ValueError: boom (a bug in bass" in err
    assert "0 of 1 rows" in err, err


def test_internal_errors_and_debug(model_dir, capsys, monkeypatch):
    def broken(*a, **kw):
        raise KeyError("boom")

    monkeypatch.setattr(bass.cli.generate, "make_generator", broken)
    rc, _, err = run(capsys, f"generate --main {model_dir} hi")
    assert rc == 1 and "Traceback" not in err
    assert "bass: error: internal error: KeyError: 'boom' (a bug in bass" in err
    assert "rerun with --debug (or BASS_DEBUG=1)" in err
    rc, _, err = run(capsys, f"generate --main {model_dir} hi --debug")
    assert rc == 1 and "Traceback" in err and "KeyError: 'boom'" in err
    monkeypatch.undo()
    monkeypatch.setenv("BASS_DEBUG", "1")
    rc, _, err = run(capsys, f"generate --main {model_dir} hi --max-new-tokens 999")
    assert rc == 2 and "Traceback" in err and "bass: error: the prompt at PROMPT argument 1" in err


# ------------------------------------------------------------------- Ctrl-C (a real process)


def _one_row_at_a_time(model_dir, tmp_path, n: int, max_new: int) -> tuple:
    """``(out, args)``: a ``bass generate`` of ``n`` prompts, one row at a time, to ``out``."""
    prompts, out = tmp_path / "p.txt", tmp_path / "out.jsonl"
    prompts.write_text("".join(f"hello world the sea w{i % 12} w{i % 12 + 1}\n" for i in range(n)))
    return out, (
        f"generate --main {model_dir} {FAST} --draft none --batch-size 1 --max-new-tokens "
        f"{max_new} --prompts-file {prompts} -o {out}"
    )


@pytest.mark.parametrize(
    "signum, status, said",
    [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")],
)
def test_sigint_keeps_finished_rows_and_resume_completes_the_run(
    model_dir, tmp_path, capsys, signum, status, said
):
    """Ctrl-C, and SIGTERM (a batch scheduler's, a container's), the same way."""
    # rows may end at eos after a token or two: enough of them that the run outlasts the signal
    n = 48
    out, args = _one_row_at_a_time(model_dir, tmp_path, n, 16)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("BASS_DEBUG", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "bass", *args.split()],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        # Ctrl-C as in a terminal: a runner started in the background by a shell without
        # job control ignores SIGINT, and its children would inherit that
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 60
        while not (out.exists() and out.read_text().count("\n") >= 1):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no row was written"
            time.sleep(0.01)
        proc.send_signal(signum)
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == status, stderr
    rows = read_jsonl(out)  # every line whole
    assert 1 <= len(rows) < n
    assert [r["prompt_index"] for r in rows] == list(range(len(rows)))  # one at a time
    last = stderr.rstrip().splitlines()[-2:]
    assert last[0] == f"bass: {said}" and "Traceback" not in stderr
    assert last[1] == (
        f"bass: {len(rows)} of {n} rows are in {out}; rerun the same command with --resume "
        "to generate the rest"
    )
    assert stdout.count(">>> ") >= len(rows)  # printed as each row finished

    rc, _, err = run(capsys, f"{args} --resume")
    assert rc == 0, err
    resumed = read_jsonl(out)
    assert resumed[: len(rows)] == rows and len(resumed) == n
    whole = tmp_path / "whole.jsonl"
    rc, _, err = run(capsys, f"{args.replace(str(out), str(whole))} --batch-size {n}")
    assert rc == 0, err
    key = ["prompt_index", "sample", "prompt", "completion", "finish_reason"]

    def rows_of(records):  # sorted: rows are written in the order they finish
        return sorted([r[k] for k in key] for r in records)

    assert rows_of(resumed) == rows_of(read_jsonl(whole))


def test_a_cpu_out_of_memory_is_a_user_error_that_says_what_to_lower():
    from bass.cli.errors import UsageError
    from bass.cli.rows import row_error

    oom = RuntimeError(
        "[enforce fail at alloc_cpu.cpp:118] data. DefaultCPUAllocator: can't allocate "
        "memory: you tried to allocate 1099511627776 bytes. Error code 12"
    )
    err = row_error(oom, [], [], 1)
    assert isinstance(err, UsageError) and str(err).startswith("out of memory: [enforce")
    assert str(err).endswith("lower --batch-size, --kv-budget-gib or --max-new-tokens")
    bug = RuntimeError("shape mismatch")
    assert row_error(bug, [], [], 1) is bug  # anything else stays a bug


def test_resume_takes_the_embedded_default_named_by_its_file_as_the_default(tmp_path, monkeypatch):
    """Rows written with the embedded default (``main: null``) resume with ``--main``
    naming its GGUF file, and the other way round: the same model, one setting."""
    from bass import models
    from bass.cli.generate import row_settings
    from bass.config import Config

    default = tmp_path / "default.gguf"  # wherever the package put it
    default.write_bytes(b"")
    monkeypatch.setattr(models, "default_model_file", lambda: default)
    config = Config()
    assert row_settings(config)["main"] is None
    config.model.main = str(default)
    assert row_settings(config)["main"] is None
    config.model.main = str(tmp_path)  # another path: resolved, kept
    assert row_settings(config)["main"] == str(tmp_path.resolve())


def test_a_closed_standard_output_leaves_the_rows_going_to_the_output_file(model_dir, tmp_path):
    """``bass generate ... -o out.jsonl | head -1``: the reader leaves after a line; the
    job went on... to nothing (exit 1, one row in the file, nothing said). The rows go on
    to ``--output``, and stderr says so."""
    n = 12
    out, args = _one_row_at_a_time(model_dir, tmp_path, n, 6)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "bass", *args.split()],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        assert proc.stdout.readline().startswith(">>> ")
        proc.stdout.close()  # as `head -1` exits
        with proc.stderr:
            stderr = proc.stderr.read()
        proc.wait(timeout=60)
    finally:
        proc.kill()
        proc.stdout.close()
    assert proc.returncode == 0, stderr
    assert f"standard output was closed (its reader left): the rows go on to {out} only" in stderr
    assert sorted(r["prompt_index"] for r in read_jsonl(out)) == list(range(n))


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_a_failing_standard_output_leaves_the_rows_going_to_the_output_file(model_dir, tmp_path):
    """``> /dev/full`` (a full disk): the first row's print failed before its write, which
    was lost, and the run ended as "internal error ... a bug in bass"."""
    out, args = _one_row_at_a_time(model_dir, tmp_path, 3, 4)
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "bass", *args.split()], stdout=full,
                              stderr=subprocess.PIPE, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "standard output failed (No space left on device): the rows go on to" in proc.stderr
    assert sorted(r["prompt_index"] for r in read_jsonl(out)) == [0, 1, 2]
