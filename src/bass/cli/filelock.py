"""One writer per output file: a lock on ``<file>.lock`` beside it (how and why:
docs/guides/config-and-cli.md, "One writer per file")."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shlex
import socket
import sys
import time
from pathlib import Path

from .errors import UsageError, say

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["LOCK_SUFFIX", "OutputLock", "command_line", "lock_outputs"]

LOCK_SUFFIX = ".lock"
#: How a lock file's content starts (JSON with this first key): bass's own, else refused
#: rather than overwritten.
_MARK = b'{"bass_lock": '
#: How long a refused run waits for the holder to write its details (it writes them right
#: after taking the lock).
_DETAILS_WAIT = 1.0


def command_line(argv: list[str] | None) -> str:
    """``argv`` as the command a user typed (``bass generate ...``), for the lock file."""
    words = list(sys.argv[1:] if argv is None else argv)
    return "bass " + shlex.join(words)


class OutputLock:
    """The lock of one output file ``path`` (given to ``flag``), taken by :meth:`acquire`
    (or a refusal), dropped by :meth:`release`."""

    def __init__(self, path: str | os.PathLike, flag: str, command: str):
        self.path, self.flag, self.command = Path(path), flag, command
        self.target = Path(os.path.realpath(path))  # one lock for any spelling, symlink
        self.lock_path: Path | None = None
        self.fd: int | None = None

    def acquire(self) -> None:
        if fcntl is None or (self.target.exists() and not self.target.is_file()):
            return  # Windows; /dev/null: any number of writers
        lock = self.target.with_name(self.target.name + LOCK_SUFFIX)
        for _ in range(100):  # more than one turn only when a holder removed it meanwhile
            fd, beside = self._open(lock)
            try:
                took = self._lock(fd, lock if beside else None)
            except BaseException:
                os.close(fd)
                raise
            if took == "again":
                os.close(fd)
                continue
            if took == "unsupported":
                if beside and os.fstat(fd).st_size == 0:  # made just now, by this run
                    with contextlib.suppress(OSError):
                        os.unlink(lock)
                os.close(fd)
                say(
                    f"note: {self.flag} {self.path}: its file system cannot lock files; "
                    "nothing stops a second run from writing it at the same time"
                )
                return
            self.fd, self.lock_path = fd, lock if beside else None
            if beside:
                self._claim(fd, lock)
            return
        raise UsageError(  # pragma: no cover - 100 holders in a row removed it under us
            f"{self.flag} {self.path}: could not take its lock {lock}; try again"
        )

    def _open(self, lock: Path) -> tuple[int, bool]:
        """A descriptor to lock: ``lock``'s, or the output's own where ``lock`` cannot be
        made (a directory the user may not write); ``(fd, beside)``."""
        flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | os.O_CLOEXEC
        try:
            return os.open(lock, flags, 0o644), True
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS) and self.target.is_file():
                for mode in (os.O_RDONLY, os.O_WRONLY | os.O_APPEND):  # never truncating
                    with contextlib.suppress(OSError):
                        return os.open(self.target, mode | os.O_CLOEXEC), False
            what = {
                errno.ELOOP: "it is a symbolic link",
                errno.EISDIR: "it is a directory",
            }.get(exc.errno, exc.strerror)
            raise UsageError(
                f"{self.flag} {self.path}: cannot use its lock file {lock} ({what}); bass "
                f"locks each output there while a run writes it: remove {lock}, or choose "
                f"another {self.flag}"
            ) from None

    def _lock(self, fd: int, lock: Path | None) -> str:
        """Take the lock on ``fd`` (``"locked"``) or refuse, naming the holder;
        ``"again"`` when ``lock`` (the path) no longer names the file ``fd`` is (its holder
        removed it), ``"unsupported"`` on a file system without locks."""
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP):
                return "unsupported"
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise UsageError(
                    f"{self.flag} {self.path}: cannot lock it: {exc.strerror}; choose another "
                    f"{self.flag}"
                ) from None
            raise UsageError(self._busy(fd, lock)) from None
        if lock is None:
            return "locked"
        try:
            now = os.stat(lock, follow_symlinks=False)
        except FileNotFoundError:
            return "again"
        return "locked" if os.path.samestat(now, os.fstat(fd)) else "again"

    def _claim(self, fd: int, lock: Path) -> None:
        """Write this run's details into the lock file ``fd`` holds, unless the file is
        someone else's (not empty, not a bass lock): that is refused, not overwritten."""
        old = os.pread(fd, len(_MARK), 0)
        if old and not old.startswith(_MARK[: len(old)]):
            self.fd = None
            os.close(fd)
            raise UsageError(
                f"{self.flag} {self.path}: {lock} exists and is not a bass lock file; bass "
                f"locks each output in <output>{LOCK_SUFFIX} while a run writes it: move that "
                f"file away, or choose another {self.flag}"
            )
        details = {
            "bass_lock": 1,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S %z"),
            "command": self.command,
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(details) + "\n").encode("utf-8"), 0)

    def _busy(self, fd: int, lock: Path | None) -> str:
        """The refusal: which run holds the file, and what to do."""
        details = _details(fd) if lock is not None else None
        if details:
            command = " ".join(str(details.get("command", "?")).split())
            if len(command) > 200:
                command = command[:197] + "..."
            who = (
                f"pid {details.get('pid', '?')} on {details.get('host', '?')}, started "
                f"{details.get('started', '?')}: {command}"
            )
        else:
            who = f"its details are not known; lock file {lock or self.target}"
        return (
            f"{self.flag} {self.path} is being written by another bass run ({who}); a file "
            f"takes one writer at a time: wait for that run to end (or stop it), or choose "
            f"another {self.flag}"
        )

    def release(self) -> None:
        fd, self.fd = self.fd, None
        if fd is None:
            return
        if self.lock_path is not None:  # removed while locked: see the docs page
            with contextlib.suppress(OSError):
                now = os.stat(self.lock_path, follow_symlinks=False)
                if os.path.samestat(now, os.fstat(fd)):
                    os.unlink(self.lock_path)
        os.close(fd)  # drops the lock

    def __enter__(self) -> OutputLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _details(fd: int) -> dict | None:
    """The holder's details from its lock file, waiting a moment for it to write them."""
    deadline = time.monotonic() + _DETAILS_WAIT
    while True:
        with contextlib.suppress(OSError, ValueError):
            data = os.pread(fd, 1 << 16, 0)
            if data.startswith(_MARK) and data.endswith(b"\n"):
                details = json.loads(data)
                if isinstance(details, dict):
                    return details
        if time.monotonic() > deadline:
            return None
        time.sleep(0.05)


def lock_outputs(args, outputs: dict[str, str | None]) -> None:
    """Lock each output (``{flag: path}``; ``None``: not given) for the command
    (``args.command_line``) until it ends (``args.held``: :func:`bass.cli.main` closes it);
    the first that another run holds is refused (those taken before it are released)."""
    for flag, path in outputs.items():
        if path:
            args.held.enter_context(OutputLock(path, flag, args.command_line))
