"""Draft sources: a small draft model (:class:`ModelDrafter`), n-gram prompt lookup
(:class:`NGramDrafter`) and the loader of drafters other packages register under the
entry-point group ``bass.drafters``. How to use, write and prove one: docs/guides/drafters.md.
"""

from __future__ import annotations

import importlib.metadata
import time
import warnings
import weakref
from collections.abc import Iterable, Sequence

import torch

from . import hf, plugins
from .cache import RaggedKVCache
from .errors import PluginError, PluginLoadError
from .hooks import Drafter, Offer, Proposal, StepView
from .passes import Passes
from .sampling import sample, sample_keyed, warp_probs

__all__ = [
    "GROUP",
    "Drafter",
    "DrafterLoadError",
    "ModelDrafter",
    "NGramDrafter",
    "Offer",
    "Proposal",
    "StepView",
    "available",
    "make_drafter",
    "nonfinite",
]

GROUP = "bass.drafters"


def nonfinite(logits: torch.Tensor) -> torch.Tensor:
    """bool ``[...]``: positions of ``logits`` ``[..., V]`` that are unusable: any NaN or
    +Inf, or every logit -Inf (a single -Inf is a masked token and fine). One reduction
    (``amax`` propagates NaN) and no host sync."""
    return ~torch.isfinite(logits.amax(dim=-1))


class ModelDrafter(Drafter):
    """Drafting with a small causal LM that shares the main model's vocabulary.

    ``tokens``: the ids the draft may propose (default: all of its logits) and
    ``out_vocab``: the width of the distributions it hands the verifier (the main model's
    logits; default: its own): they differ for padded embedding matrices
    (docs/guides/drafters.md, "Vocabularies"). Its cache holds ``seq[:draft_lens[slot]]``
    of each slot (the bookkeeping invariant, docs/concepts/engine.md).
    """

    name = "model"
    deterministic = False  # sampled drafts: coupled, or rejection sampling with `probs`

    def __init__(self, model, tokens: int | None = None, out_vocab: int | None = None):
        self.model = model
        rows = _vocab_size(model)
        self.tokens = rows if tokens is None else tokens
        self.out_vocab = rows if out_vocab is None else out_vocab
        self.in_vocab = model.get_input_embeddings().weight.shape[0]
        self.passes = Passes()
        self.cache: RaggedKVCache | None = None
        self.logits_slots: int | None = None  # static shapes: logits rows per pass
        self.pair = None  # make_drafter's: the main model and both models' vocab sizes

    def start(self, state, passes, max_len: int, device) -> int:
        """Allocate the draft cache, one row per slot (filled by :meth:`admit`)."""
        _check_unresized(self.pair)
        self.passes, self.state = passes, state
        slots = len(state.seqs)
        # static shapes (CUDA graphs): every pass computes the logits of all slots
        self.logits_slots = slots if passes.bucket is not None else None
        n_layers = self.model.config.get_text_config().num_hidden_layers
        self.cache = RaggedKVCache(slots, max_len, n_layers, device)
        self.prefill_passes = 0
        return 0

    def finish(self) -> None:
        self.cache = self.state = None  # the draft cache's memory goes back at once

    def admit(self, state, slots: list[int]) -> int:
        """Prefill the draft model with the prompts just placed in ``slots``."""
        prompts = [state.seqs[s] for s in slots]
        if self.in_vocab < self.out_vocab:  # main-model ids the draft cannot embed: fed as 0
            prompts = [[t if t < self.in_vocab else 0 for t in p] for p in prompts]
        copied = state.copied  # rows whose prompt a running row holds
        if any(s in copied for s in slots):
            self.cache.copy_prefix(*state.copies())
        starts = [len(p) - 1 if s in copied else 0 for s, p in zip(slots, prompts)]
        _, n = self.passes.prefill(self.model, self.cache, prompts, slots, starts=starts)
        for s, p in zip(slots, prompts):
            state.draft_lens[s] = len(p)
        self.prefill_passes += n
        return n

    def propose(self, view: StepView, lengths: list[int]) -> Proposal:
        """Draft for the active rows, at most ``lengths[r]`` tokens each: one packed pass
        per draft position over the rows still drafting."""
        slots, params, stop = view.slots, view.params, view.stop
        R, K = len(slots), max(lengths)
        device = self.cache.lens.device
        tokens = torch.zeros(R, K, dtype=torch.long, device=device)
        probs_out = None  # [R, K, V] for rejection sampling, allocated at the first pass
        conf_out = torch.zeros(R, K, device=device) if stop is not None else None
        survival = torch.ones(R, dtype=torch.float64, device=device)  # the early stop's
        bad = torch.zeros(R, dtype=torch.bool, device=device)
        drafted = [0] * R
        order = [r for r in range(R) if lengths[r] > 0]  # rows drafting this pass
        pen = view.penalty  # penalties: each draft reads its row and the drafts before it
        seen = None if pen is None else pen.rows(view.state, slots)
        # 1) the first pass feeds each drafting row's pending tokens (docs/concepts/engine.md,
        #    the invariant), in the cache's row order (active slots ascend)
        q_lens, lens = [0] * self.cache.batch_size, view.state.draft_lens
        ids: list[int] | torch.Tensor = []
        last: list[int] = []
        for r in order:
            s = slots[r]
            pending = view.state.seqs[s][lens[s] :]
            if self.in_vocab < self.out_vocab:  # a main-model id the draft cannot embed
                pending = [t if t < self.in_vocab else 0 for t in pending]
            q_lens[s] = len(pending)
            ids += pending
            last.append(len(ids) - 1)
        pass_tokens, fwd = [], 0.0
        for j in range(K):
            # 2) one packed draft pass over the rows still drafting (ids: on the host at
            #    first, then the device tensor of the tokens just drafted)
            t0 = time.perf_counter()
            batch = self.passes.pack(
                self.model,
                q_lens,
                lens,
                device,
                ids=None if j else ids,
                logits_at=last,
                logits_slots=self.logits_slots,
            )
            if j:
                batch.set_input_ids(ids)
            logits = self.passes.run(self.model, self.cache, batch)[: len(last)]  # [len(order), V]
            for s, n in enumerate(q_lens):  # the pass's tokens are in the cache (host lengths)
                lens[s] += n
            fwd += time.perf_counter() - t0
            pass_tokens.append(batch.tokens)
            index = torch.tensor(order, dtype=torch.long).to(device, non_blocking=True)
            if logits.shape[-1] > self.tokens:  # padding rows: never proposed
                logits = logits[..., : self.tokens]
            bad[index] |= nonfinite(logits)
            if seen is not None:
                logits = pen.drafts(logits, seen, index)
            if not params.do_sample:
                tok = logits.argmax(dim=-1)
                probs = torch.softmax(logits.float(), dim=-1) if stop is not None else None
            elif view.keys is not None:  # coupled: the keys of the positions they would take
                probs = warp_probs(logits, params)
                tok = sample_keyed(probs, view.keys[index, j])  # [len(order)]
            else:  # rejection sampling: what it drew from
                probs = warp_probs(logits, params)
                tok = sample(probs, view.generator)
                if probs_out is None:  # the main model's width (zero past the draft's)
                    probs_out = probs.new_zeros(R, K, self.out_vocab)
                probs_out[index, j, : probs.shape[-1]] = probs
            tokens[index, j] = tok
            if seen is not None:
                pen.drafted(seen, index, tok)
            ok = [True] * len(order)
            if stop is not None:  # the policy's early stop: a refused token is not proposed
                keep, conf = stop.keep(probs, survival, index)
                conf_out[index, j] = conf
                ok = view.agree(keep).tolist()  # host read (per draft pass, with a stop)
            nxt, sel = [], []
            for i, r in enumerate(order):
                if ok[i]:
                    drafted[r] += 1
                    if drafted[r] < lengths[r]:
                        nxt.append(r)
                        sel.append(i)
            if not nxt or j == K - 1:
                break
            # 3) rows still drafting feed the token they just drafted
            q_lens = [0] * self.cache.batch_size
            for r in nxt:
                q_lens[slots[r]] = 1
            ids = tok[torch.tensor(sel, dtype=torch.long).to(device, non_blocking=True)]
            order, last = nxt, list(range(len(nxt)))
        if probs_out is not None:
            # slots past a row's count are never read, but must hold a valid distribution
            probs_out[..., 0] += (probs_out.sum(-1) == 0).to(probs_out.dtype)
        return Proposal(
            drafted,
            tokens=tokens,
            probs=probs_out,
            bad=bad,
            confidence=conf_out,
            slots=list(slots),
            passes=len(pass_tokens),
            pass_tokens=tuple(pass_tokens),
            forward_seconds=fwd,
        )

    def commit(self, proposal: Proposal, accepted: list[int]) -> None:
        """The draft cache keeps, of what it was fed, the row's committed tokens and its
        accepted drafts (``len(seq) + a``, before the row appends them); a row that fed
        fewer keeps what it has."""
        lens, seqs = self.state.draft_lens, self.state.seqs
        for s, a in zip(proposal.slots, accepted, strict=True):
            lens[s] = min(lens[s], len(seqs[s]) + a)

    def compact(self, keep: list[int]) -> None:
        self.cache.compact(keep)


class NGramDrafter(Drafter):
    """Prompt-lookup drafting: no draft model.

    For each row, find the most recent earlier occurrence of the row's last ``n`` tokens
    (``n`` from ``max_ngram`` down to ``min_ngram``) in its prompt and text so far (and,
    with ``siblings``, in the text of up to ``max_siblings`` rows sharing its prompt:
    docs/guides/drafters.md), and propose the tokens that followed it.

    A per-row index from each token to its positions, kept up to date as rows grow, makes
    a lookup cost the occurrences of one token, not a scan of the row. Its state is kept
    per prompt (stable while slots are compacted away).
    """

    name = "ngram"
    deterministic = True
    max_lookup = 32  # the most tokens a lookup proposes per row and step

    def __init__(
        self, max_ngram: int = 3, min_ngram: int = 1, siblings: bool = True, max_siblings: int = 8
    ):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        if max_siblings < 0:
            raise ValueError(f"max_siblings must be >= 0, got {max_siblings}")
        self.max_ngram, self.min_ngram, self.siblings = max_ngram, min_ngram, siblings
        self.max_siblings = max_siblings

    def start(self, state, passes, max_len: int, device) -> int:
        """Index the rows of ``state`` (their prompts, before any token is generated)."""
        self.attach([tuple(s) for s in state.by_prompt], state.by_prompt)
        self.state, self.running = state, set()
        return 0

    def admit(self, state, slots: list[int]) -> int:
        """Rows joined. A group of equal prompts whose rows have all finished has its
        index dropped (no row searches it again): a long job holds the index of its
        running rows' groups, not of every row it ran."""
        for p in [p for p in self.running if state.reasons[p] is not None]:
            self.running.discard(p)
            g = self.group_of[p]
            self.left[g] -= 1
            if not self.left[g]:  # the group's last row: nothing searches its text again
                for m in self.members[g]:  # (a stream released the rows themselves)
                    self.index[m], self.indexed[m], self.seqs[m] = {}, 0, None
        self.running.update(state.prompt_of[s] for s in slots)
        return 0

    def finish(self) -> None:
        self.state = self.seqs = None  # the job's rows, and their index
        self.index, self.indexed, self.siblings_of, self.running = [], [], [], set()

    def attach(self, prompts: Sequence[Sequence[int]], seqs: list[list[int]]) -> None:
        """``seqs[p]``: prompt ``p``'s growing sequence (prompt + output), one list per
        prompt that the caller extends in place (what :meth:`start` does with the
        engine's rows; benchmarks call it on their own sequences)."""
        self.seqs = list(seqs)  # the rows' own lists, held while their group runs
        self.prompt_len = [len(p) for p in prompts]
        groups: dict[tuple, list[int]] = {}
        for p, prompt in enumerate(prompts):
            groups.setdefault(tuple(prompt), []).append(p)
        self.members = list(groups.values())  # equal prompts (a prompt's samples)
        self.group_of = [0] * len(prompts)
        self.left = [len(m) for m in self.members]  # rows of each group not yet finished
        # each row searches max_siblings siblings next to it in prompt order, so a batch of
        # thousands of copies of one prompt stays linear, not quadratic
        self.siblings_of: list[list[int]] = [[] for _ in prompts]
        m = self.max_siblings if self.siblings else 0
        for g, members in enumerate(self.members):
            for i, p in enumerate(members):
                self.group_of[p] = g
                lo = max(0, min(i - m // 2, len(members) - 1 - m))
                window = members[lo : lo + m + 1]
                self.siblings_of[p] = [o for o in window if o != p][:m]
        self.index: list[dict[int, list[int]]] = [{} for _ in prompts]
        self.indexed = [0] * len(prompts)

    def _search(self, p: int, suffix: list[int], k: int, lo: int, hi: int) -> list[int]:
        """The continuation after the most recent occurrence of ``suffix`` in
        ``seqs[p]`` that starts in ``[lo, hi)`` (up to ``k`` tokens; ``[]`` if none)."""
        seq, idx, n = self.seqs[p], self.index[p], len(suffix)
        if self.indexed[p] > len(seq):  # the row was cut (a stop string): rebuild
            idx.clear()
            self.indexed[p] = 0
        for i in range(self.indexed[p], len(seq)):  # index the tokens added since
            idx.setdefault(seq[i], []).append(i)
        self.indexed[p] = len(seq)
        for end in reversed(idx.get(suffix[-1], ())):
            start = end - n + 1
            if start >= hi:
                continue
            if start < lo:
                break
            if seq[start : end + 1] == suffix and end + 1 < len(seq):
                return seq[end + 1 : end + 1 + k]
        return []

    def lookup(self, p: int, k: int) -> tuple[list[int], int]:
        """Up to ``k`` draft tokens for prompt ``p``'s row and the matched suffix length."""
        seq = self.seqs[p]
        n_tok = len(seq)
        for n in range(min(self.max_ngram, n_tok - 1), self.min_ngram - 1, -1):
            suffix = seq[n_tok - n :]
            best = self._search(p, suffix, k, 0, n_tok - n)  # an earlier occurrence
            if len(best) < k:
                for o in self.siblings_of[p]:
                    # the shared prompt was searched in the row itself: only the
                    # sibling's own text (and matches reaching into it) is new
                    lo = max(0, self.prompt_len[o] - n + 1)
                    found = self._search(o, suffix, k, lo, len(self.seqs[o]))
                    if len(found) > len(best):
                        best = found
            if best:
                return best, n
        return [], 0

    def offer(self, view: StepView) -> Offer:
        """Look up every active row once (up to ``view.caps[r]`` tokens), for the policy;
        :meth:`propose` then truncates these continuations."""
        caps = [min(k, self.max_lookup) for k in view.caps]
        found = [self.lookup(p, k) if k > 0 else ([], 0) for p, k in zip(view.prompts, caps)]
        return Offer([f for f, _ in found], [n for _, n in found])

    def propose(self, view: StepView, lengths: list[int]) -> Proposal:
        offer = view.offer if view.offer is not None else self.offer(view)
        out = [f[:k] for f, k in zip(offer.tokens, lengths, strict=True)]
        return Proposal([len(o) for o in out], host_tokens=out, slots=list(view.slots))


# --------------------------------------------------------------------------- plugins


class DrafterLoadError(PluginLoadError):
    """A registered drafter's entry point could not be imported or is not a drafter
    (the original exception, if any, is chained)."""


def entry_points() -> Iterable[importlib.metadata.EntryPoint]:
    """The installed entry points of group ``bass.drafters`` (the test seam)."""
    return plugins.entry_points(GROUP)


def available() -> dict[str, importlib.metadata.EntryPoint]:
    """Installed drafters, name -> entry point, sorted by name."""
    return plugins.available(GROUP, entry_points())


def load(name: str) -> Drafter:
    """A new instance of the installed drafter ``name`` (``ngram``: :class:`NGramDrafter`)."""
    installed = available()
    if name not in installed:
        raise ValueError(
            f"unknown drafter {name!r}; installed: {', '.join(installed)} (a draft model is "
            "passed as a model object: load it by name with Generator.from_pretrained or "
            "bass.load_causal_lm)"
        )
    ep = installed[name]
    target = plugins.load_target("drafter", name, ep, DrafterLoadError)
    drafter = plugins.build("drafter", target, name, ep)
    if not isinstance(drafter, Drafter):
        raise DrafterLoadError(
            f"drafter {name!r} (entry point {ep.value!r}{plugins.from_package(ep)}) built a "
            f"{type(drafter).__name__}, not a bass.drafters.Drafter",
            plugin=name,
        )
    return _Guarded(drafter, plugins.describe("drafter", drafter, name, ep))


class _Guarded(Drafter):
    """Another package's drafter, each hook's exceptions reported as the drafter's
    (:func:`bass.plugins.guard`); its attributes read through (``model``, ``cache``...).
    The rows it is shown are the engine's: a hook that changes one (``state.seqs[slot]``
    replaced, grown, shrunk or its newest token overwritten) is a :class:`PluginError`,
    not wrong output (checked over the slots each hook is shown; a write inside a row,
    or to a row it was not shown, is not seen)."""

    def __init__(self, inner: Drafter, who: str):
        self.inner, self.who = inner, who
        self.name, self.deterministic = inner.name, inner.deterministic
        self.model = inner.model
        self._rows = None  # the generation's BatchState, from start() to finish()
        for hook in ("admit", "offer", "propose", "commit", "compact"):
            setattr(
                self, hook, self._read_only(hook, plugins.guard(who, hook, getattr(inner, hook)))
            )
        self._start = plugins.guard(who, "start", inner.start)
        self._finish = plugins.guard(who, "finish", inner.finish)

    def start(self, state, passes, max_len: int, device) -> int:
        self._rows = state
        return self._start(state, passes, max_len, device)

    def _read_only(self, hook: str, call):
        shown = _SHOWN[hook]

        def checked(*args, **kwargs):
            seqs = self._rows.seqs if self._rows is not None else None
            if seqs is None:
                return call(*args, **kwargs)
            slots = shown(*args) or range(len(seqs))  # the rows the hook was shown
            before = _rows_seen(seqs, slots)
            out = call(*args, **kwargs)
            if (
                self._rows.seqs is not seqs
                or len(seqs) != before[0]  # before indexing: a slot may be gone
                or _rows_seen(seqs, slots) != before
            ):
                raise PluginError(
                    f"{self.who} changed the engine's rows in {hook}() "
                    f"({_changed(seqs, slots, before)}): view.state and what it holds are "
                    "read-only; a drafter keeps its own state (copy a row before changing "
                    "it: list(view.state.seqs[slot]))",
                    plugin=self.who,
                    hook=hook,
                )
            return out

        return checked

    def finish(self) -> None:
        """The plugin's :meth:`~bass.hooks.Drafter.finish`, whose failure is a warning: the
        generation's rows are done by then, and its result is not lost to it."""
        self._rows = None
        try:
            self._finish()
        except PluginError as exc:
            warnings.warn(
                f"{exc} (what it held may outlive the generation)", RuntimeWarning, stacklevel=2
            )

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


# the slots each hook is shown (its arguments): what it must leave as it found them
_SHOWN = {
    "offer": lambda view: view.slots,
    "propose": lambda view, lengths: view.slots,
    "commit": lambda proposal, accepted: proposal.slots,  # [] if a drafter left it out: all
    "admit": lambda state, slots: slots,
    "compact": lambda keep: keep,
}


def _rows_seen(seqs: list[list[int]], slots) -> list:
    """What a hook must leave as it found it: each of ``slots``' list (identity), length
    and newest token, and how many slots there are (O(slots shown))."""
    return [
        len(seqs),
        *((id(r), len(r), r[-1] if r else None) for r in map(seqs.__getitem__, slots)),
    ]


def _changed(seqs: list[list[int]], slots, before: list) -> str:
    """Which slot changed, and how, for the error."""
    for s, (ident, n, last) in zip(slots, before[1:]):
        row = seqs[s] if s < len(seqs) else []
        if id(row) != ident:
            return f"slot {s}'s list was replaced"
        if len(row) != n:
            return f"slot {s} went from {n} to {len(row)} tokens"
        if row and row[-1] != last:
            return f"slot {s}'s newest token went from {last} to {row[-1]}"
    return f"the slots went from {before[0]} to {len(seqs)}"


def make_drafter(draft, main, shared_vocab: int | None = None) -> Drafter | None:
    """The drafter that a :class:`bass.Generator`'s ``draft`` argument names (``draft`` and
    ``shared_vocab`` as in its Args); another package's reports its hooks' failures."""
    if draft is None:
        return None
    if isinstance(draft, Drafter):
        if draft.model is not None and not isinstance(draft, ModelDrafter):
            _check_vocab(main, draft.model, None)
        if plugins.is_builtin(draft) or isinstance(draft, _Guarded):
            return draft
        if type(draft).propose is Drafter.propose:  # refused when built, not at a step
            raise NotImplementedError(f"{type(draft).__name__} must implement propose()")
        named = draft.name if draft.name != Drafter.name else None  # not the default's
        return _Guarded(draft, plugins.describe("drafter", draft, named))  # named fails
    if isinstance(draft, str):  # "none" as in the config file and the command line
        name = draft.strip()
        return None if name == "none" else load(name)
    if not isinstance(draft, torch.nn.Module) or not hasattr(draft, "get_output_embeddings"):
        raise TypeError(
            f"draft must be a causal LM (a transformers model), a bass.drafters.Drafter, a "
            f"drafter's name ({', '.join(available())}) or None, got {type(draft).__name__}"
        )
    hf.check_loaded(draft, "draft")
    tokens = _check_vocab(main, draft, shared_vocab)
    drafter = ModelDrafter(draft, tokens=tokens, out_vocab=_vocab_size(main))
    drafter.pair = (weakref.ref(main), _sizes(main), weakref.ref(draft), _sizes(draft))
    return drafter


def _sizes(model) -> tuple[int, int]:
    return model.get_input_embeddings().weight.shape[0], _vocab_size(model)


def _check_unresized(pair) -> None:
    """Refuse, when a generation starts, a draft model or a main model whose vocabulary
    was resized since the drafter was made (``resize_token_embeddings``): the drafter's
    ids and widths are the old ones (a bare IndexError inside an embedding, or the draft's
    probabilities refused as the wrong width)."""
    if pair is None:
        return
    for role, (ref, sizes) in (("main", pair[:2]), ("draft", pair[2:])):
        model = ref()
        if model is not None and _sizes(model) != sizes:
            raise ValueError(
                f"the {role} model's vocabulary changed since this Generator was built (input "
                f"and output ids {sizes[0]}/{sizes[1]} -> {_sizes(model)[0]}/"
                f"{_sizes(model)[1]}: resize_token_embeddings?); a draft model drafts the "
                "vocabulary it was paired with: build a new Generator with both models "
                "resized alike, or draft with 'ngram'"
            )


def _check_vocab(main, draft, shared_vocab: int | None) -> int:
    """The ids ``draft`` may propose; refuses vocabularies that do not match."""
    v_main, v_draft = _vocab_size(main), _vocab_size(draft)
    if shared_vocab is not None:  # make_drafter is public: checked here too
        if (
            isinstance(shared_vocab, bool)
            or not isinstance(shared_vocab, int)
            or not 1 <= shared_vocab <= min(v_main, v_draft)
        ):
            raise ValueError(
                f"shared_vocab must be an int in [1, {min(v_main, v_draft)}] (the tokenizer's "
                f"length, within both models' logits: main {v_main}, draft {v_draft}), got "
                f"{shared_vocab!r}"
            )
        return shared_vocab
    if v_main != v_draft:
        raise ValueError(
            f"draft and main vocabularies differ: the draft model {hf.model_name(draft)} has "
            f"{v_draft} logits, the main model {hf.model_name(main)} has {v_main}. "
            "Speculative decoding needs a draft that shares the main model's tokenizer; if "
            "both do and only their embedding matrices were padded to different sizes (as "
            "Qwen2.5 7B+ and 0.5B-3B are), pass shared_vocab=len(tokenizer) "
            "(Generator.from_pretrained and the CLI check the tokenizers and do it for you)"
        )
    return v_draft


def _vocab_size(model) -> int:
    return model.get_output_embeddings().weight.shape[0]
