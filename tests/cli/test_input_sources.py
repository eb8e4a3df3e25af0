"""Where ``bass`` reads from: prompts from a pipe (``--prompts-file -`` and
``/dev/stdin``, a real shell pipe), a FIFO, files with any line ending (``\\r\\n``, ``\\n``,
a lone ``\\r``), a config file with a UTF-8 byte-order mark; ``--problems`` naming one
problem twice, a file flag given twice and a policy option given twice with two values are
refused.

The prompts read are checked without loading a model: ``--resume`` on a results file that
already holds one row per expected prompt says "nothing to generate" only if every prompt
read equals the row's, in order (else it names the first that differs)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading

import pytest
from cli_support import one_error_line, run, subprocess_env

from bass import humaneval

PROMPTS = ["hello world", "the sea is blue", "a cat"]


def done_file(path, prompts=PROMPTS):
    """A results file holding one row of each of ``prompts`` (no settings: unchecked)."""
    rows = [{"prompt": p, "prompt_index": i, "sample": 0, "completion": ""} for i, p in
            enumerate(prompts)]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def reads_the_prompts(rc: int, out: str, err: str, n: int = len(PROMPTS)) -> None:
    assert rc == 0, err
    assert f"nothing to generate: all {n} rows are in" in err, (out, err)


def test_prompts_from_a_shell_pipe_through_dev_stdin_and_dash(tmp_path):
    out = done_file(tmp_path / "out.jsonl")
    for name in ("/dev/stdin", "-"):
        proc = subprocess.run(
            f"printf 'hello world\\nthe sea is blue\\r\\na cat' | {sys.executable} -m bass "
            f"generate --prompts-file {name} -o {out} --resume",
            shell=True,
            capture_output=True,
            text=True,
            timeout=120,
            env=subprocess_env(),
        )
        reads_the_prompts(proc.returncode, proc.stdout, proc.stderr)


def test_prompts_from_a_fifo_and_from_stdin_in_process(
    tmp_path, capsys, monkeypatch, no_model_load
):
    out = done_file(tmp_path / "out.jsonl")
    fifo = tmp_path / "prompts"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_text("\n".join(PROMPTS) + "\n"))
    writer.start()
    try:
        reads_the_prompts(*run(capsys, f"generate --prompts-file {fifo} -o {out} --resume"))
    finally:
        writer.join(timeout=30)
    monkeypatch.setattr(
        sys, "stdin", io.TextIOWrapper(io.BytesIO(b"hello world\rthe sea is blue\ra cat\r"))
    )
    reads_the_prompts(*run(capsys, f"generate --prompts-file - -o {out} --resume"))


@pytest.mark.parametrize("end", ["\r", "\n", "\r\n"], ids=["cr", "lf", "crlf"])
@pytest.mark.parametrize("suffix", [".txt", ".jsonl"])
def test_every_line_ending_splits_prompts(tmp_path, capsys, no_model_load, end, suffix):
    out = done_file(tmp_path / "out.jsonl")
    lines = [json.dumps({"prompt": p}) if suffix == ".jsonl" else p for p in PROMPTS]
    prompts = tmp_path / f"p{suffix}"
    prompts.write_bytes((end.join(lines) + end).encode())
    reads_the_prompts(*run(capsys, f"generate --prompts-file {prompts} -o {out} --resume"))
    # lines are numbered as an editor shows them, whatever ends them
    prompts.write_bytes((end.join([*lines[:2], "{not json"]) + end).encode())
    rc, _, err = run(capsys, f"generate --prompts-file {prompts} -o {out} --resume")
    if suffix == ".jsonl":
        assert rc == 2 and one_error_line(err).startswith(f"bass: error: {prompts}:3: expected")
    prompts.write_bytes(end.join(["ok", "ok", "caf\xe9"]).encode("latin-1"))
    rc, _, err = run(capsys, f"generate --prompts-file {prompts} -o {out} --resume")
    assert rc == 2 and one_error_line(err).startswith(f"bass: error: {prompts}:3: not UTF-8")


def test_a_form_feed_inside_a_prompt_is_text_not_a_line_end(tmp_path, capsys, no_model_load):
    prompts = ["hello\fworld", "the sea"]
    out = done_file(tmp_path / "out.jsonl", prompts)
    (tmp_path / "p.txt").write_text("hello\fworld\nthe sea\n")
    reads_the_prompts(
        *run(capsys, f"generate --prompts-file {tmp_path / 'p.txt'} -o {out} --resume"), n=2
    )


PROBLEMS = {f"Toy/{i}": {"task_id": f"Toy/{i}", "prompt": "def f():\n", "test": "",
                         "entry_point": "f"} for i in range(3)}  # fmt: skip


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("Toy/0,Toy/0", "--problems 'Toy/0,Toy/0' names Toy/0 twice; name each problem once"),
        ("Toy/2,1,2", "--problems 'Toy/2,1,2' names Toy/2 twice (as 'Toy/2' and '2'); name"),
    ],
)
def test_problems_named_twice_are_refused(capsys, monkeypatch, no_model_load, spec, expected):
    monkeypatch.setattr(humaneval, "load_problems", lambda: PROBLEMS)
    with pytest.raises(humaneval.HumanEvalError, match="twice"):
        humaneval.select_problems(PROBLEMS, spec)
    rc, _, err = run(capsys, f"eval humaneval --problems {spec}")
    assert rc == 2 and one_error_line(err).startswith(f"bass: error: {expected}")
    assert [p["task_id"] for p in humaneval.select_problems(PROBLEMS, "Toy/2,1")] == [
        "Toy/2",
        "Toy/1",
    ]


def test_a_config_file_with_a_byte_order_mark_is_read(tmp_path, capsys, no_model_load):
    from bass.config import load_config

    cfg = tmp_path / "bom.toml"
    cfg.write_bytes(b"\xef\xbb\xbf[generation]\nmax_new_tokens = 7\n")  # Notepad's UTF-8
    assert load_config(cfg).generation.max_new_tokens == 7
    out = done_file(tmp_path / "out.jsonl", ["hello"])
    reads_the_prompts(*run(capsys, f"generate hello --config {cfg} -o {out} --resume"), n=1)


@pytest.mark.parametrize(
    "flags",
    [
        "generate --prompts-file a.txt --prompts-file b.txt",
        "generate hi -o a.jsonl --output b.jsonl",
        "generate hi --config a.toml --config b.toml",
        "generate hi --plot a.png --plot b.png",
        "eval humaneval -o a.jsonl -o b.jsonl",
    ],
)
def test_a_file_flag_given_twice_is_refused(capsys, no_model_load, flags):
    """argparse keeps a flag's last value: the first --prompts-file's prompts were dropped
    (exit 0), the first --output never written."""
    rc, _, err = run(capsys, flags)
    assert rc == 2
    assert "given twice (" in one_error_line(err) and "it takes one file" in err


def test_a_policy_option_given_twice_with_two_values_is_refused(capsys, no_model_load):
    rc, _, err = run(capsys, "generate hi --policy-option l0=3 --policy-option l0=4")
    assert rc == 2
    assert "policy option 'l0' given twice ('3' and '4'): give it once" in one_error_line(err)


def test_a_config_files_policy_options_are_checked_under_its_name(tmp_path, capsys, no_model_load):
    """--policy-option defaults to []: taken as given, the file's [policy.options] were
    checked only with the flags, under the name "config"."""
    cfg = tmp_path / "p.toml"
    cfg.write_text('[policy]\nname = "constant"\n[policy.options]\nl0 = 3\n')
    rc, _, err = run(capsys, f"generate hi --config {cfg}")
    assert rc == 2
    assert one_error_line(err).startswith(f"bass: error: {cfg}: [policy].options for policy")
