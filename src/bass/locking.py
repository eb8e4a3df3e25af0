"""Threads: bass runs one generation at a time per process, each as if it were alone.

Every :meth:`bass.Generator.generate` call, and every :class:`bass.Generator` being built,
holds one process-wide lock while it touches the models; the contract (calls take turns
and each returns what it would alone; argument checks come first; a call from inside a
running generation on its thread raises :class:`ReentrantGenerationError`) is in
docs/guides/generation.md ("Threads"). ``time_budget`` counts from the moment the call
runs, not from when it started waiting.

Models may be shared between Generators: each generation switches its models to
``attn_implementation="bass"`` and back when it returns; a model's CPU layouts are those
of the Generator built last (:func:`bass.cpu_linear.prepare`). Using a model outside bass
while a generation runs on it (its own ``generate`` in another thread) is not supported:
it would see bass's attention.

One lock for the process, not one per model: a generation switches process-wide state
besides its models' (the routing switch of :mod:`bass.cpu_linear`, the host-side length
checks of :mod:`bass.ops`), so two generations on disjoint models could still change
each other's passes.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

__all__ = ["ReentrantGenerationError", "exclusive", "running"]

_LOCK = threading.Lock()
_OWNER: list[int | None] = [None]  # the thread holding _LOCK (set and cleared under it)


class ReentrantGenerationError(RuntimeError):
    """A generation (or a Generator's construction) was started from inside a running
    generation on the same thread, which would wait for itself."""


def running() -> bool:
    """Whether some thread is inside a generation (or building a Generator) now."""
    return _LOCK.locked()


@contextlib.contextmanager
def exclusive(what: str) -> Iterator[None]:
    """Hold the process's generation lock for ``what`` (``"generate()"``, ...): wait for a
    generation running on another thread; refuse one on this thread."""
    me = threading.get_ident()
    if _OWNER[0] == me:  # only this thread can have set it to its own id
        raise ReentrantGenerationError(
            f"{what} was called from inside a running generation on the same thread (from "
            "an on_step callback or a policy?); bass runs one generation at a "
            "time per process, so it would wait for itself: call it after generate() returns"
        )
    _LOCK.acquire()
    _OWNER[0] = me
    try:
        yield
    finally:
        _OWNER[0] = None
        _LOCK.release()
