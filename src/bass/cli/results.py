"""``bass generate``'s inputs and outputs on disk: prompts that know where they came from,
paths checked before any model loads, and a JSONL results file written batch by batch
(appended and flushed, a batch's rows in one write that Ctrl-C does not cut) that
``--resume`` continues."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

from .errors import UsageError

__all__ = ["Prompt", "ResultsFile", "check_writable", "deferred_interrupts", "read_done"]


class Prompt(str):
    """A prompt's text, with ``where`` it came from (``"p.txt:7"``, ``"PROMPT 2"``) for
    error messages."""

    where: str

    def __new__(cls, text: str, where: str) -> Prompt:
        self = super().__new__(cls, text)
        self.where = where
        return self


def check_writable(path: str, flag: str) -> Path:
    """Refuse, before any work, a ``path`` that ``flag`` would write and cannot: a
    directory, a missing parent directory, no permission."""
    p = Path(path)
    parent = p.parent if str(p.parent) else Path(".")
    if p.is_dir():
        raise UsageError(f"{flag} {path} is a directory; pass a file path")
    if not parent.is_dir():
        raise UsageError(
            f"{flag} {path}: the directory {parent} does not exist; create it first or choose "
            "another path"
        )
    if p.exists() and not os.access(p, os.W_OK):
        raise UsageError(f"{flag} {path} is not writable (permission denied); choose another path")
    if not p.exists() and not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(
            f"{flag} {path}: cannot create a file in {parent} (permission denied); choose "
            "another path"
        )
    return p


@contextlib.contextmanager
def deferred_interrupts() -> Iterator[None]:
    """Ctrl-C (SIGINT) inside waits until the block ends (a results line is never cut
    short), then interrupts as usual. Only the main thread can set signal handlers;
    elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[tuple] = []
    previous = signal.signal(signal.SIGINT, lambda *a: caught.append(a))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.SIG_DFL if previous is None else previous)
        if caught and callable(previous):
            previous(*caught[0])  # Python's default handler raises KeyboardInterrupt
        elif caught and previous == signal.SIG_DFL:
            os.kill(os.getpid(), signal.SIGINT)


def read_done(path: Path, prompts: list[str], n: int) -> set[tuple[int, int]]:
    """The ``(prompt index, sample)`` rows that the results file ``path`` (from an earlier
    ``bass generate`` on the same prompts) already holds, for ``--resume``. A last line cut
    short (the run was killed while writing it) is removed from the file; a line that is
    not a row of these prompts is an error naming it."""
    if not path.exists():
        return set()
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UsageError(f"--output {path}: cannot read it to resume: {exc.strerror}") from None
    if data and not data.endswith(b"\n"):  # a partial last line: its row is generated again
        cut = data.rfind(b"\n") + 1
        with path.open("r+b") as f:
            f.truncate(cut)
        data = data[:cut]
    done: set[tuple[int, int]] = set()
    for number, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        where = f"--output {path}:{number}"
        try:
            row = json.loads(line)
            i, s, text = row["prompt_index"], row["sample"], row["prompt"]
        except (ValueError, KeyError, TypeError):
            raise UsageError(
                f"{where}: not a row that bass generate wrote (a JSON object with prompt, "
                "prompt_index and sample); --resume continues such a file: check the path"
            ) from None
        if not (isinstance(i, int) and 0 <= i < len(prompts)) or text != prompts[i]:
            given = f"prompt {i} is {prompts[i]!r}" if isinstance(i, int) and 0 <= i < len(
                prompts
            ) else f"there are {len(prompts)} prompts"  # fmt: skip
            raise UsageError(
                f"{where}: a row of prompt {i} ({text!r}), but {given}; --resume needs the "
                "prompts of the run that wrote the file, in the same order (or use another "
                "--output)"
            )
        if not (isinstance(s, int) and 0 <= s < n):
            raise UsageError(
                f"{where}: a row of sample {s}, but --n is {n}; --resume needs the --n of the "
                "run that wrote the file"
            )
        done.add((i, s))
    return done


class ResultsFile:
    """The ``--output`` JSONL file: truncated (or, resuming, appended to) when generation
    starts; each batch's rows appended in one write and flushed."""

    def __init__(self, path: Path, resume: bool):
        self.path = path
        try:
            self.file = path.open("a" if resume else "w", encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"--output {path}: cannot open it: {exc.strerror}") from None

    def write(self, records: list[dict]) -> None:
        text = "".join(json.dumps(r) + "\n" for r in records)
        try:
            with deferred_interrupts():
                self.file.write(text)
                self.file.flush()
        except OSError as exc:  # a full disk, a file system gone read-only
            raise UsageError(f"--output {self.path}: cannot write it: {exc.strerror}") from exc

    def close(self) -> None:
        self.file.close()
