"""The host-side state of a generation's rows (:class:`BatchState`), and what happens when
a model's logits cannot be trusted (:class:`NonFiniteLogitsError`)."""

from __future__ import annotations

from collections.abc import Sequence
from numbers import Integral

from . import hf
from .sampling import position_keys
from .stopping import CONTEXT_TOKENS, StopStrings

__all__ = [
    "BatchState",
    "NonFiniteLogitsError",
    "PromptError",
    "as_prompts",
    "check_prompts",
    "raise_if_nonfinite",
]


class _NamesAPrompt:
    """An error about one prompt of a ``generate`` call: ``prompt`` is its index there, and
    :meth:`naming` says the same with the prompt named otherwise (the command line names it
    by its line in the prompts file)."""

    def __init__(self, before: str, prompt: int, after: str):
        self.prompt, self._parts = prompt, (before, after)
        super().__init__(self.naming(f"prompt {prompt}"))

    def naming(self, name: str) -> str:
        """The message with ``name`` where it says ``prompt <index>``."""
        before, after = self._parts
        return f"{before}{name}{after}"

    def at(self, prompt: int):
        """The same error about the prompt at index ``prompt`` of a larger call (a shard's
        prompt in the whole job's numbering)."""
        return type(self)(self._parts[0], prompt, self._parts[1])


class PromptError(_NamesAPrompt, ValueError):
    """A prompt that cannot be generated from (empty, ids outside the vocabulary, longer
    than a model's context with ``max_new_tokens``)."""


class NonFiniteLogitsError(_NamesAPrompt, RuntimeError):
    """A model produced NaN or infinite logits: its output cannot be trusted."""


def raise_if_nonfinite(flags: list[int], model, which: str, prompts: list[int], where: str):
    bad = [prompts[r] for r, f in enumerate(flags) if f]
    if bad:
        raise NonFiniteLogitsError(
            f"the {which} model ({model if isinstance(model, str) else hf.model_name(model)}) "
            "produced non-finite logits (NaN or "
            "Inf) for ",
            bad[0],
            (f" (and {len(bad) - 1} more rows)" if len(bad) > 1 else "")
            + f" at {where}; this is usually a float16 overflow or a broken checkpoint: "
            "load the model in bfloat16 or float32, or check its weights",
        )


class BatchState:
    """Host-side state of a generation, by prompt and by slot (a row of the caches; terms:
    docs/concepts/engine.md): slot ``s`` holds prompt ``prompt_of[s]`` (``-1``: free).

    ``seqs[s]`` (prompt + committed tokens) is the same list object as
    ``by_prompt[prompt_of[s]]``, which outlives its slot (the n-gram drafter searches
    finished siblings' text too). The main cache's length follows from the rows
    (:meth:`cache_lens`); a draft cache's is kept in ``draft_lens[s]``. ``finished``
    collects the prompts that ended since the engine last handed them over.
    """

    def __init__(
        self,
        prompts: list[list[int]],
        max_new: int,
        eos: set[int],
        stops: list[tuple] = (),
        texts: StopStrings | None = None,
        *,
        slots: int,
        row_ids: list[int] | None = None,
        logprobs: bool = False,
        prompt_logprobs: bool = False,
    ):
        self.by_prompt = prompts  # prompt + committed tokens, per prompt
        self.seqs: list[list[int]] = [[] for _ in range(slots)]  # per slot: its prompt's list
        self.prompt_of = [-1] * slots  # per slot: its prompt index (-1: free)
        self.draft_lens = [0] * slots  # per slot: the draft cache's length
        self.done = [True] * slots  # per slot: nothing to generate (finished or free)
        self.outputs: list[list[int]] = [[] for _ in prompts]  # per prompt
        self.reasons: list[str | None] = [None] * len(prompts)  # per prompt, once finished
        # per prompt: what keys its sampled draws; its new tokens' log-probabilities
        self.row_ids = list(range(len(prompts))) if row_ids is None else row_ids
        self.logprobs = [[] for _ in prompts] if logprobs else None
        self.prompt_logprobs = [None] * len(prompts) if prompt_logprobs else None  # prefilled
        self.finished: list[int] = []  # prompts ended since last handed over (in order)
        self.prompt_hash: dict[int, int] = {}  # per admitted prompt: its tokens' hash
        # per slot of the latest admission wave whose prompt a running row holds: that
        # row's slot (its cache rows' prompt positions are copied: bass.scheduler)
        self.copied: dict[int, int] = {}
        self.tokens = 0  # the new tokens of the rows handed over
        self.max_new, self.eos, self.stops, self.texts = max_new, eos, stops, texts

    def admit(self, s: int, p: int) -> None:
        """Prompt ``p`` (waiting) takes free slot ``s``: its caches' rows are refilled by
        the caller's prefill; nothing is allocated."""
        self.seqs[s], self.prompt_of[s] = self.by_prompt[p], p
        self.prompt_hash[p] = hash(tuple(self.by_prompt[p]))
        self.draft_lens[s], self.done[s] = 0, False

    def free(self) -> list[int]:
        """Slots whose rows have finished (or never held one): admission refills them."""
        return [s for s, d in enumerate(self.done) if d]

    def start(self, s: int) -> int:
        """The prompt tokens slot ``s``'s caches hold before its prefill: its prompt but
        the last token where another row's were copied (:attr:`copied`), else none."""
        return len(self.seqs[s]) - 1 if s in self.copied else 0

    def copies(self) -> tuple[list[int], list[int], int]:
        """``(sources, slots, length)`` of :attr:`copied`, as
        :meth:`bass.cache.RaggedKVCache.copy_prefix` takes them."""
        dst = list(self.copied)
        return [self.copied[s] for s in dst], dst, max(self.start(s) for s in dst)

    def cache_lens(self) -> list[int]:
        """The main cache's committed length of every slot: all of an active row's
        tokens but the newest, which is chosen but not yet fed (the engine's invariant;
        a finished or free row brings no more tokens, so its value is never read)."""
        return [max(len(s) - 1, 0) for s in self.seqs]

    def active(self) -> list[int]:
        """The active rows: slots still generating, ascending."""
        return [s for s, d in enumerate(self.done) if not d]

    def keys(self, seed: int, slots: list[int], width: int, first: bool = False) -> list[int]:
        """The sampling keys of each slot's next ``width`` positions, row-major
        (:func:`bass.sampling.position_keys` of its row id; ``first``: from position 0)."""
        prompts = [self.prompt_of[s] for s in slots]
        starts = [0 if first else len(self.outputs[p]) for p in prompts]
        return position_keys(seed, [self.row_ids[p] for p in prompts], starts, width)

    def _stopped(self, out: list[int]) -> bool:
        return any(len(out) >= len(s) and tuple(out[-len(s) :]) == s for s in self.stops)

    def remaining(self, s: int) -> int:
        return self.max_new - len(self.outputs[self.prompt_of[s]])

    def finish(self, s: int, reason: str) -> None:
        """Slot ``s``'s row ends with ``reason`` (eos, stop, length, time)."""
        p = self.prompt_of[s]
        self.reasons[p] = reason
        self.done[s] = True
        self.prompt_hash.pop(p, None)  # (only running rows' prompts are shared)
        self.finished.append(p)
        if self.texts is not None:  # its stop-string window: not kept past the row
            self.texts.rows.pop(p, None)

    def append(self, slots: list[int], new: list[list[int]], logprobs=None) -> None:
        """Append each given row's accepted tokens (and their log-probabilities, where
        kept), cutting after the first that ends it (eos, a stop sequence, a stop string,
        ``max_new``)."""
        for r, (s, toks) in enumerate(zip(slots, new, strict=True)):
            p = self.prompt_of[s]
            out = self.outputs[p]
            before = len(out)
            reason = None
            for t in toks[: self.remaining(s)]:
                out.append(t)
                self.seqs[s].append(t)
                if t in self.eos or (self.stops and self._stopped(out)):
                    reason = "eos" if t in self.eos else "stop"
                    break
            if self.texts is not None:
                n = len(self.seqs[s]) - len(out)  # the prompt's length; its tail decodes first
                head = self.seqs[s][max(0, n - CONTEXT_TOKENS) : n]
                keep = self.texts.check(p, out, len(out) - before, head)
                if keep is not None:  # a stop string: drop what the step accepted after it
                    drop = len(out) - before - keep
                    if drop:
                        del out[-drop:], self.seqs[s][-drop:]
                    reason = "stop"
            if self.logprobs is not None:
                self.logprobs[p] += logprobs[r][: len(out) - before]
            if reason is None and len(out) >= self.max_new:
                reason = "length"
            if reason is not None:
                self.finish(s, reason)

    def results(self, keep: bool) -> dict:
        """A :class:`bass.GenerationResult`'s rows (``keep`` false, a stream's: none)."""
        return {
            "sequences": self.outputs if keep else [],
            "finish_reasons": list(self.reasons),
            "logprobs": self.logprobs if keep else None,
            "prompt_logprobs": self.prompt_logprobs if keep else None,
        }

    def compact(self, keep: list[int]) -> None:
        """Slots ``keep`` (ascending) become slots ``0..len(keep)-1``."""
        self.seqs = [self.seqs[s] for s in keep]
        self.prompt_of = [self.prompt_of[s] for s in keep]
        self.draft_lens = [self.draft_lens[s] for s in keep]
        self.done = [self.done[s] for s in keep]


def as_prompts(prompts) -> list[list[int]]:
    """``prompts`` as lists of Python ints: a list (or tuple) of token-id sequences, each a
    list, a tuple, or a 1-D tensor or array of integers. Anything else is refused with what
    to pass instead (a padded 2-D batch would feed its padding as text)."""
    if isinstance(prompts, (str, bytes)):
        raise TypeError("prompts must be a list of token-id lists; for text use generate_text")
    if hasattr(prompts, "ndim") and hasattr(prompts, "tolist"):  # a tensor or an array
        if prompts.ndim == 1:
            raise TypeError(
                f"prompts must be a list of token-id lists, got a 1-D {type(prompts).__name__}; "
                "for one prompt pass [ids]"
            )
        raise TypeError(
            f"prompts must be a list of token-id lists, got a {prompts.ndim}-D "
            f"{type(prompts).__name__}: a padded batch would feed its padding as text; pass "
            "each prompt's own ids, e.g. tokenizer(texts)['input_ids']"
        )
    if not isinstance(prompts, Sequence):
        encoded = hasattr(prompts, "keys") and "input_ids" in prompts  # BatchEncoding
        hint = "; pass its ['input_ids'] (unpadded)" if encoded else ""
        raise TypeError(
            f"prompts must be a list of token-id lists, got {type(prompts).__name__}{hint}"
        )
    out = []
    for i, p in enumerate(prompts):
        if isinstance(p, (str, bytes)):
            raise TypeError(f"prompt {i} is a string; token ids are expected (for text use "
                            "generate_text)")  # fmt: skip
        if isinstance(p, Integral):
            raise TypeError(
                "prompts must be a list of token-id lists, got a flat list of ints; for one "
                "prompt pass [ids]"
            )
        if getattr(getattr(p, "device", None), "type", None) == "meta":
            raise TypeError(
                f"prompt {i} is a tensor on the meta device: it holds no token ids; pass a "
                "tensor with values (on any real device) or a list of ints"
            )
        if hasattr(p, "tolist") and getattr(p, "ndim", 1) == 1:
            p = p.tolist()
        if hasattr(p, "ndim") and hasattr(p, "tolist"):  # a tensor or array, not 1-D
            raise TypeError(
                f"prompt {i} is a {p.ndim}-D {type(p).__name__} of shape {tuple(p.shape)}; a "
                "prompt is a 1-D sequence of token ids (from a [1, n] tensor: pass t[0])"
            )
        if not isinstance(p, Sequence):
            raise TypeError(f"prompt {i} must be a sequence of token ids, got {type(p).__name__}")
        bad = [t for t in p if isinstance(t, bool) or not isinstance(t, Integral)]
        if bad and all(getattr(t, "ndim", None) == 0 for t in bad):  # list(tensor): 0-D ones
            p = [t.tolist() if getattr(t, "ndim", None) == 0 else t for t in p]
            bad = [t for t in p if isinstance(t, bool) or not isinstance(t, Integral)]
        if bad:
            raise TypeError(f"prompt {i} has token ids that are not integers: {bad[:5]}")
        out.append([int(t) for t in p])
    return out


def check_prompts(prompts: list[list[int]], max_new_tokens: int, models) -> int:
    """Refuse bad input before any work (``prompts`` as :func:`as_prompts` returns them):
    no prompts, empty ones, ids outside the vocabulary, ``max_new_tokens < 1``, prompt +
    ``max_new_tokens`` past a model's context. Returns the longest prompt +
    ``max_new_tokens``."""
    if len(prompts) == 0:
        raise ValueError("prompts is empty: pass at least one token-id list")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    # the main model embeds the prompts (a draft with fewer rows, a padded vocabulary's,
    # is fed 0 for the ids it has no row for, as for such ids the main model generates)
    vocab = models[0].get_input_embeddings().weight.shape[0]
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise PromptError("", i, " is empty; every prompt needs at least one token")
        bad = [t for t in p if not 0 <= t < vocab]
        if bad:
            raise PromptError(
                "",
                i,
                f" has token ids outside [0, {vocab}): {bad[:5]}, the ids the model embeds "
                "(from text: tokenize it with the model's own tokenizer)",
            )
    need = max(len(p) for p in prompts) + max_new_tokens
    for k, model in enumerate(models):
        limit = getattr(model.config.get_text_config(), "max_position_embeddings", None)
        # the positions fed: need - 1 (a row's last new token is never fed back)
        if limit is not None and 0 < limit < need - 1:  # XLNet's -1: no limit
            longest = max(range(len(prompts)), key=lambda i: len(prompts[i]))
            raise PromptError(
                "",
                longest,
                f" ({len(prompts[longest])} tokens) + max_new_tokens ({max_new_tokens}) = "
                f"{need} exceeds the {'draft' if k else 'main'} model {hf.model_name(model)}'s "
                f"context of {limit} positions (plus the last new token, which is never fed "
                "back); shorten the prompt or lower max_new_tokens"
                + (" (or use a draft model with a longer context)" if k else ""),
            )
    return need
