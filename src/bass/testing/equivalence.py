"""Greedy and seeded-sampling equivalence, token for token; the references:
docs/reference/testing.md ("Greedy and seeded sampling")."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Sequence

import torch

from ..batch_state import PromptError, as_prompts, check_prompts
from ..compat import attn_implementation
from ..hf import attention_restored
from ..options import check_keywords
from ..repetition import PENALTIES, occurrences, penalize

__all__ = ["assert_greedy_equivalent", "assert_sampled_equivalent", "greedy_reference"]


@contextlib.contextmanager
def _own_attention(model):
    """The model with a transformers attention implementation (bass's needs lengths that
    only bass passes); restored afterwards."""
    with attention_restored([model]):
        if attn_implementation(model) == "bass":
            model.set_attn_implementation("sdpa")
        yield model


def _check_generator(where: str, generator, main: bool = True) -> None:
    """A bass.Generator (or an object like it: with ``main`` when the check needs it),
    not a bare model."""
    if isinstance(generator, torch.nn.Module) or (main and not hasattr(generator, "main")):
        raise TypeError(
            f"{where} takes a bass.Generator (an object with generate() and .main), got "
            f"{type(generator).__name__}: wrap the model, e.g. bass.Generator(model, 'ngram')"
        )


def _check_no_n(where: str, kwargs) -> None:
    """The checks compare one row per prompt: ``n`` (samples per prompt) is refused."""
    if kwargs.get("n") is not None:
        raise ValueError(
            f"{where} checks one row per prompt: drop n={kwargs['n']!r} and repeat the "
            "prompts (with row_ids=[bass.sampling.row_key(i, j) ...] for n's keys)"
        )


def _check_row_count(res, prompts) -> None:
    if len(res.sequences) != len(prompts):
        raise AssertionError(
            f"the generator returned {len(res.sequences)} rows for {len(prompts)} prompts"
        )


def _warn_if_vacuous(where: str, generator, res) -> None:
    """A ``UserWarning`` when a generator that drafts (a drafter set) passed a check
    without making one draft token where it had room to (a row of 3 tokens or more): the
    check then compared plain decoding and says nothing of the drafter or the policy a
    user meant to prove exact. (How many drafts were accepted: ``res.stats``.)"""
    stats = getattr(res, "stats", None)
    if getattr(generator, "drafter", None) is None or stats is None:
        return
    # the tokens drafted, not the lengths the policy allowed (a drafter may make none)
    made = getattr(stats, "drafted_tokens", None)  # (a generator of another kind: unknown)
    if made is None or made > 0 or max(map(len, res.sequences), default=0) < 3:
        return
    warnings.warn(
        f"{where} passed, but no draft token was made: only plain decoding was checked; "
        "to test the drafts, make some (prompts that repeat for n-grams, policy='constant' "
        "with k >= 1, longer rows)",
        UserWarning,
        stacklevel=3,
    )


def _check_prompt(where: str, model, prompt, max_new_tokens: int) -> list[int]:
    """``prompt`` checked as ``generate()`` checks its prompts (:mod:`bass.batch_state`:
    token ids, at least one, within the vocabulary and the model's context)."""
    try:
        (prompt,) = as_prompts([prompt])
        check_prompts([prompt], max_new_tokens, [model])
    except PromptError as exc:
        raise ValueError(f"{where}: {exc.naming('the prompt')}") from None
    except TypeError as exc:
        raise TypeError(f"{where}: {exc}") from None
    return prompt


def _cut(tokens: list[int], eos, stop_sequences, stop_strings, tokenizer) -> list[int]:
    end = len(tokens)
    eos = {eos} if isinstance(eos, int) else set(eos or ())
    for i, t in enumerate(tokens):
        if t in eos:
            end = min(end, i + 1)
            break
    for seq in stop_sequences or ():
        seq = list(seq)
        for i in range(len(tokens) - len(seq) + 1):
            if tokens[i : i + len(seq)] == seq:
                end = min(end, i + len(seq))
                break
    if stop_strings:
        stops = [stop_strings] if isinstance(stop_strings, str) else list(stop_strings)
        for i in range(1, end + 1):  # the first prefix whose text holds a stop string
            text = tokenizer.decode(tokens[:i], skip_special_tokens=True)
            if any(s in text for s in stops):
                end = i
                break
    return tokens[:end]


@torch.inference_mode()
def greedy_reference(
    model,
    prompt: Sequence[int],
    max_new_tokens: int,
    *,
    eos_token_id=None,
    stop_sequences=None,
    stop_strings=None,
    tokenizer=None,
    repetition_penalty=None,
    frequency_penalty=None,
    presence_penalty=None,
) -> list[int]:
    """The main model's own greedy continuation of ``prompt`` alone, cut where a row of
    bass must stop (docs/reference/testing.md, "Greedy and seeded sampling"); penalised
    as bass penalises it: ``repetition_penalty`` by transformers' own processor, the
    frequency and presence penalties by a processor of the new tokens' counts."""
    from transformers import GenerationConfig, LogitsProcessorList

    prompt = _check_prompt("greedy_reference()", model, prompt, max_new_tokens)
    pen = check_keywords(
        "greedy_reference()", repetition_penalty=repetition_penalty,
        frequency_penalty=frequency_penalty, presence_penalty=presence_penalty,
    )  # fmt: skip
    ids = torch.tensor([prompt], device=model.device)
    # transformers fills every field a GenerationConfig leaves unset from the model's own
    # (eos, repetition_penalty, ...): swap in a blank one so this is plain greedy decoding
    # with no eos (the cut below applies the caller's stopping rules)
    saved = model.generation_config
    model.generation_config = GenerationConfig()
    try:
        with _own_attention(model):
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=max_new_tokens,
                eos_token_id=None,
                pad_token_id=0,
                repetition_penalty=pen["repetition_penalty"],
                logits_processor=LogitsProcessorList([_NewTokenPenalties(len(prompt), **pen)]),
            )
    finally:
        model.generation_config = saved
    tokens = out[0, ids.shape[1] :].tolist()
    if len(tokens) != max_new_tokens:
        raise RuntimeError(
            f"transformers' generate stopped after {len(tokens)} of {max_new_tokens} tokens "
            "(a stopping rule of the model's generation config?): cannot compare"
        )
    return _cut(tokens, eos_token_id, stop_sequences, stop_strings, tokenizer)


class _NewTokenPenalties:
    """A transformers logits processor: the frequency and presence penalties of the tokens
    after the first ``start`` (:func:`bass.repetition.penalize`), after transformers' own
    repetition penalty (custom processors come after its own)."""

    def __init__(self, start: int, frequency_penalty, presence_penalty, **_):
        self.start, self.frequency = start, frequency_penalty or 0.0
        self.presence = presence_penalty or 0.0

    def __call__(self, input_ids, scores):
        if not (self.frequency or self.presence):
            return scores
        counts = occurrences(input_ids[:, self.start :], scores.shape[-1])
        return penalize(scores, None, None, counts, self.frequency, self.presence)


def _first_difference(got: list[int], want: list[int], other: str = "main model alone") -> str:
    for i, (a, b) in enumerate(zip(got, want)):
        if a != b:
            return f"first difference at new token {i}: generator {a}, {other} {b}"
    if len(got) < len(want):
        return (
            f"the generator stopped after {len(got)} tokens; the {other} goes on "
            f"with {want[len(got)]} (to {len(want)} tokens)"
        )
    return (
        f"the generator went on after {len(want)} tokens with {got[len(want)]} "
        f"(to {len(got)}); the {other} stops there"
    )


def assert_greedy_equivalent(generator, prompts, max_new_tokens: int, **generate_kwargs):
    """Run ``generator.generate(prompts, max_new_tokens=..., **generate_kwargs)`` greedily
    and check every row against ``generator.main`` decoding that prompt alone.

    ``eos_token_id``, ``stop_sequences``, ``stop_strings`` and ``tokenizer`` in
    ``generate_kwargs`` shape the reference as they must shape bass's rows. Raises
    ``AssertionError`` naming the row (prompt index), the first differing position and
    both tokens. Returns the generator's :class:`bass.GenerationResult`.

    Example (any drafter or policy of yours in place of ``"ngram"``)::

        gen = bass.Generator(main, "ngram", policy=MyPolicy())
        bass.testing.assert_greedy_equivalent(gen, [[1, 2, 3], [4, 5]], 16)
    """
    _check_generator("assert_greedy_equivalent()", generator)
    if generate_kwargs.get("do_sample"):
        raise ValueError("assert_greedy_equivalent checks greedy decoding: drop do_sample")
    _check_no_n("assert_greedy_equivalent()", generate_kwargs)
    # what the generator will apply: explicit arguments, else its config file's defaults
    defaults = getattr(generator, "generate_defaults", None) or {}
    kw = dict(generate_kwargs)
    if kw.get("do_sample") is None and not defaults.get("do_sample"):
        kw["do_sample"] = False  # greedy, said (a model whose generation_config samples)
    res = generator.generate(prompts, max_new_tokens=max_new_tokens, **kw)
    _check_row_count(res, prompts)
    keys = ("eos_token_id", "stop_sequences", "stop_strings", "tokenizer", *PENALTIES)
    # (None: not given, the config's applies, as in generate)
    given = {k: v for k, v in generate_kwargs.items() if v is not None}
    ref_kw = {k: given.get(k, defaults.get(k)) for k in keys}
    if defaults.get("do_sample") and "do_sample" not in generate_kwargs:
        raise ValueError("the generator's config samples: pass do_sample=False to check it")
    for i, (prompt, got) in enumerate(zip(prompts, res.sequences)):
        want = greedy_reference(generator.main, prompt, max_new_tokens, **ref_kw)
        if list(got) != want:
            raise AssertionError(
                f"row {i} (prompt of {len(prompt)} tokens) differs from the main model's own "
                f"greedy decoding: {_first_difference(list(got), want)}"
            )
    _warn_if_vacuous("assert_greedy_equivalent()", generator, res)
    return res


def assert_sampled_equivalent(
    generator, prompts, max_new_tokens: int, *, seed: int | None = 0, **generate_kwargs
):
    """Sampled generation equals plain sampled decoding (``draft=None``) of the same main
    model with the same seed, token for token, with deterministic drafts or a draft
    model's coupled drafts (``draft_sampling="coupled"``, the default): why, and why on
    float64 models, docs/concepts/exactness.md.

    Runs ``generator.generate(prompts, max_new_tokens=..., do_sample=True, seed=seed,
    **generate_kwargs)`` and the plain decoding (``seed=None``: one seed drawn from torch's
    global generator for both, named if they differ); raises ``AssertionError`` naming the row,
    the first differing position and both tokens. A generator with
    ``draft_sampling="rejection"`` and a sampling drafter raises ``ValueError``: its drafts
    are verified by rejection sampling, exact in distribution
    (:func:`bass.testing.assert_distribution_equivalent`) but not draw for draw. Returns
    the generator's :class:`bass.GenerationResult`. The plain decoding runs the generator's
    own ``attention``: this judges the speculation, not the attention implementation
    (:func:`assert_greedy_equivalent` and the op oracles check kernels).
    """
    from ..engine import Generator

    _check_generator("assert_sampled_equivalent()", generator)
    drafter = generator.drafter
    coupled = getattr(generator, "coupled", True)
    if drafter is not None and not drafter.deterministic and not coupled:
        raise ValueError(
            "assert_sampled_equivalent needs coupled or deterministic drafts; with "
            f"draft_sampling='rejection' {type(drafter).__name__}'s sampled drafts are "
            "verified by rejection sampling, exact in distribution only: use "
            "assert_distribution_equivalent (or the default draft_sampling='coupled')"
        )
    if generate_kwargs.get("do_sample") is False:
        raise ValueError("assert_sampled_equivalent checks sampling: drop do_sample=False")
    _check_no_n("assert_sampled_equivalent()", generate_kwargs)
    if seed is None:  # one seed for both runs (None: each would draw its own)
        seed = int(torch.randint(0, 2**62, (1,)).item())
    kw = {**generate_kwargs, "do_sample": True, "seed": seed}
    res = generator.generate(prompts, max_new_tokens=max_new_tokens, **kw)
    plain = Generator(generator.main, None, attention=generator.attention)
    plain.generate_defaults = dict(getattr(generator, "generate_defaults", None) or {})
    want = plain.generate(prompts, max_new_tokens=max_new_tokens, **kw).sequences
    _check_row_count(res, prompts)
    for i, (got, ref) in enumerate(zip(res.sequences, want)):
        if list(got) != list(ref):
            diff = _first_difference(list(got), list(ref), "plain sampled decoding")
            raise AssertionError(
                f"row {i} differs from plain sampled decoding with seed {seed}: {diff}"
            )
    _warn_if_vacuous("assert_sampled_equivalent()", generator, res)
    return res
