"""``bass generate``'s text at the edges: a standard output that cannot encode a row's text,
stop strings that are not text, and ``--resume`` comparing stop strings as the engine uses
them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from cli_support import one_error_line, read_jsonl, run, save_model_dir

FAST = "--cpu-linear torch --dtype float64 --draft none --max-new-tokens 2 --batch-size 1"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_model_dir(tmp_path_factory.mktemp("tiny"))


def test_a_standard_output_that_cannot_encode_a_row_loses_no_row(model_dir, tmp_path):
    """``PYTHONIOENCODING=ascii`` (a Latin-1 locale, a cp1252 console): printing a row
    with text it cannot encode raised ``UnicodeEncodeError`` before the row was written,
    "internal error ... a bug in bass", status 1, the row and every later one lost. The
    text is printed escaped (as Python's stderr does) and every row is written."""
    out = tmp_path / "out.jsonl"
    env = {**os.environ, "PYTHONIOENCODING": "ascii"}
    args = f"generate --main {model_dir} {FAST} -o {out}".split()
    proc = subprocess.run(
        [sys.executable, "-m", "bass", *args, "hello", "the sea \u65e5\u672c", "hello sea"],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert ">>> the sea \\u65e5\\u672c" in proc.stdout
    rows = read_jsonl(out)
    assert [r["prompt"] for r in rows] == ["hello", "the sea \u65e5\u672c", "hello sea"]


def test_a_stop_string_that_is_not_text_is_refused(model_dir, capsys):
    """``--stop $'\\xff'``: a byte that is not UTF-8 reached the run as a lone surrogate
    and was accepted, a stop string no decoded text can hold (it never matched). Refused
    as a prompt with such a byte is."""
    rc, _, err = run(capsys, f"generate --main {model_dir} {FAST} --stop \udcff hello")
    assert rc == 2 and "is not valid Unicode text" in one_error_line(err)


@pytest.mark.parametrize(
    "theirs, ours",
    [([], ""), (None, "--stop zz"), (["zz", "zz"], "--stop zz"), (["b", "a"], "--stop a --stop b")],
)
def test_resume_compares_stop_strings_as_the_engine_uses_them(
    model_dir, tmp_path, capsys, theirs, ours
):
    """A file made with ``stop_strings = []`` resumed without stop strings, or with one
    stop string given twice, was refused ("[] there, null now"): the same rows. Stop
    strings compare as a set; none (``[]`` or null) as none."""
    out = tmp_path / "out.jsonl"
    base = f"generate --main {model_dir} {FAST} -o {out}"
    rc, _, err = run(capsys, f"{base} {ours}", "hello", "the sea")
    assert rc == 0, err
    if theirs is None:  # the file's run had none: a different set, refused
        row = read_jsonl(out)[0]
        row["settings"]["stop_strings"] = None
        out.write_text(json.dumps(row) + "\n")
        rc, _, err = run(capsys, f"{base} {ours} --resume", "hello", "the sea")
        assert rc == 2 and "stop_strings: null there" in one_error_line(err)
        return
    row = read_jsonl(out)[0]
    row["settings"]["stop_strings"] = theirs  # as a run that said it so left it
    out.write_text(json.dumps(row) + "\n")
    rc, _, err = run(capsys, f"{base} {ours} --resume", "hello", "the sea")
    assert rc == 0 and "1 of 2 rows are already in" in err, err
    assert len(read_jsonl(out)) == 2


def test_resume_reads_a_setting_an_older_row_lacks_as_null(model_dir, tmp_path, capsys):
    """Rows of a bass before ``min_p`` and ``logprobs`` were settings (their keys absent)
    resume a run that leaves them out; one that sets them is refused, naming the key."""
    out = tmp_path / "out.jsonl"
    base = f"generate --main {model_dir} {FAST} -o {out}"
    rc, _, err = run(capsys, base, "hello", "the sea")
    assert rc == 0, err
    row = read_jsonl(out)[0]
    for key in ("min_p", "logprobs"):
        del row["settings"][key]
    out.write_text(json.dumps(row) + "\n")
    rc, _, err = run(capsys, f"{base} --logprobs raw --resume", "hello", "the sea")
    assert rc == 2 and 'logprobs: null there, "raw" now' in one_error_line(err)
    rc, _, err = run(capsys, f"{base} --resume", "hello", "the sea")
    assert rc == 0 and "1 of 2 rows are already in" in err, err


def test_control_characters_reach_a_terminal_escaped_and_the_file_as_they_are(
    model_dir, tmp_path, capsys, monkeypatch
):
    """A row's text with terminal controls (a prompt's here; a model's completion alike):
    on a terminal, shown as ``\\x1b`` escapes (it could clear the screen, move the cursor,
    retitle the window); newlines and tabs kept; a pipe and ``--output`` get the text as it
    is."""
    from bass.cli.report import for_terminal

    class Tty:
        def isatty(self):
            return True

    assert for_terminal("a\x1b[2Jb\tc\nd\r\x9b\x7f\x00", Tty()) == (
        "a\\x1b[2Jb\tc\nd\\x0d\\x9b\\x7f\\x00"
    )
    assert for_terminal("a\x1b[2J", object()) == "a\x1b[2J"  # not a terminal: as it is
    prompt = "hello \x1b]0;owned\x07 world"
    out = tmp_path / "o.jsonl"
    rc, piped, err = run(capsys, f"generate --main {model_dir} {FAST} -o {out}", prompt)
    assert rc == 0 and "\x1b]0;owned\x07" in piped, err
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    rc, shown, err = run(capsys, f"generate --main {model_dir} {FAST} -o {out} --overwrite", prompt)
    assert rc == 0, err
    assert "\x1b" not in shown and "\x07" not in shown and "\\x1b]0;owned\\x07" in shown
    assert read_jsonl(out)[0]["prompt"] == prompt
