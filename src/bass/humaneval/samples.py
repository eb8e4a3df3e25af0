"""Problems' samples: ``n`` completions of each prompt, generated in one continuously
batched call over many problems and cut at the stop sequences."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..models import encode_prompt
from ..sampling import SAMPLE_BITS, row_key
from .problems import STOP_SEQUENCES, HumanEvalError, truncate

__all__ = ["Sample", "SampleFn", "make_sampler", "row_id"]


@dataclass
class Sample:
    """One generated completion: its text (already cut at a stop sequence), the tokens
    generated up to where it finished, and whether it finished (eos or stop sequence)
    rather than running out of tokens or time."""

    completion: str
    tokens: int
    finished: bool


# (problems, n, on_problem) -> (each problem's n samples, GenerationStats or None);
# on_problem (may be None) gets (the problem's index, its samples) as soon as the
# problem's last sample finishes
SampleFn = Callable[..., tuple[list[list[Sample]], Any]]

#: the bits of a task id's hash in its rows' ids (:func:`row_id`; ``row_key``'s limit)
_TASK_BITS = 63 - SAMPLE_BITS


def row_id(task_id: str, sample: int) -> int:
    """The row id (``generate(row_ids=...)``, which keys the row's sampled draws with the
    seed) of sample ``sample`` of problem ``task_id``: a function of the two alone, so a
    sample draws the same whichever problems share its generate call, in which order,
    and under every method (the same samples up to float rounding:
    ``docs/concepts/exactness.md``, "Floating-point rounding")."""
    digest = hashlib.blake2b(task_id.encode(), digest_size=8).digest()
    return row_key(int.from_bytes(digest, "big") >> (64 - _TASK_BITS), sample)


def make_sampler(generator, tokenizer, *, chat: bool = False, **generate_kwargs) -> SampleFn:
    """A :data:`SampleFn` that generates ``n`` samples of each problem's prompt with
    ``generator`` (a :class:`bass.Generator`) in one continuously batched call over all
    the problems it is given (``max_rows`` and ``kv_budget_gib`` in ``generate_kwargs``
    bound the rows at once; a problem's samples take slots one after another as they free
    up, and a time budget runs for each from when it starts).
    Rows stop at the stop sequences (:data:`STOP_SEQUENCES`, plus any ``stop_strings``
    in ``generate_kwargs``) and the completions are cut before them; sampled rows are
    keyed by :func:`row_id` and the ``seed``."""
    extra = generate_kwargs.pop("stop_strings", None) or ()
    extra = [extra] if isinstance(extra, str) else list(extra)
    stops = tuple(dict.fromkeys([*STOP_SEQUENCES, *extra]))
    eos = generate_kwargs.get("eos_token_id")
    eos = set([eos] if isinstance(eos, int) else (eos or []))

    def sample(problems: Sequence[dict], n: int, on_problem=None):
        tasks = [p.get("task_id", "") for p in problems]
        twice = next((t for t in tasks if tasks.count(t) > 1), None)
        if twice is not None:
            raise HumanEvalError(f"problem {twice!r} is given twice: task ids must differ")
        prompts, ids = [], []
        for problem, task in zip(problems, tasks):
            prompts += [encode_prompt(tokenizer, problem["prompt"], chat)] * n
            ids += [row_id(task, j) for j in range(n)]
        got: list[list] = [[None] * n for _ in problems]
        left = [n] * len(problems)

        def finished(row) -> None:  # a problem's samples side by side: row i * n + j
            i, j = divmod(row.prompt, n)
            got[i][j] = _to_sample(tokenizer, row.tokens, eos, stops)
            left[i] -= 1
            if not left[i] and on_problem is not None:
                on_problem(i, got[i])

        res = generator.generate(
            prompts,
            stop_strings=stops,
            tokenizer=tokenizer,
            row_ids=ids,
            on_finish=finished,
            **generate_kwargs,
        )
        return got, res.stats

    return sample


def _to_sample(
    tokenizer, ids: list[int], eos: set[int], stops: Sequence[str] = STOP_SEQUENCES
) -> Sample:
    full = tokenizer.decode(ids, skip_special_tokens=True)
    completion, end = truncate(full, stops)
    if end is None:
        return Sample(completion, len(ids), bool(ids) and ids[-1] in eos)
    # the token that completed the stop sequence (where the engine stopped the row: its
    # last token, unless the generator ran past stop sequences)
    lo, hi = 1, len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if len(tokenizer.decode(ids[:mid], skip_special_tokens=True)) >= end:
            hi = mid
        else:
            lo = mid + 1
    return Sample(completion, lo, True)
