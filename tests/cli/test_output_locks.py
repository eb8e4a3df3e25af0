"""One writer per file: every file a ``bass`` command writes (``generate --output`` with or
without ``--resume``, ``--plot``, ``eval humaneval --output``) is refused, before any model
loads, while another run (a real second process: ``hold_outputs.py``) writes it, with one
line naming that run; a killed run's lock never blocks; a file two runs wrote at once
(duplicated rows) is refused by ``--resume``."""

from __future__ import annotations

import json
import signal
import socket
from pathlib import Path

import pytest
from cli_support import hold, one_error_line, read_jsonl, release, run, save_model_dir

import bass
import bass.humaneval
from bass.cli.filelock import OutputLock

FAST = "--cpu-linear torch --dtype float64 --max-new-tokens 3 --no-progress"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_model_dir(tmp_path_factory.mktemp("tiny"))


def refused(capsys, command: str, flag: str, given: str, proc, holder_command: str) -> None:
    """``command`` is refused with the one line naming the holder."""
    rc, _, err = run(capsys, command)
    line = one_error_line(err)
    assert rc == 2, err
    assert line.startswith(
        f"bass: error: {flag} {given} is being written by another bass run (pid {proc.pid} "
        f"on {socket.gethostname()}, started "
    ), line
    assert f": bass {holder_command})" in line  # the other run's command line
    assert line.endswith(
        "a file takes one writer at a time: wait for that run to end (or stop it), or choose "
        f"another {flag}"
    ), line


@pytest.fixture
def toy_problems(monkeypatch):
    toy = {"task_id": "Toy/0", "prompt": "def f():\n", "test": "", "entry_point": "f"}
    monkeypatch.setattr(bass.humaneval, "load_problems", lambda: {"Toy/0": toy})


def test_the_files_another_generate_run_writes_are_refused_naming_that_run(
    tmp_path, capsys, no_model_load, toy_problems
):
    out, plot, link = tmp_path / "out.jsonl", tmp_path / "steps.png", tmp_path / "link.jsonl"
    link.symlink_to(out)
    out.write_text("")  # a run resuming a file of no rows yet
    holder = f"generate hello -o {out} --resume --plot {plot}"
    proc = hold(holder)
    try:
        for command, flag, given in [
            (f"generate the sea -o {out}", "--output", out),  # would truncate it
            (f"generate hello -o {out} --resume", "--output", out),  # would write rows twice
            (f"generate hello -o {link}", "--output", link),  # the same file by another name
            (f"generate hello --plot {plot}", "--plot", plot),
            (f"eval humaneval -o {out}", "--output", out),
        ]:
            refused(capsys, command, flag, given, proc, holder)
        assert out.read_text() == "" and not plot.exists()  # untouched
    finally:
        release(proc)
    assert not Path(f"{out}.lock").exists() and not Path(f"{plot}.lock").exists()
    rc, _, err = run(capsys, f"generate the sea -o {out} --plot {plot}")  # its turn now
    assert rc == 1 and "AssertionError: a model was loaded" in err  # past the locks


def test_the_file_another_humaneval_run_writes_is_refused_naming_that_run(
    tmp_path, capsys, no_model_load, toy_problems
):
    out = tmp_path / "he.jsonl"
    out.write_text("kept\n")
    holder = f"eval humaneval -o {out} --overwrite"
    proc = hold(holder)
    try:
        refused(capsys, f"eval humaneval -o {out}", "--output", out, proc, holder)
        refused(capsys, f"generate hello -o {out}", "--output", out, proc, holder)
        assert out.read_text() == "kept\n"
    finally:
        release(proc)
    assert not Path(f"{out}.lock").exists()


def test_a_killed_run_leaves_no_lock_that_blocks(model_dir, tmp_path, capsys):
    out = tmp_path / "out.jsonl"
    proc = hold(f"generate hello -o {out}")
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    lock = Path(f"{out}.lock")
    assert json.loads(lock.read_text())["pid"] == proc.pid  # left behind, with no holder
    rc, _, err = run(capsys, f"generate --main {model_dir} {FAST} -o {out}", "hello world")
    assert rc == 0, err
    assert len(read_jsonl(out)) == 1 and not lock.exists()


def test_a_lock_file_that_is_not_bass_s_is_refused_not_overwritten(tmp_path, capsys, no_model_load):
    out = tmp_path / "out.jsonl"
    mine = tmp_path / "out.jsonl.lock"
    mine.write_text("my notes\n")
    rc, _, err = run(capsys, f"generate hello -o {out}")
    assert rc == 2 and one_error_line(err) == (
        f"bass: error: --output {out}: {mine} exists and is not a bass lock file; bass locks "
        "each output in <output>.lock while a run writes it: move that file away, or choose "
        "another --output"
    )
    assert mine.read_text() == "my notes\n" and not out.exists()


def test_dev_null_takes_any_number_of_writers(capsys, no_model_load):
    with OutputLock("/dev/null", "--output", "bass generate hello -o /dev/null"):
        rc, _, err = run(capsys, "generate hello -o /dev/null")
    assert rc == 1 and "AssertionError: a model was loaded" in err  # past the lock


def test_resume_refuses_a_file_with_a_row_twice(model_dir, tmp_path, capsys):
    out = tmp_path / "out.jsonl"
    args = f"generate --main {model_dir} {FAST} --batch-size 1 -o {out}"
    rc, _, err = run(capsys, args, "hello world", "the sea")
    assert rc == 0, err
    lines = out.read_text().splitlines(keepends=True)
    out.write_text(lines[0] + lines[1] + lines[0])  # what two runs at once left
    before = out.read_text()
    rc, _, err = run(capsys, f"{args} --resume", "hello world", "the sea")
    assert rc == 2 and one_error_line(err) == (
        f"bass: error: --output {out}:3: a second row of prompt 0, sample 0 (the first is "
        "line 1); the file is corrupt (written by two runs at once?): remove the extra "
        "lines, or rerun with --overwrite (not --resume) to start over"
    )
    assert out.read_text() == before


def test_where_no_lock_file_can_be_made_the_file_itself_is_locked(tmp_path, monkeypatch):
    """A directory the user may not write (root is never refused: os.open is made to)."""
    import errno
    import os

    from bass.cli.errors import UsageError

    real_open = os.open

    def no_lock_files(path, flags, *mode):
        if str(path).endswith(".lock"):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, flags, *mode)

    monkeypatch.setattr(os, "open", no_lock_files)
    out = tmp_path / "out.jsonl"
    out.write_text("kept\n")
    with OutputLock(out, "--output", "bass generate a -o out.jsonl"):
        with pytest.raises(UsageError) as refused:
            OutputLock(out, "--output", "bass generate b -o out.jsonl").acquire()
        assert str(refused.value) == (
            f"--output {out} is being written by another bass run (its details are not "
            f"known; lock file {out}); a file takes one writer at a time: wait for that run "
            "to end (or stop it), or choose another --output"
        )
    with OutputLock(out, "--output", "bass generate b -o out.jsonl"):  # released: free
        pass
    assert out.read_text() == "kept\n" and sorted(os.listdir(tmp_path)) == ["out.jsonl"]


def test_a_file_system_without_locks_is_written_with_a_note(tmp_path, capsys, monkeypatch):
    import errno
    import os

    import bass.cli.filelock

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(bass.cli.filelock.fcntl, "flock", no_locks)
    out = tmp_path / "out.jsonl"
    with OutputLock(out, "--output", "bass generate a -o out.jsonl"):
        pass
    assert capsys.readouterr().err == (
        f"bass: note: --output {out}: its file system cannot lock files; nothing stops a "
        "second run from writing it at the same time\n"
    )
    assert os.listdir(tmp_path) == []  # its lock file not left behind


def test_a_hard_link_to_a_file_another_run_writes_is_refused(tmp_path, capsys, no_model_load):
    """The lock file is named after the path, so a hard link had a lock of its own: a run
    writing through it truncated the other run's rows (one file, two writers). The file
    itself is locked too: once it exists, whether it did when the run started or the run
    made it."""
    import os

    from bass.cli.errors import UsageError
    from bass.cli.results import LineWriter

    out, hard = tmp_path / "out.jsonl", tmp_path / "hard.jsonl"
    out.write_text("")  # a run resuming a file of no rows yet
    proc = hold(f"generate hello -o {out} --resume")
    try:
        os.link(out, hard)
        rc, _, err = run(capsys, f"generate hello -o {hard} --overwrite")
    finally:
        release(proc)
    assert rc == 2
    assert one_error_line(err).startswith(
        f"bass: error: --output {hard} is being written by another bass run under another "
        "name (a hard link: the file has 2 names)"
    )
    assert out.read_text() == ""
    assert sorted(os.listdir(tmp_path)) == ["hard.jsonl", "out.jsonl"]  # no lock file left
    made, other = tmp_path / "made.jsonl", tmp_path / "other.jsonl"
    with OutputLock(made, "--output", "bass generate a -o made.jsonl"):
        writer = LineWriter(made, "--output")  # the run makes its file: locked from then on
        os.link(made, other)
        with pytest.raises(UsageError, match="under another name"):
            OutputLock(other, "--output", "bass generate b -o other.jsonl").acquire()
        writer.close()
    with OutputLock(other, "--output", "bass generate b -o other.jsonl"):  # released: free
        pass


def test_an_output_where_no_lock_file_can_be_made_says_to_choose_another(
    tmp_path, capsys, no_model_load
):
    """An output whose directory holds no lock file (a file under /proc, a path this user
    cannot write) is refused with what to do: nothing is there to remove."""
    rc, _, err = run(capsys, "generate hello -o /proc/version")
    assert rc == 2
    line = one_error_line(err)
    assert "cannot use its lock file /proc/version.lock" in line
    assert line.endswith("choose another --output, in a directory this user can write to")
    assert "remove" not in line
