"""``bass generate``'s progress on stderr while it generates: rows done, tokens/s and
accepted draft tokens per step; and each row's own statistics for its results record."""

from __future__ import annotations

import contextlib
import sys
import time
from collections import Counter
from collections.abc import Iterator

__all__ = ["Progress", "shown"]


def shown(flag: bool | None) -> bool:
    """Whether a command shows progress: ``--progress`` / ``--no-progress``, else when
    stderr is a terminal (a log file gets none)."""
    return sys.stderr.isatty() if flag is None else flag


class Progress:
    """Rows done so far on stderr (a tqdm bar, or a plain line without tqdm); its
    :meth:`on_step` also counts each row's steps and accepted drafts (:meth:`row_stats`)."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.enabled, self.done = total, enabled, 0
        self.bar, self.last, self.text = None, 0.0, ""
        self.accepted: Counter[int] = Counter()  # per prompt: its accepted draft tokens
        self.trace: dict[int, list[int]] = {}  # per prompt: each of its steps' draft length
        self.row_steps = self.accepted_total = 0  # over those steps' active rows
        self.tokens_done = 0  # the finished rows' tokens (the others': counted per step)
        self.start = time.perf_counter()
        if enabled:
            with contextlib.suppress(ImportError):  # without tqdm: a plain line
                from tqdm import tqdm

                opts = {"unit": "row", "file": sys.stderr, "delay": 1.0, "leave": False}
                self.bar = tqdm(total=total, dynamic_ncols=True, **opts)

    def on_step(self, generator, state) -> None:
        # the step just taken (the latest record; a stream keeps no other): a cost of its
        # rows, never of the job's so far, nor of its finished rows' outputs
        step = generator.stats.steps[-1]
        for p, a in zip(step.prompts, step.accepted):
            self.accepted[p] += a
            self.trace.setdefault(p, []).append(step.draft_length)
        self.row_steps += len(step.accepted)
        self.accepted_total += sum(step.accepted)
        if not self.enabled:
            return
        running = [state.prompt_of[r] for r in state.active()]  # and the rows this step
        tokens = self.tokens_done + sum(  # ended, not handed over yet (else: a dip)
            len(state.outputs[p]) for p in (*running, *state.finished)
        )
        seconds = time.perf_counter() - self.start
        rate = f"{tokens / seconds:.1f} tok/s, " if seconds > 0 else ""
        mean = self.accepted_total / self.row_steps if self.row_steps else 0.0
        self.text = f"{tokens} tokens, {rate}{mean:.2f} accepted/step"
        self._show()

    def row_stats(self, prompt: int) -> dict:
        """Row ``prompt``'s (its index in the generate call) steps, accepted drafts and
        the draft length of each step it took part in (the policy's, the step's largest)."""
        trace, acc = self.trace.pop(prompt, []), self.accepted.pop(prompt, 0)
        return {
            "steps": len(trace),
            "accepted": acc,
            "mean_accepted_per_step": round(acc / len(trace), 4) if trace else 0.0,
            "draft_length_trace": trace,
        }

    def row_done(self, tokens: int) -> None:
        """A row finished with ``tokens`` new tokens."""
        self.done += 1
        self.tokens_done += tokens
        if self.bar is not None:
            self.bar.update(1)
        self._show(force=self.done == self.total)

    def _show(self, force: bool = False) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            if self.text and hasattr(self.bar, "set_postfix_str"):
                self.bar.set_postfix_str(self.text, refresh=False)
        elif force or time.perf_counter() - self.last > 0.5:
            self.last = time.perf_counter()
            more = f" ({self.text})" if self.text else ""
            sys.stderr.write(f"\r\x1b[Kbass: {self.done}/{self.total} rows{more}")
            sys.stderr.flush()

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
