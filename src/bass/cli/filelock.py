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

__all__ = ["LOCK_SUFFIX", "OutputLock", "command_line", "lock_outputs", "pin"]

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
        self.target = Path(os.path.realpath(path))  # any spelling, symlink (hard links: pin)
        self.lock_path: Path | None = None
        self.fd: int | None = None
        self.file_fd: int | None = None  # the output's own flock (pin): its hard links too

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
                _HELD[self.target] = self
                try:  # an output that exists: its file too (another name for it: refused)
                    self.pin()
                except BaseException:
                    self.release()
                    raise
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
            fix = (
                f"remove {lock}, or choose another {self.flag}"
                if exc.errno in (errno.ELOOP, errno.EISDIR)  # something there is in the way
                else f"choose another {self.flag}, in a directory this user can write to"
            )
            raise UsageError(
                f"{self.flag} {self.path}: cannot use its lock file {lock} ({what}); bass "
                f"locks each output there while a run writes it: {fix}"
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

    def pin(self) -> None:
        """Lock the output file itself (once it exists; the lock file is named after the
        path, so a hard link, another name for the file, has a lock file of its own): a run
        holding it under another name is refused."""
        if self.file_fd is not None or not self.target.is_file():
            return
        try:
            fd = os.open(self.target, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return  # unreadable: its name's lock stands alone
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise UsageError(
                    f"{self.flag} {self.path} is being written by another bass run under "
                    f"another name (a hard link: the file has {os.stat(self.target).st_nlink} "
                    f"names); a file takes one writer at a time: wait for that run to end (or "
                    f"stop it), or choose another {self.flag}"
                ) from None
            return  # a file system without locks: the name's lock stands alone
        self.file_fd = fd

    def release(self) -> None:
        if _HELD.get(self.target) is self:
            del _HELD[self.target]
        if self.file_fd is not None:
            os.close(self.file_fd)
            self.file_fd = None
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


#: the outputs this process holds the lock of, by their resolved path
_HELD: dict[Path, OutputLock] = {}


def pin(path: str | os.PathLike) -> None:
    """This process's lock of ``path`` (if it holds one) takes the file itself too, now
    that it exists (:meth:`OutputLock.pin`; the results writers call this once they made
    the file)."""
    lock = _HELD.get(Path(os.path.realpath(path)))
    if lock is not None:
        lock.pin()


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
