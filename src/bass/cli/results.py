"""The commands' inputs and outputs on disk (docs/guides/config-and-cli.md, "Nothing
finished is lost")."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

from .errors import UsageError
from .filelock import pin
from .loading import has_chat_template

__all__ = [
    "LineWriter",
    "Prompt",
    "check_chat",
    "check_not_inputs",
    "check_writable",
    "deferred_interrupts",
    "not_a_row",
    "nulled",
    "read_done",
    "scan_lines",
]


class Prompt(str):
    """A prompt's text, with ``where`` it came from (``"p.txt:7"``) for error messages."""

    where: str

    def __new__(cls, text: str, where: str) -> Prompt:
        self = super().__new__(cls, text)
        self.where = where
        return self


def check_output_flags(args) -> None:
    """``--output`` a path (not empty, not ``-``), and the flags that need one given it."""
    if args.output is not None and args.output.strip() in ("", "-"):
        raise UsageError(
            f"--output {args.output!r}: pass a file path (the results are printed on "
            "standard output; --output keeps them as JSON lines)"
        )
    for flag in ("resume", "overwrite"):
        if getattr(args, flag, False) and not args.output:
            raise UsageError(f"--{flag} needs --output FILE: the results file of a run")


def check_writable(path: str, flag: str, *, resume: bool = False) -> Path:
    """Refuse, before any work, a ``path`` that ``flag`` would write and cannot: a
    directory, a missing parent directory, no permission, something that is not a file (a
    named pipe would block until a reader comes; a character device such as /dev/null is
    accepted, but not with ``resume``, which reads the file first)."""
    p = Path(path)
    parent = p.parent if str(p.parent) else Path(".")
    if p.is_dir():
        raise UsageError(f"{flag} {path} is a directory; pass a file path")
    if not parent.is_dir():
        raise UsageError(
            f"{flag} {path}: the directory {parent} does not exist; create it first or choose "
            "another path"
        )
    if p.exists() and not p.is_file():
        mode = p.stat().st_mode
        if not stat.S_ISCHR(mode) or resume:
            kind = _KINDS.get(stat.S_IFMT(mode), "not a regular file")
            allowed = "a regular file" if resume else "a regular file (or /dev/null)"
            raise UsageError(
                f"{flag} {path} is {kind}; {flag} "
                + ("with --resume " if resume else "")
                + f"takes {allowed}: choose another path"
            )
    if p.exists() and not os.access(p, os.W_OK):
        raise UsageError(f"{flag} {path} is not writable (permission denied); choose another path")
    if not p.exists() and not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(
            f"{flag} {path}: cannot create a file in {parent} (permission denied); choose "
            "another path"
        )
    return p


_KINDS = {
    stat.S_IFIFO: "a named pipe (FIFO)",
    stat.S_IFSOCK: "a socket",
    stat.S_IFBLK: "a block device",
    stat.S_IFCHR: "a character device",
}


def check_not_inputs(outputs: dict[str, str | None], args, config) -> None:
    """Refuse, before any work, an output path (``{flag: path}``) that names an input of
    the command (the ``--config`` file, the prompts file, a model file, or a file inside a
    model directory) or another output."""
    prompts_file = getattr(args, "prompts_file", None)
    inputs = {
        "--config file": args.config,
        "--prompts-file": None if prompts_file == "-" else prompts_file,
        "--main model": config.model.main,
        "--draft model": config.model.draft,
    }
    given = {flag: Path(path) for flag, path in outputs.items() if path}
    sources = {what: Path(path) for what, path in inputs.items() if path}
    # a pipe or a terminal read as input (/dev/stdin) holds nothing a write could destroy
    sources = {w: p for w, p in sources.items() if p.is_file() or p.is_dir() or not p.exists()}
    for flag, out in given.items():
        for what, src in sources.items():  # a model name that is no path is no file here
            inside = src.is_dir() and out.exists() and out.resolve().is_relative_to(src.resolve())
            same = False
            with contextlib.suppress(OSError):  # one does not exist
                same = os.path.samefile(out, src)  # one file, through links too
            if same or inside:
                where = f"a file in the {what} directory" if inside else f"the {what}"
                raise UsageError(
                    f"{flag} {out} is {where}: writing it would overwrite that input; "
                    "choose another path"
                )
    for (first, a), (second, b) in itertools.combinations(given.items(), 2):
        if a.resolve() == b.resolve():
            raise UsageError(f"{second} {b} is also the {first} file; choose another path")


class Terminated(KeyboardInterrupt):
    """SIGTERM (a batch scheduler's, a container's, torchrun's), inside a ``bass`` command:
    handled as Ctrl-C (:func:`terminated_as_interrupt`), reported as terminated."""


@contextlib.contextmanager
def terminated_as_interrupt() -> Iterator[None]:
    """SIGTERM inside raises :class:`Terminated`, so that it ends a command as Ctrl-C
    does (finished rows said, a results line never cut short: :func:`deferred_interrupts`),
    where its handler is the default one and this is the main thread."""
    main = threading.current_thread() is threading.main_thread()
    if not main or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return

    def terminate(signum, frame):
        raise Terminated()

    signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextlib.contextmanager
def deferred_interrupts() -> Iterator[None]:
    """Ctrl-C (SIGINT) and SIGTERM inside wait until the block ends (a results line is
    never cut short), then interrupt as usual. Only the main thread can set signal
    handlers; elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[tuple] = []
    signals = (signal.SIGINT, signal.SIGTERM)
    previous = {n: signal.signal(n, lambda *a: caught.append(a)) for n in signals}
    try:
        yield
    finally:
        for n in signals:
            signal.signal(n, signal.SIG_DFL if previous[n] is None else previous[n])
        if caught:
            signum = caught[0][0]
            handler = previous[signum]
            if callable(handler):
                handler(*caught[0])  # Python's SIGINT handler raises KeyboardInterrupt
            elif handler == signal.SIG_DFL:
                os.kill(os.getpid(), signum)


def read_done(
    path: Path,
    prompts: list[str],
    n: int,
    settings: dict,
    *,
    truncate: bool = True,
    chats: dict | None = None,
) -> tuple[set[tuple[int, int]], int]:
    """For ``--resume``: the ``(prompt index, sample)`` rows the results file ``path``
    holds, each checked against this run (``prompts``, ``n``, ``settings``), and how many
    carry no ``settings`` (an older bass's); a last line cut short, and blank lines after
    the last row, are then removed (with ``truncate``). A ``chat`` left out (null) on
    either side is checked once the tokenizer is known (:func:`check_chat`): the rows'
    ``chat`` values go into ``chats`` (value -> the first line with it)."""
    done: dict[tuple[int, int], int] = {}  # row -> its line
    unchecked = 0

    def each(line: bytes, number: int) -> None:
        nonlocal unchecked
        row = _row(line, f"--output {path}:{number}", prompts, n, settings)
        unchecked += "settings" not in row
        if chats is not None and isinstance(row.get("settings"), dict):
            chats.setdefault(row["settings"].get("chat"), f"--output {path}:{number}")
        key = (row["prompt_index"], row["sample"])
        if key in done:  # two runs wrote the file at once (an older bass did not)
            raise UsageError(
                f"--output {path}:{number}: a second row of prompt {key[0]}, sample "
                f"{key[1]} (the first is line {done[key]}); the file is corrupt "
                "(written by two runs at once?): remove the extra lines, or rerun "
                "with --overwrite (not --resume) to start over"
            )
        done[key] = number

    # a line cut short is cut from the file only if it starts as every row does (its
    # first key: the prompt); its row is generated again
    scan_lines(path, each, b'{"prompt": ', not_a_row, truncate=truncate)
    return set(done), unchecked


def scan_lines(path: Path, each, start: bytes, refuse, *, truncate: bool = True) -> None:
    """``each(line, number)`` for every complete, non-blank line of the results file
    ``path`` (``--resume`` reads it line by line: a file of millions of rows stays on
    disk). With ``truncate``, what follows the last such line goes: blank lines (the next
    run's rows follow its last row) and a last line cut short (a killed run's), which
    must start as ``start`` (else ``refuse(where)`` is raised, nothing changed)."""
    if not path.exists():
        return
    number = cut = kept = 0  # cut: where the complete lines end; kept: the last one's end
    partial = b""
    try:
        with path.open("rb") as f:
            for number, line in enumerate(f, 1):
                if not line.endswith(b"\n"):  # a partial last line
                    partial = line
                    break
                cut += len(line)
                if line.strip():
                    each(line, number)
                    kept = cut
    except OSError as exc:
        raise UsageError(f"--output {path}: cannot read it to resume: {exc.strerror}") from None
    if partial.strip() and not (partial.startswith(start) or start.startswith(partial)):
        raise refuse(f"--output {path}:{number}")
    if truncate and kept < cut + len(partial):
        with path.open("r+b") as f:
            f.truncate(kept)


def nulled(theirs: dict, ours: dict) -> tuple[dict, dict]:
    """Both with every key of either: a setting one lacks (a row of an older bass, before
    it had ``min_p``) reads as null."""
    keys = dict.fromkeys([*ours, *theirs])
    return {**keys, **theirs}, {**keys, **ours}


def _compared(theirs: dict, ours: dict) -> tuple[dict, dict]:
    """A row's settings and this run's as ``--resume`` compares them now (:func:`nulled`);
    ``chat`` left
    out (null, on either side) agrees here, as whether the template applies is known
    once the tokenizer is (:func:`check_chat`); stop strings as a set (none: ``[]`` or
    null; repeated or in another order: the same rows)."""
    theirs, ours = nulled(theirs, ours)
    theirs, ours = ({**d, "stop_strings": _stops(d.get("stop_strings"))} for d in (theirs, ours))
    if theirs.get("chat") is None or ours.get("chat") is None:
        return {**theirs, "chat": None}, {**ours, "chat": None}
    return theirs, ours


def _stops(value):
    """A results line's ``stop_strings`` as a set (``None`` for none); a value of another
    shape as it is (it differs from any run's)."""
    if value is None or value == []:
        return None
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return sorted(set(value))
    return value


def check_chat(chats: dict, chat: bool, tokenizer) -> None:
    """``--resume``, once the tokenizer is known: the rows (their ``chat`` values, as
    :func:`read_done` gathered them; null: the template where ``tokenizer`` has one) went
    through the chat template as this run's prompts do (``chat``)."""
    for theirs, where in chats.items():
        if (has_chat_template(tokenizer) if theirs is None else theirs) != chat:
            raise UsageError(
                f"{where}: a row generated {'without' if chat else 'with'} the chat template, "
                f"but this run's prompts go {'through it' if chat else 'without it'} (chat: "
                f"{json.dumps(theirs)} there, {json.dumps(chat)} now); "
                "--resume continues a run with the same generation settings: rerun with "
                f"{'--chat' if not chat else '--no-chat'}, or use another --output"
            )


def differences(theirs: dict, ours: dict) -> str:
    """The settings a file's line (``theirs``) and this run (``ours``) differ in, as
    ``key: value there, value now`` for ``--resume``'s refusal."""
    differ = [k for k in dict.fromkeys([*ours, *theirs]) if theirs.get(k) != ours.get(k)]
    return "; ".join(
        f"{k}: {json.dumps(theirs.get(k))} there, {json.dumps(ours.get(k))} now" for k in differ
    )


def not_a_row(where: str) -> UsageError:
    """The error for a line of ``--output`` (or of a shard) that is no results row."""
    return UsageError(
        f"{where}: not a row that bass generate wrote (a JSON object with prompt, "
        "prompt_index and sample): another file (--resume continues bass generate's "
        "--output: check the path), or a damaged line (remove it: its row is generated again)"
    )


def _row(line: bytes, where: str, prompts: list[str], n: int, settings: dict) -> dict:
    """One complete line of a results file, checked against this run."""
    try:
        row = json.loads(line)
        i, s, text = row["prompt_index"], row["sample"], row["prompt"]
    except (ValueError, KeyError, TypeError):
        raise not_a_row(where) from None
    known = isinstance(i, int) and 0 <= i < len(prompts)
    if not known or text != prompts[i]:
        given = f"prompt {i} is {prompts[i]!r}" if known else f"there are {len(prompts)} prompts"
        raise UsageError(
            f"{where}: a row of prompt {i} ({text!r}), but {given}; --resume needs the "
            "prompts of the run that wrote the file, in the same order (or use another "
            "--output)"
        )
    if not (isinstance(s, int) and 0 <= s < n):
        raise UsageError(
            f"{where}: a row of sample {s}, but --samples (--n) is {n} (samples are numbered "
            f"from 0, so 0-{n - 1}); --resume needs the --samples of the run that wrote the file"
        )
    if "settings" not in row:
        return row
    if not isinstance(row["settings"], dict):
        raise not_a_row(where)
    theirs, ours = _compared(row["settings"], settings)
    if theirs != ours:
        raise UsageError(
            f"{where}: a row generated with other settings ({differences(theirs, ours)}); "
            "--resume continues a "
            "run with the same generation settings: rerun with the settings of the run that "
            "wrote the file, or use another --output"
        )
    return row


class LineWriter:
    """An output file written a piece at a time, each piece in whole (Ctrl-C waits until it
    is written) and unbuffered: a failed write is one :class:`UsageError` naming ``flag``,
    and closing cannot fail again."""

    def __init__(self, path: Path, flag: str, *, append: bool = False):
        self.path, self.flag, self.lines = path, flag, 0
        try:
            self.file = path.open("ab" if append else "wb", buffering=0)
        except OSError as exc:
            raise UsageError(f"{flag} {path}: cannot open it: {exc.strerror}") from None
        pin(path)  # the file itself locked too, now that it exists (its hard links)

    def write(self, text: str) -> None:
        data = memoryview(text.encode("utf-8"))
        try:
            with deferred_interrupts():
                while data:
                    data = data[self.file.write(data) :]
                # counted before a Ctrl-C held back during the write is raised
                self.lines += text.count("\n")
        except OSError as exc:  # a full disk, a file system gone read-only
            raise UsageError(f"{self.flag} {self.path}: cannot write it: {exc.strerror}") from exc

    def flush(self) -> None:  # unbuffered: every write is already with the OS
        pass

    def close(self) -> None:
        with contextlib.suppress(OSError):  # nothing is buffered: nothing to lose
            self.file.close()
