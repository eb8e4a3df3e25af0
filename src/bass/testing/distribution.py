"""Sampling exactness in distribution, by a chi-square test against the exact
distribution: docs/reference/testing.md ("In distribution")."""

from __future__ import annotations

import contextlib
import itertools
import math
import numbers
import operator
import warnings
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import torch

from .. import options
from ..repetition import PENALTIES, occurrences, penalize
from ..sampling import SamplingParams, warp_probs
from .equivalence import _check_generator, _check_prompt, _own_attention, _warn_if_vacuous

__all__ = [
    "ChiSquare",
    "assert_distribution_equivalent",
    "chi_square_power",
    "chi_square_test",
    "exact_distribution",
]

MAX_OUTCOMES = 200_000  # V**L continuations enumerated at most
CHUNK = 4096  # continuations per forward pass of the enumeration


@torch.inference_mode()
def exact_distribution(
    model,
    prompt: Sequence[int],
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    repetition_penalty: float | None = None,
    frequency_penalty: float | None = None,
    presence_penalty: float | None = None,
) -> dict[tuple[int, ...], float]:
    """The exact probability of every continuation of ``prompt`` of ``max_new_tokens``
    tokens under ``model``'s warped sampling distribution (what sampling with the main
    model alone produces; the penalties first, as :func:`bass.repetition.penalize` applies
    them to each position's context), by enumeration: ``{tokens: probability}``, summing
    to 1.

    Needs a tiny vocabulary: ``V ** max_new_tokens`` at most 200,000.
    """
    V = model.get_output_embeddings().weight.shape[0]
    L = max_new_tokens
    if L < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {L}")
    if V**L > MAX_OUTCOMES:
        raise ValueError(
            f"{V}**{L} = {V**L} continuations is too many to enumerate (at most "
            f"{MAX_OUTCOMES}); use a model with a smaller vocabulary or fewer tokens"
        )
    where = "exact_distribution()"
    kw = options.check_keywords(
        where, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
        repetition_penalty=repetition_penalty, frequency_penalty=frequency_penalty,
        presence_penalty=presence_penalty,
    )  # fmt: skip
    options.check_sampling(True, kw["temperature"], where)
    params = SamplingParams(True, kw["temperature"], kw["top_k"], kw["top_p"], kw["min_p"])
    pen = {k.removesuffix("_penalty"): kw[k] for k in PENALTIES}
    prompt = _check_prompt("exact_distribution()", model, prompt, L)
    seqs = list(itertools.product(range(V), repeat=L))
    ids = torch.tensor([[*prompt, *s] for s in seqs], device=model.device)
    picked = []
    with _own_attention(model):  # in chunks: memory bounded by CHUNK rows, not V^L
        for chunk in ids.split(CHUNK):
            logits = model(chunk).logits[:, len(prompt) - 1 : -1].to(torch.float64)  # [n, L, V]
            if any(pen.values()):  # position t reads the prompt and the t tokens before it
                P = len(prompt)
                seen = torch.stack([occurrences(chunk[:, : P + t], V) > 0 for t in range(L)], 1)
                counts = torch.stack([occurrences(chunk[:, P : P + t], V) for t in range(L)], 1)
                f, p = pen["frequency"] or 0.0, pen["presence"] or 0.0
                logits = penalize(logits, seen, pen["repetition"], counts, f, p)
            probs = warp_probs(logits, params)
            at = chunk[:, len(prompt) :, None]
            picked.append(probs.gather(-1, at).squeeze(-1).prod(-1))  # [n]
    return dict(zip(seqs, torch.cat(picked).tolist()))


class ChiSquare(NamedTuple):
    """``(statistic, df, p_value)`` of a goodness-of-fit test."""

    statistic: float
    df: int
    p_value: float


def chi_square_test(counts: Mapping, expected: Mapping[object, float]) -> ChiSquare:
    """Pearson's chi-square test of observed ``counts`` against the distribution
    ``expected`` (outcome -> probability). Outcomes expected fewer than 5 times are
    pooled into one cell (folded into the smallest other cell if even the pool is
    expected fewer than 5 times); an observed outcome of probability 0 gives p = 0.
    Raises ``ValueError`` when the samples are too few to leave two cells (a test that
    could not fail), unless ``expected`` has a single possible outcome."""
    n = sum(counts.values())
    if n == 0:
        raise ValueError("no samples to test")
    if any(c and expected.get(s, 0.0) <= 0.0 for s, c in counts.items()):
        return ChiSquare(math.inf, 0, 0.0)
    total = sum(expected.values())
    obs, exp, pool_o, pool_e = [], [], 0, 0.0
    for s, p in expected.items():
        e = p / total * n
        if e >= 5:
            obs.append(counts.get(s, 0))
            exp.append(e)
        else:
            pool_o += counts.get(s, 0)
            pool_e += e
    if pool_e >= 5:
        obs.append(pool_o)
        exp.append(pool_e)
    elif pool_e > 0 and exp:  # a pooled cell this small would inflate false alarms:
        i = exp.index(min(exp))  # fold it into the smallest kept cell
        obs[i] += pool_o
        exp[i] += pool_e
    df = len(obs) - 1
    if df < 1:
        likely = sorted((p / total for p in expected.values() if p > 0), reverse=True)
        if len(likely) > 1:  # every outcome in one cell: nothing could be rejected
            share = min(likely[0], 1 - likely[0])  # the smaller of the two cells' shares
            need = math.ceil(5 / share)
            need += share * need < 5  # rounding
            raise ValueError(
                f"{n} samples are too few to test {len(likely)} possible outcomes: no two "
                f"cells are expected 5 times each (the test could not fail); draw at least "
                f"{need} samples (rows), or fewer outcomes (fewer tokens, a smaller top_k)"
            )
        return ChiSquare(0.0, 0, 1.0)  # one possible outcome, every sample on it
    stat = sum((o - e) ** 2 / e for o, e in zip(obs, exp))
    p = torch.special.gammaincc(
        torch.tensor(df / 2, dtype=torch.float64), torch.tensor(stat / 2, dtype=torch.float64)
    )
    return ChiSquare(stat, df, float(p))


def chi_square_power(
    expected: Mapping[object, float],
    alternative: Mapping[object, float],
    rows: int,
    *,
    alpha: float = 1e-3,
    trials: int = 1000,
    seed: int = 0,
) -> float:
    """The probability that :func:`chi_square_test` rejects ``expected`` at level
    ``alpha`` when ``rows`` samples come from ``alternative`` (Monte Carlo, ``trials``
    multinomial draws)."""
    outcomes = list(expected)
    q = torch.tensor([alternative.get(s, 0.0) for s in outcomes], dtype=torch.float64)
    g = torch.Generator().manual_seed(seed)
    rejected = 0
    for _ in range(trials):
        draw = torch.multinomial(q, rows, replacement=True, generator=g)
        counts = torch.bincount(draw, minlength=len(outcomes)).tolist()
        test = chi_square_test(dict(zip(outcomes, counts)), expected)
        rejected += test.p_value < alpha
    return rejected / trials


def assert_distribution_equivalent(
    generator,
    model,
    prompt: Sequence[int],
    max_new_tokens: int,
    *,
    rows: int,
    alpha: float = 1e-3,
    seed: int | None = None,
    max_rows: int | None = None,
    **sampling,
):
    """Draw ``rows`` continuations of ``prompt`` with ``generator`` (one call with ``rows``
    identical prompts, ``do_sample=True``, ``**sampling``: temperature, top_k, top_p, min_p,
    repetition_penalty, frequency_penalty, presence_penalty; at most ``max_rows`` of them at
    once, the others admitted as rows finish) and test them against
    :func:`exact_distribution` of ``model`` (the main model) with :func:`chi_square_test`:
    the whole continuations, and each new token's and each adjacent pair's distribution (a
    wrong draft position moves the continuations' mass by little when they are many, most
    pooled into one cell: ``V**L`` outcomes at ``rows`` samples; it moves its own position's
    by much). Raises ``AssertionError`` naming the test that rejects, its statistic, degrees
    of freedom and p-value.

    False alarms: a lossless generator fails with probability at most ``alpha`` (1e-3)
    for a random seed: each of the ``m`` tests runs at ``alpha / m`` (Bonferroni; ``m =
    2L`` for ``L >= 3`` new tokens); a fixed ``seed`` makes the outcome deterministic.

    Power: the statistic under an alternative distribution ``q`` is approximately
    noncentral chi-square with noncentrality ``rows * sum((q - p)**2 / p)``. Stated case
    for the whole continuations' test (checked by the tests with
    :func:`chi_square_power`): 125 equally likely outcomes (vocabulary 5, 3 tokens),
    ``rows=4000``, at the level it runs at here (``1e-3 / 6``): an alternative that
    makes half the outcomes 20% more likely and half 20% less (total variation 0.1) is
    detected with probability > 0.99; at total variation 0.05 (10% more / less) only
    ~0.12, and ~0.73 with ``rows=8000``. Generators that keep drafts they should
    reject, sample the correction from the wrong distribution, drop the bonus token or
    report a draft position's probabilities wrongly move far more mass than that, at
    their position, on models with disagreeing drafts.

    Every row must generate exactly ``max_new_tokens`` tokens (no eos, no stop strings).
    Draft positions: a step drafts at most ``max_new_tokens - 2`` tokens (the prefill
    makes the first, a verify pass adds one past its drafts), so drafts of ``k`` tokens
    are tested whole only with ``max_new_tokens >= k + 2``. When the test passes and the
    run's longest draft reached that ceiling, 4 rows with 8 more tokens are drawn (the
    generator's policy and drafter see them); if they draft deeper, a ``UserWarning`` says
    which draft positions went untested.
    Returns the :class:`ChiSquare` result.
    """
    _check_generator("assert_distribution_equivalent()", generator, main=False)
    where = "assert_distribution_equivalent()"
    if isinstance(rows, bool) or not isinstance(rows, numbers.Integral) or rows < 1:
        raise ValueError(f"{where}: rows={rows!r}; expected an int >= 1 (samples to draw)")
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real) or not 0 < alpha < 1:
        raise ValueError(  # alpha=0 (or NaN) would pass any generator, alpha >= 1 fail any
            f"{where}: alpha={alpha!r}; expected a false-alarm rate with 0 < alpha < 1 "
            "(the default 1e-3)"
        )
    if "do_sample" in sampling:
        raise ValueError(f"{where} draws samples: drop do_sample={sampling['do_sample']!r}")
    if sampling.get("n") is not None:
        raise ValueError(f"{where} draws rows of one prompt already: drop n={sampling['n']!r}")
    # the warping the generator applies: explicit arguments, else its config's defaults
    defaults = getattr(generator, "generate_defaults", None) or {}
    keys = ("temperature", "top_k", "top_p", "min_p")
    for key in (*keys, *PENALTIES):
        if sampling.get(key) is None and defaults.get(key) is not None:  # None: not given
            sampling[key] = defaults[key]
    res = generator.generate(
        [list(prompt)] * rows,
        max_new_tokens=max_new_tokens,
        do_sample=True,
        seed=seed,
        max_rows=max_rows,
        **sampling,
    )
    short = [i for i, s in enumerate(res.sequences) if len(s) != max_new_tokens]
    if short:
        raise AssertionError(
            f"row {short[0]} has {len(res.sequences[short[0]])} tokens, not {max_new_tokens}: "
            "the test needs every row to run to max_new_tokens (no eos, no stop strings)"
        )
    exact = exact_distribution(model, prompt, max_new_tokens, **sampling)
    seqs = [tuple(s) for s in res.sequences]
    tests = {"the continuations": chi_square_test(Counter(seqs), exact)}
    for name, cut in _views(max_new_tokens):  # each position, each adjacent pair
        with contextlib.suppress(ValueError):  # too few rows for this view: the joint's
            tests[name] = chi_square_test(Counter(map(cut, seqs)), _marginal(exact, cut))
    level = alpha / len(tests)  # Bonferroni: a lossless generator fails w.p. <= alpha
    worst = min(tests, key=lambda name: tests[name].p_value)
    if tests[worst].p_value < level:
        test = tests[worst]
        raise AssertionError(
            f"the generator's {rows} continuations do not follow the main model's "
            f"distribution: {worst}: chi-square {test.statistic:.1f} on {test.df} degrees of "
            f"freedom, p = {test.p_value:.3g} < alpha = {alpha:g} over {len(tests)} tests "
            f"({level:.3g} each)"
        )
    _warn_if_vacuous("assert_distribution_equivalent()", generator, res)
    _warn_if_drafts_were_cut(generator, res, prompt, max_new_tokens, seed, sampling)
    return tests["the continuations"]


def _views(length: int) -> list:
    """``(name, cut)`` of the parts of a continuation of ``length`` tokens that are tested
    beside the whole: each position's token and each adjacent pair's (where that is not
    the whole). A bug at one position moves the continuations' mass by little when their
    outcomes are many (most are then pooled into one cell); it moves its position's by
    much, over a few cells well filled."""
    if length < 2:
        return []
    views = [(f"new token {i + 1}", operator.itemgetter(i)) for i in range(length)]
    if length >= 3:
        views += [
            (f"new tokens {i + 1}-{i + 2}", operator.itemgetter(i, i + 1))
            for i in range(length - 1)
        ]
    return views


def _marginal(exact: Mapping, cut) -> dict:
    """The exact distribution of ``cut(continuation)``."""
    out: dict = {}
    for seq, p in exact.items():
        key = cut(seq)
        out[key] = out.get(key, 0.0) + p
    return out


def _deepest(res) -> int:
    """The longest draft any row of any step of ``res`` made (0: none, or no statistics;
    the lengths a policy asked for are no drafts: a drafter may make fewer)."""
    steps = getattr(getattr(res, "stats", None), "steps", None) or []
    return max((max(s.drafted_list(), default=0) for s in steps), default=0)


def _warn_if_drafts_were_cut(generator, res, prompt, max_new_tokens, seed, sampling) -> None:
    """A ``UserWarning`` when ``max_new_tokens`` left no room for drafts the generator
    makes given more (their later tokens went untested). Advisory, after a passed test: a
    probe that cannot run (no room in the model's context, a KV budget sized for the test)
    says nothing."""
    deepest = _deepest(res)
    if deepest < max_new_tokens - 2:  # nothing was cut
        return
    try:
        more = generator.generate(
            [list(prompt)] * 4, max_new_tokens=max_new_tokens + 8, do_sample=True, seed=seed,
            **sampling,
        )  # fmt: skip
    except Exception:  # the probe is advisory: the test itself passed
        return
    if _deepest(more) > deepest:
        warnings.warn(
            f"max_new_tokens={max_new_tokens} leaves room for drafts of {max(deepest, 0)} "
            f"token(s) at most, and the generator drafts {_deepest(more)} given more: draft "
            f"tokens past position {deepest} were not tested; pass max_new_tokens >= k + 2 "
            "to test drafts of k tokens whole",
            UserWarning,
            stacklevel=3,
        )
