"""Threads: bass runs one generation at a time per process, each as if it were alone.
Every :meth:`bass.Generator.generate` call, and every :class:`bass.Generator` being built,
holds one process-wide lock while it touches the models (the contract, shared models and
why one lock: docs/reference/runtime.md, "Threads and shared models").
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

__all__ = ["ReentrantGenerationError", "exclusive", "resumed", "running"]

_LOCK = threading.Lock()
_OWNER: list[int | None] = [None]  # the thread holding _LOCK (set and cleared under it)


class ReentrantGenerationError(RuntimeError):
    """A generation (or a Generator's construction) was started from inside a running
    generation on the same thread, which would wait for itself."""


def running() -> bool:
    """Whether some thread is inside a generation (or building a Generator) now."""
    return _LOCK.locked()


def resumed() -> None:
    """The running generation (a stream, paused between rows) continues on this thread,
    which owns it from now on: a stream may move between threads (a server's pool), and
    its loop body's generation is refused on the thread that runs it, waited for on any
    other."""
    _OWNER[0] = threading.get_ident()


@contextlib.contextmanager
def exclusive(what: str) -> Iterator[None]:
    """Hold the process's generation lock for ``what`` (``"generate()"``, ...): wait for a
    generation running on another thread; refuse one on this thread."""
    me = threading.get_ident()
    if _OWNER[0] == me:  # only this thread can have set it to its own id
        raise ReentrantGenerationError(
            f"{what} was called from inside a running generation on the same thread (from "
            "an on_step callback or a policy, or beside a stream() not read to its end?); "
            "bass runs one generation at a time per process, so it would wait for itself: "
            "call it after generate() returns, or after the stream ends or is closed "
            "(stream.close())"
        )
    _LOCK.acquire()
    _OWNER[0] = me
    try:
        yield
    finally:
        _OWNER[0] = None
        _LOCK.release()
