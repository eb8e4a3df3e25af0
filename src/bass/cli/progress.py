"""``bass generate``'s progress on stderr while it generates."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator

__all__ = ["Progress"]


class Progress:
    """Tokens generated so far on stderr: a tqdm bar, or a plain line without tqdm."""

    def __init__(self, total: int, enabled: bool, unit: str = "tok"):
        self.total, self.enabled, self.base, self.n = total, enabled, 0, 0
        self.bar = None
        self.last = 0.0
        if enabled:
            try:
                from tqdm import tqdm
            except ImportError:
                pass
            else:
                opts = {"unit": unit, "file": sys.stderr, "delay": 1.0, "leave": False}
                self.bar = tqdm(total=total, dynamic_ncols=True, **opts)

    def on_step(self, generator, state) -> None:
        self._show(self.base + sum(len(o) for o in state.outputs))

    def end_batch(self, budget: int) -> None:
        self.base += budget
        self._show(self.base)

    def _show(self, n: int) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.update(n - self.n)
        elif time.perf_counter() - self.last > 0.5:
            self.last = time.perf_counter()
            sys.stderr.write(f"\rbass: {n}/{self.total} tokens")
            sys.stderr.flush()
        self.n = n

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Print inside: the bar (or line) is cleared first and drawn again after."""
        clear = getattr(self.bar, "clear", None)
        if clear is not None:
            clear()
        elif self.enabled and self.bar is None and self.last:
            sys.stderr.write("\r\x1b[K")
        try:
            yield
        finally:
            refresh = getattr(self.bar, "refresh", None)
            if refresh is not None:
                refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.enabled and self.last:
            sys.stderr.write("\n")
