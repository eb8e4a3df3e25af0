"""The BASS decode loop: draft -> verify -> accept -> commit -> policy, for a whole batch.

:class:`Generator` runs batched speculative decoding on unmodified transformers causal
LMs whose attention is routed through ``torch.ops.bass.ragged_attention`` (see
:mod:`bass.hf`). One step, for every active row at once:

1) ``k = policy.draft_length()``; each row drafts at most ``k`` (fewer near its token budget)
2) the drafter proposes tokens (a draft model: ``k`` ragged forward passes; or n-grams)
3) the main model verifies ``[last, d_1..d_k]`` of all rows in ONE forward pass
4) acceptance (:mod:`bass.sampling`): greedy prefix match or lossless rejection sampling
5) commit: per-row cache lengths advance, rejected entries are dropped by length only
6) finished rows (eos, a stop sequence or string, budget) leave the batch; the policy sees
   the step's statistics

Bookkeeping invariant (checked by ``tests/test_engine.py`` after every step): after a
step, the main cache holds every committed token of a row except the newest, which has
been chosen but not yet fed (``main_len[b] == len(seq[b]) - 1``). The main model fed
``[last, d_1..d_n]`` and keeps ``a + 1`` of them. The draft cache holds a prefix of the
row (``draft_len[b] <= len(seq[b]) - 1``); the rest is fed at its next draft pass: usually
one token, two when the row accepted every draft (the draft never fed ``d_n``), which is
where ragged query lengths come from.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from . import hf, policies
from .cache import RaggedKVCache
from .drafters import ModelDrafter, NGramDrafter, Proposal, choose
from .ops import bucket_query_len, length_checks, length_hint
from .sampling import (
    Acceptance,
    SamplingParams,
    greedy_accept,
    speculative_accept,
    warp_probs,
)
from .stats import GenerationResult, GenerationStats, StepRecord
from .stopping import StopStrings, cut_at_stop


def forced_accept(counts: torch.Tensor, logits: torch.Tensor, p: float, gen) -> Acceptance:
    """Benchmark-only acceptance: each drafted token is accepted with probability ``p``
    (stopping at the first failure), whatever the models say; the next token is the main
    model's argmax there. counts int64 [B], logits [B, K+1, V]."""
    B, K1, _ = logits.shape
    u = torch.rand(B, K1 - 1, generator=gen, device=logits.device)  # [B, K]
    ok = (u < p) & (torch.arange(K1 - 1, device=logits.device) < counts[:, None])
    accepted = ok.long().cumprod(dim=1).sum(dim=1)  # [B]
    nxt = logits.argmax(-1).gather(1, accepted[:, None]).squeeze(1)
    return Acceptance(accepted, nxt)


_GENERATE_DEFAULTS = dict(
    max_new_tokens=None,
    do_sample=False,
    temperature=1.0,
    top_k=None,
    top_p=None,
    eos_token_id=None,
    seed=None,
    time_budget=None,
    stop_strings=None,
)


def _vocab_size(model) -> int:
    return model.get_output_embeddings().weight.shape[0]


def _max_positions(model) -> int | None:
    return getattr(model.config.get_text_config(), "max_position_embeddings", None)


class Generator:
    """Batched speculative decoding with a main model and a draft model (or n-grams).

    Args:
        main: a transformers causal LM (Llama, Mistral, Qwen2, Qwen3, ... any decoder whose
            attention goes through transformers' AttentionInterface).
        draft: a smaller causal LM with the same vocabulary, or ``"ngram"`` for
            prompt-lookup drafting, or ``None`` for regular (non-speculative) decoding.
        policy: a draft-length policy name from :func:`bass.policies.available` or a
            policy instance; ``policy_options`` are its keyword options.
        attention: the ``ragged_attention`` implementation (``"auto"``, ``"reference"``...).
        forced_acceptance: BENCHMARKING ONLY. Accept each drafted token with this
            probability regardless of the models (the main model's argmax follows), so
            random-weight models of real shapes can be timed at a known mean accepted
            length. Output is meaningless text; ``stats.forced_acceptance`` records it.
        config: a TOML file path (or :class:`bass.config.Config`) whose ``[policy]``,
            ``[model].attention`` and ``[generation]`` values become the defaults here and
            in :meth:`generate`; explicit arguments win.
        compile: ``True`` compiles the per-step forward with ``torch.compile(fullgraph=True)``
            (a backend name or callable selects the backend).

    Example::

        gen = Generator(main, draft, policy="bass")
        res = gen.generate([[1, 2, 3], [4, 5]], max_new_tokens=32)
        res.sequences, res.stats.summary()
    """

    def __init__(
        self,
        main,
        draft=None,
        *,
        policy: str | policies.DraftLengthPolicy | None = None,
        policy_options: dict | None = None,
        attention: str | None = None,
        compile: bool | str | object = False,
        config=None,
        forced_acceptance: float | None = None,
    ):
        # Precedence: explicit arguments > the config file > built-in defaults.
        cfg_gen, self.generate_defaults = ({}, {})
        if config is not None:
            from .config import apply_config

            cfg_gen, self.generate_defaults = apply_config(config)
        if policy is None:
            policy = cfg_gen.get("policy", "bass")
            if policy_options is None:
                policy_options = cfg_gen.get("policy_options")
        if forced_acceptance is not None and not 0.0 <= forced_acceptance <= 1.0:
            raise ValueError(f"forced_acceptance must be in [0, 1], got {forced_acceptance}")
        self.forced_acceptance = forced_acceptance
        self.main = main
        self.attention = attention or cfg_gen.get("attention", "auto")
        self.policy_spec = (policy, dict(policy_options or {}))
        self.new_policy()  # fail now, not mid-generation, on unknown names or bad options
        if draft is None:
            self.drafter = None
        elif isinstance(draft, str):
            if draft != "ngram":
                raise ValueError(
                    f"draft must be a model, 'ngram' or None, got the string {draft!r}; "
                    "load models by name with Generator.from_pretrained"
                )
            self.drafter = NGramDrafter()
        else:
            v_main, v_draft = _vocab_size(main), _vocab_size(draft)
            if v_main != v_draft:
                raise ValueError(
                    f"draft and main vocabularies differ: {hf.model_name(draft)} has "
                    f"{v_draft} logits, {hf.model_name(main)} has {v_main}; speculative "
                    "decoding needs a draft that shares the main model's tokenizer"
                )
            self.drafter = ModelDrafter(draft, impl=self.attention)
        self.forward = hf.forward_logits
        if compile:
            # Only the per-step forward is compiled (gpt-fast); the loop stays eager. Query
            # widths are bucketed (bass.ops.QUERY_BUCKETS), so a generation compiles a
            # handful of graphs; batch size becomes dynamic after its first change.
            backend = "inductor" if compile is True else compile
            self.forward = torch.compile(hf.forward_logits, fullgraph=True, backend=backend)
            if isinstance(self.drafter, ModelDrafter):
                self.drafter.forward = self.forward

    @classmethod
    def from_pretrained(cls, main: str, draft: str | None = None, *, dtype=None, device=None, **kw):
        """Load main (and draft) models by Hugging Face name or local path."""
        from .models import load_causal_lm

        main_model = load_causal_lm(main, dtype=dtype, device=device)
        draft_model = draft
        if draft not in (None, "ngram"):
            draft_model = load_causal_lm(draft, dtype=dtype, device=device)
        return cls(main_model, draft_model, **kw)

    def new_policy(self):
        spec, options = self.policy_spec
        if isinstance(spec, str):
            return policies.load(spec, **options)
        if options:
            raise ValueError("policy_options apply to a policy name, not a policy instance")
        if not isinstance(spec, policies.DraftLengthPolicy):
            raise TypeError(
                f"policy must be a name or have draft_length() and update(stats), got {spec!r}"
            )
        return spec

    # ----------------------------------------------------------------- checks

    def _check(self, prompts, max_new_tokens: int) -> int:
        if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
            raise TypeError(
                "prompts must be a list of token-id lists (use generate_text for strings)"
            )
        if len(prompts) == 0:
            raise ValueError("prompts is empty: pass at least one token-id list")
        if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
        vocab = _vocab_size(self.main)
        for i, p in enumerate(prompts):
            if len(p) == 0:
                raise ValueError(f"prompt {i} is empty; every prompt needs at least one token")
            bad = [t for t in p if not (isinstance(t, int) and 0 <= t < vocab)]
            if bad:
                raise ValueError(f"prompt {i} has token ids outside [0, {vocab}): {bad[:5]}")
        need = max(len(p) for p in prompts) + max_new_tokens
        for model in (self.main, getattr(self.drafter, "model", None)):
            limit = _max_positions(model) if model is not None else None
            if limit is not None and need > limit:
                longest = max(range(len(prompts)), key=lambda i: len(prompts[i]))
                raise ValueError(
                    f"prompt {longest} ({len(prompts[longest])} tokens) + max_new_tokens "
                    f"({max_new_tokens}) = {need} exceeds {hf.model_name(model)}'s context "
                    f"of {limit} positions; shorten the prompt or lower max_new_tokens"
                )
        return need

    # ----------------------------------------------------------------- generation

    @torch.inference_mode()
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int | None = None,
        do_sample: bool | None = None,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        eos_token_id: int | Sequence[int] | None = None,
        seed: int | None = None,
        time_budget: float | None = None,
        stop_sequences: Sequence[Sequence[int]] | None = None,
        stop_strings: str | Sequence[str] | None = None,
        tokenizer=None,
        on_step=None,
    ) -> GenerationResult:
        """Generate up to ``max_new_tokens`` for every prompt (token-id lists, any lengths).

        Greedy output equals the main model's own greedy decoding token for token; sampled
        output follows the main model's (temperature/top-k/top-p warped) distribution
        exactly. ``time_budget`` (seconds) stops every row where it is. A row also stops
        after its new tokens end with one of ``stop_sequences`` (token-id lists; the stop
        sequence is kept, as eos is), or once the text of its new tokens (decoded with
        ``tokenizer``, special tokens skipped) contains one of ``stop_strings``: the row
        ends with the token that completes the stop string, even when a step accepted
        more tokens after it, and keeps the tokens that spell it (generate_text cuts the
        text before it). ``result.finish_reasons`` says which rows ended how. ``on_step``
        is called with ``(generator, state)`` after each step (tests use it to check the
        bookkeeping invariant).
        """
        given = dict(
            max_new_tokens=max_new_tokens,
            do_sample=do_sample,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            eos_token_id=eos_token_id,
            seed=seed,
            time_budget=time_budget,
            stop_strings=stop_strings,
        )
        kw = {
            **_GENERATE_DEFAULTS,
            **self.generate_defaults,
            **{k: v for k, v in given.items() if v is not None},
        }
        max_new_tokens, eos_token_id, seed, time_budget = (
            kw["max_new_tokens"],
            kw["eos_token_id"],
            kw["seed"],
            kw["time_budget"],
        )
        if max_new_tokens is None:
            raise ValueError("max_new_tokens is required (as an argument or in the config)")
        params = SamplingParams(kw["do_sample"], kw["temperature"], kw["top_k"], kw["top_p"])
        need = self._check(prompts, max_new_tokens)
        eos = set([eos_token_id] if isinstance(eos_token_id, int) else (eos_token_id or []))
        stops = [tuple(int(t) for t in seq) for seq in (stop_sequences or [])]
        if any(len(seq) == 0 for seq in stops):
            raise ValueError("stop_sequences must not contain an empty sequence")
        texts = None
        if kw["stop_strings"] is not None:
            texts = StopStrings(kw["stop_strings"], tokenizer) or None
        max_len = -(-need // 8) * 8  # a multiple of 8 (gpt-fast): fewer distinct shapes
        models = [m for m in (self.main, getattr(self.drafter, "model", None)) if m is not None]
        previous = [m.config._attn_implementation for m in models]
        try:
            for model in models:
                hf.prepare(model, max_len)
            # The engine builds valid lengths by construction (tests check the invariant
            # every step); skip the ops' host-side range checks in the hot loop.
            with length_checks(False):
                return self._generate(
                    prompts,
                    max_new_tokens,
                    params,
                    (eos, stops, texts),
                    seed,
                    time_budget,
                    on_step,
                    max_len,
                )
        finally:  # hand the models back as they came
            for model, attn in zip(models, previous):
                if attn != hf.ATTN_NAME:
                    model.set_attn_implementation(attn)

    def _generate(
        self, prompts, max_new_tokens, params, eos, seed, time_budget, on_step, max_len
    ) -> GenerationResult:
        device = self.main.device
        gen = torch.Generator(device=device)
        gen.manual_seed(seed if seed is not None else torch.seed())
        policy = self.new_policy()
        t0 = time.perf_counter()
        stats = GenerationStats(rows=len(prompts), forced_acceptance=self.forced_acceptance)
        state = _BatchState([list(p) for p in prompts], max_new_tokens, *eos)

        # 1) prefill: main over all prompt tokens (first new token), then the draft
        n_layers = self.main.config.get_text_config().num_hidden_layers
        self.cache = RaggedKVCache(len(prompts), max_len, n_layers, device)
        # prefill runs eagerly (its widths vary); only the per-step forward is compiled
        last_logits, passes = hf.prefill(self.main, self.cache, state.seqs, self.attention)
        first, _ = choose(last_logits, params, gen, False)
        stats.main_passes += passes
        stats.prefill_passes = passes
        if self.drafter is not None:
            self.drafter.start(state.seqs, max_len, device, _vocab_size(self.main))
            stats.draft_passes += getattr(self.drafter, "prefill_passes", 0)
        state.append([[t] for t in first.tolist()])
        stats.prefill_seconds = time.perf_counter() - t0
        self._compact(state)

        while state.rows:
            if time_budget is not None and time.perf_counter() - t0 > time_budget:
                stats.stopped_by_time_budget = True
                break
            self._step(state, policy, params, gen, stats)
            self._compact(state)
            if on_step is not None:
                on_step(self, state)

        stats.wall_seconds = time.perf_counter() - t0
        stats.tokens_generated = sum(len(o) for o in state.outputs)
        reasons = [r or "time" for r in state.reasons]  # still running when time ran out
        return GenerationResult([list(o) for o in state.outputs], stats, reasons)

    def _step(self, state, policy, params, gen, stats) -> None:
        device = self.cache.lens.device
        B = len(state.rows)
        # 1) draft length: batch-wide k, capped per row by what it may still generate
        k = max(0, int(policy.draft_length())) if self.drafter is not None else 0
        k_rows = [min(k, state.remaining(b) - 1) for b in range(B)]
        k = max(k_rows)
        lens_before = [len(s) for s in state.seqs]
        t_draft = time.perf_counter()
        # 2) draft
        if k > 0:
            prop = self.drafter.propose(state.seqs, k_rows, k, params, gen, policy)
            stats.draft_passes += self.drafter.draft_passes
        else:
            prop = Proposal(
                torch.zeros(B, 0, dtype=torch.long, device=device),
                None,
                torch.zeros(B, dtype=torch.long, device=device),
            )
        counts = prop.counts.tolist()  # host read: verify width depends on it
        t_verify = time.perf_counter()
        # 3) verify [last, d_1..d_n] of every row in one main pass
        K = max(counts)
        width = bucket_query_len(K + 1)
        drafts = prop.tokens[:, :K]
        ids = torch.zeros(B, width, dtype=torch.long, device=device)
        ids[:, 0] = torch.tensor([s[-1] for s in state.seqs], device=device)
        ids[:, 1 : K + 1] = drafts
        q_lens = prop.counts.to(torch.int32) + 1
        # auto's length hint: row b attends to its cache (len - 1) plus 1 + counts[b] new
        with length_hint([len(s) + c for s, c in zip(state.seqs, counts)]):
            logits = self.forward(self.main, self.cache, ids, q_lens, self.attention)
        logits = logits[:, : K + 1]
        stats.main_passes += 1
        # 4) accept
        if params.do_sample:
            draft_probs = prop.probs[:, :K] if prop.probs is not None else None
            if draft_probs is None:  # K == 0
                draft_probs = torch.zeros(B, 0, logits.shape[-1], device=device)
            acc = speculative_accept(
                drafts, draft_probs, warp_probs(logits, params), prop.counts, gen
            )
        else:
            acc = greedy_accept(drafts, logits, prop.counts)
        if self.forced_acceptance is not None:
            acc = forced_accept(prop.counts, logits, self.forced_acceptance, gen)
        accepted = acc.accepted.tolist()  # host read: the one per-step sync of lengths
        next_tokens = acc.next_tokens.tolist()
        d_host = drafts.tolist()
        t_end = time.perf_counter()
        # 5) commit: main keeps [last, d_1..d_a]; the draft rolls back to its valid prefix
        self.cache.commit(acc.accepted + 1)
        if self.drafter is not None and k > 0:
            self.drafter.commit(lens_before, accepted)
        state.append([[*d_host[b][: accepted[b]], next_tokens[b]] for b in range(B)])
        # 6) statistics -> policy
        rec = StepRecord(
            k, list(state.rows), counts, accepted, t_verify - t_draft, t_end - t_verify
        )
        stats.steps.append(rec)
        if self.drafter is not None:
            policy.update(
                policies.StepStats(
                    draft_length=k,
                    accepted=accepted,
                    drafted=counts,
                    draft_seconds=rec.draft_seconds,
                    verify_seconds=rec.verify_seconds,
                    step=len(stats.steps) - 1,
                )
            )

    def _compact(self, state) -> None:
        """Drop finished rows from the batch so they stop costing compute."""
        keep = [b for b in range(len(state.rows)) if not state.done[b]]
        if len(keep) == len(state.rows):
            return
        state.select(keep)
        if keep:
            self.cache.select_rows(
                torch.tensor(keep, dtype=torch.long, device=self.cache.lens.device)
            )
            if self.drafter is not None:
                self.drafter.select_rows(keep)

    def generate_text(
        self, texts: Sequence[str], tokenizer, *, chat: bool | None = None, **kw
    ) -> list[str]:
        """Strings in, strings out: tokenizes (with the chat template when the tokenizer
        has one, unless ``chat=False``), generates, decodes the new tokens.

        ``stop_strings`` (in ``kw`` or the config) stop rows as in :meth:`generate`, and
        the returned text of a row that a stop string ended is cut right before the
        stop string (it is not included, as vLLM's default)."""
        if chat is None:
            chat = getattr(tokenizer, "chat_template", None) is not None
        from .models import encode_prompt

        prompts = [encode_prompt(tokenizer, t, chat) for t in texts]
        kw.setdefault("eos_token_id", tokenizer.eos_token_id)
        kw.setdefault("tokenizer", tokenizer)
        res = self.generate(prompts, **kw)
        stops = kw.get("stop_strings")
        if stops is None:
            stops = self.generate_defaults.get("stop_strings")
        out = []
        for seq, why in zip(res.sequences, res.finish_reasons, strict=True):
            text = tokenizer.decode(seq, skip_special_tokens=True)
            out.append(cut_at_stop(text, stops) if stops and why == "stop" else text)
        return out


class _BatchState:
    """Host-side view of the active batch: row ``b`` is prompt ``rows[b]``."""

    def __init__(
        self,
        prompts: list[list[int]],
        max_new: int,
        eos: set[int],
        stops: list[tuple] = (),
        texts: StopStrings | None = None,
    ):
        self.seqs = prompts  # prompt + committed tokens, per active row
        self.rows = list(range(len(prompts)))
        self.outputs: list[list[int]] = [[] for _ in prompts]  # per prompt
        self.reasons: list[str | None] = [None] * len(prompts)  # per prompt, once finished
        self.done = [False] * len(prompts)
        self.max_new, self.eos, self.stops, self.texts = max_new, eos, stops, texts

    def _stopped(self, out: list[int]) -> bool:
        return any(len(out) >= len(s) and tuple(out[-len(s) :]) == s for s in self.stops)

    def remaining(self, b: int) -> int:
        return self.max_new - len(self.outputs[self.rows[b]])

    def append(self, new: list[list[int]]) -> None:
        """Append each active row's accepted tokens, cutting after the first that ends it
        (eos, a stop sequence, a stop string, ``max_new``)."""
        for b, toks in enumerate(new):
            p = self.rows[b]
            out = self.outputs[p]
            before = len(out)
            for t in toks[: self.remaining(b)]:
                out.append(t)
                self.seqs[b].append(t)
                if t in self.eos or (self.stops and self._stopped(out)):
                    self.reasons[p] = "eos" if t in self.eos else "stop"
                    break
            if self.texts is not None:
                keep = self.texts.check(p, out, len(out) - before)
                if keep is not None:  # a stop string: drop what the step accepted after it
                    drop = len(out) - before - keep
                    if drop:
                        del out[-drop:], self.seqs[b][-drop:]
                    self.reasons[p] = "stop"
            if self.reasons[p] is None and len(out) >= self.max_new:
                self.reasons[p] = "length"
            self.done[b] = self.reasons[p] is not None

    def select(self, keep: list[int]) -> None:
        self.seqs = [self.seqs[b] for b in keep]
        self.rows = [self.rows[b] for b in keep]
        self.done = [self.done[b] for b in keep]
