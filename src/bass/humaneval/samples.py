"""A problem's samples: ``n`` completions of its prompt, generated in one batch and cut at
the stop sequences."""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..models import encode_prompt
from .problems import STOP_SEQUENCES, truncate

__all__ = ["Sample", "SampleFn", "make_sampler", "problem_seed"]


@dataclass
class Sample:
    """One generated completion: its text (already cut at a stop sequence), the tokens
    generated up to where it finished, and whether it finished (eos or stop sequence)
    rather than running out of tokens or time."""

    completion: str
    tokens: int
    finished: bool


# (problem, n) -> (samples, GenerationStats or None)
SampleFn = Callable[[dict, int], tuple[list[Sample], Any]]


def problem_seed(seed: int | None, task_id: str) -> int | None:
    """The seed of one problem's batch: ``seed`` mixed with the task id, so problems draw
    independent samples while every method sampling the same problem uses the same seed
    (with n-gram drafts or none, bass's keyed sampling then gives every method the same
    draws: with a float64 model the very same samples; in float32 or bfloat16 a pass
    that verifies drafts computes the logits through differently shaped products, which
    round differently, so a draw that falls within rounding of a token boundary can pick
    the neighbouring token and the samples part from there)."""
    if seed is None:
        return None
    return (seed * 0x9E3779B1 + zlib.crc32(task_id.encode())) % 2**62


def make_sampler(generator, tokenizer, *, chat: bool = False, **generate_kwargs) -> SampleFn:
    """A :data:`SampleFn` that generates ``n`` samples of a problem's prompt in one batch
    with ``generator`` (a :class:`bass.Generator`). Rows stop at the stop sequences
    (:data:`STOP_SEQUENCES`, plus any ``stop_strings`` in ``generate_kwargs``) and the
    completions are cut before them; a ``seed`` in ``generate_kwargs`` seeds each
    problem's batch with :func:`problem_seed`."""
    extra = generate_kwargs.pop("stop_strings", None) or ()
    extra = [extra] if isinstance(extra, str) else list(extra)
    stops = tuple(dict.fromkeys([*STOP_SEQUENCES, *extra]))
    seed = generate_kwargs.pop("seed", None)

    def sample(problem: dict, n: int) -> tuple[list[Sample], Any]:
        text = problem["prompt"]
        ids = encode_prompt(tokenizer, text, chat)
        res = generator.generate(
            [ids] * n,
            stop_strings=stops,
            tokenizer=tokenizer,
            seed=problem_seed(seed, problem.get("task_id", "")),
            **generate_kwargs,
        )
        eos = generate_kwargs.get("eos_token_id")
        eos = set([eos] if isinstance(eos, int) else (eos or []))
        return [_to_sample(tokenizer, seq, eos, stops) for seq in res.sequences], res.stats

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
