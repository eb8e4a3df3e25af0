"""The BASS decode loop: draft -> verify -> accept -> commit -> policy, for a whole batch.

:class:`Generator` runs batched speculative decoding on unmodified transformers causal
LMs whose attention is routed through bass's ragged attention ops (see :mod:`bass.hf`).
Every forward pass is *packed* (:mod:`bass.packing`): it feeds only the tokens the rows
really bring, so the dense layers never compute padding. One step, for every active row:

1) draft lengths: the policy's, per row (``draft_lengths``) or batch-wide
   (``draft_length``), capped by each row's token budget (and, for n-grams, by what the
   lookup found)
2) the drafter proposes tokens (a draft model: packed passes over the rows still
   drafting; or n-gram lookup on the host)
3) the main model verifies ``[last, d_1..d_n]`` of all rows in ONE packed pass
4) acceptance (:mod:`bass.sampling`): greedy prefix match or lossless rejection sampling,
   batched on the device; then the step's one host read (accepted counts, next tokens,
   non-finite flags and, for model drafts, the drafts)
5) commit: per-row cache lengths advance on the host, rejected entries are dropped by
   length only
6) finished rows (eos, a stop sequence or string, budget) bring no more tokens; once half
   the cache's rows are finished they are compacted away in place; the policy sees the
   step's statistics

Bookkeeping invariant (checked by ``tests/test_engine.py`` after every step): after a
step, the main cache holds every committed token of a row except the newest, which has
been chosen but not yet fed (``main_len[s] == len(seq[s]) - 1``). The main model fed
``[last, d_1..d_n]`` and keeps ``a + 1`` of them. The draft cache holds a prefix of the
row (``d_len[s] <= len(seq[s]) - 1``); the rest is fed at its next draft pass: usually
one token, two when the row accepted every draft (the draft never fed ``d_n``), which is
where ragged query lengths come from.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from . import hf, locking, options, policies
from .batch_state import (
    BatchState,
    NonFiniteLogitsError,
    as_prompts,
    check_prompts,
    raise_if_nonfinite,
)
from .cache import RaggedKVCache
from .cpu_linear import prepare_all as prepare_linears
from .drafters import ModelDrafter, NGramDrafter, make_drafter, nonfinite
from .ops import length_checks
from .packing import TOKEN_BUCKETS, pack
from .policies import DraftContext
from .sampling import (
    SamplingParams,
    forced_accept,
    greedy_accept_ids,
    keyed_accept,
    position_keys,
    sample_keyed,
    speculative_accept,
    warp_probs,
)
from .stats import GenerationResult, GenerationStats, StepRecord
from .stopping import StopStrings, cut_at_stop

__all__ = ["Generator", "NonFiniteLogitsError"]

MAX_LOOKUP = 32  # the most tokens an n-gram lookup proposes per row and step


class Generator:
    """Batched speculative decoding with a main model and a draft model (or n-grams).

    Args:
        main: a transformers causal LM (Llama, Mistral, Qwen2, Qwen3, ... any decoder whose
            attention goes through transformers' AttentionInterface).
        draft: a smaller causal LM with the same vocabulary, or ``"ngram"`` for
            prompt-lookup drafting (or a configured :class:`bass.drafters.NGramDrafter`,
            e.g. ``NGramDrafter(max_ngram=4, siblings=False)``), or ``None`` for regular
            (non-speculative) decoding.
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
        compile: ``True`` compiles the per-step forward (every packed pass after the
            prefill) with ``torch.compile(fullgraph=True)``; a backend name or callable
            selects the backend. ``"reduce-overhead"`` compiles it with Inductor's
            CUDA graphs (``mode="reduce-overhead"``) and turns on ``static_shapes``.
        static_shapes: pass shapes that a CUDA graph can replay: token counts padded to
            :data:`bass.packing.TOKEN_BUCKETS` (padding tokens belong to no row), the
            cache's rows never compacted, its buffers allocated once (their addresses
            marked static for ``torch.compile``). Default: on with
            ``compile="reduce-overhead"``, else off (eager passes compute real tokens
            only).
        prefill_chunk_tokens: the most tokens one prefill pass feeds (longer batches are
            prefilled in chunks; a prompt may span chunks).
        cpu_linear: ``"auto"`` (default): on a CPU, each linear layer computes its matrix
            product in the layout measured fastest for the pass's row count
            (:mod:`bass.cpu_linear`; calibrated once per model; the packed layout keeps
            a second copy of the weights it applies to); ``"unpacked"``: the same without
            the packed layout (no copies); ``"torch"``: ``F.linear`` as is.

    Every argument here and of :meth:`generate` is checked before any work
    (:mod:`bass.options`: an :class:`~bass.options.OptionError` names it). Threads: one
    generation at a time per process (:mod:`bass.locking`); a concurrent call waits, then
    returns exactly what it would alone.

    Example::

        gen = Generator(main, draft)  # policy="adaptive"
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
        static_shapes: bool | None = None,
        prefill_chunk_tokens: int = 8192,
        cpu_linear: str | None = None,
        shared_vocab: int | None = None,
    ):
        # Types and ranges first, before any work (bass.options: the config file and the
        # command line check these values the same way)
        checked = options.check_keywords(
            "Generator()",
            main=main,
            policy=policy,
            policy_options=policy_options,
            attention=attention,
            compile=compile,
            forced_acceptance=forced_acceptance,
            static_shapes=static_shapes,
            prefill_chunk_tokens=prefill_chunk_tokens,
            cpu_linear=cpu_linear,
            shared_vocab=shared_vocab,
            config=config,
        )
        policy_options, shared_vocab = checked["policy_options"], checked["shared_vocab"]
        forced_acceptance = checked["forced_acceptance"]
        prefill_chunk_tokens = checked["prefill_chunk_tokens"]
        # Precedence: explicit arguments > the config file > built-in defaults.
        cfg_gen, self.generate_defaults = ({}, {})
        if config is not None:
            from .config import apply_config

            cfg_gen, self.generate_defaults = apply_config(config)
        if policy is None:
            policy = cfg_gen.get("policy", policies.DEFAULT)
            if policy_options is None:
                policy_options = cfg_gen.get("policy_options")
        self.forced_acceptance = forced_acceptance
        self.main = main
        self.attention = attention or cfg_gen.get("attention", "auto")
        if compile is False:
            compile = cfg_gen.get("compile", False)
        self.policy_spec = (policy, dict(policy_options or {}))
        self.new_policy()  # fail now, not mid-generation, on unknown names or bad options
        self.drafter = make_drafter(draft, main, self.attention, shared_vocab)
        self.prefill_chunk_tokens = prefill_chunk_tokens
        graphs = compile == "reduce-overhead"
        if static_shapes is None:
            static_shapes = graphs
        self.bucket = TOKEN_BUCKETS if static_shapes else None
        self.forward = hf.forward_packed
        self.separate = bool(compile)  # compiled passes take standalone tensors, not views
        if compile:
            # Only the per-step forward is compiled (gpt-fast); the loop stays eager. The
            # token count N of a pass varies every step: it is a dynamic dimension (eager
            # shapes) or padded to a bucket (static shapes: one graph per bucket).
            self.forward = hf.CompiledForward(
                "inductor" if compile in (True, "reduce-overhead") else compile,
                mode="reduce-overhead" if graphs else None,
                dynamic=not graphs,
                # one graph per pass kind and bucket (static shapes), or a few (dynamic)
                limit=4 * len(TOKEN_BUCKETS) + 8,
            )
        if isinstance(self.drafter, ModelDrafter):
            self.drafter.forward = self.forward
            self.drafter.separate = self.separate
        self.cpu_linear = cpu_linear or cfg_gen.get("cpu_linear", "auto")
        # per model (main, then the draft model): its CPU GEMM layouts, or None (off the
        # CPU nothing is routed; compiled passes call them through bass::cpu_linear)
        drafter_model = self.drafter.model if isinstance(self.drafter, ModelDrafter) else None
        with locking.exclusive("Generator()"):  # not while a generation runs on them
            self.linear_plans = prepare_linears(self.cpu_linear, main, drafter_model)
        # a calibrated lm head computes a few rows fast: no padding of the logits rows
        self.route = self.cpu_linear != "torch"
        self.logits_multiple = 1 if self.linear_plans[0] is not None else None
        if isinstance(self.drafter, ModelDrafter):
            self.drafter.route = self.route
            if self.linear_plans[-1] is not None:
                self.drafter.logits_multiple = 1

    @classmethod
    def from_pretrained(cls, main: str, draft: str | None = None, *, dtype=None, device=None, **kw):
        """Load main (and draft) models by Hugging Face name or local path. Where the two
        models' logit counts differ, their tokenizers are compared: one tokenizer with
        embedding matrices padded to different sizes (Qwen2.5 7B+ with 0.5B-3B) sets
        ``shared_vocab``; different tokenizers are refused."""
        from .models import load_causal_lm, padded_vocab

        main_model = load_causal_lm(main, dtype=dtype, device=device)
        draft_model = draft
        if draft not in (None, "ngram"):
            draft_model = load_causal_lm(draft, dtype=dtype, device=device)
            if kw.get("shared_vocab") is None:
                kw["shared_vocab"] = padded_vocab(main, draft, main_model, draft_model)
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
            stop_sequences=stop_sequences,
            tokenizer=tokenizer,
            on_step=on_step,
        )
        # every argument checked before any work (bass.options; the config's defaults
        # under the explicit ones): types, ranges, ids within the main model's logits
        vocab = self.main.get_output_embeddings().weight.shape[0]
        kw = options.generation_kwargs(given, self.generate_defaults, vocab=vocab)
        max_new_tokens, seed, time_budget = kw["max_new_tokens"], kw["seed"], kw["time_budget"]
        params = SamplingParams(kw["do_sample"], kw["temperature"], kw["top_k"], kw["top_p"])
        models = [m for m in (self.main, getattr(self.drafter, "model", None)) if m is not None]
        prompts = as_prompts(prompts)
        need = check_prompts(prompts, max_new_tokens, models)
        texts = None
        if kw["stop_strings"]:
            texts = StopStrings(kw["stop_strings"], kw["tokenizer"])
        stops = (kw["eos_token_id"], kw["stop_sequences"], texts)
        max_len = -(-need // 8) * 8  # a multiple of 8 (gpt-fast): fewer distinct shapes
        windows = [w for w in map(hf.sliding_window, models) if w is not None]
        if windows and min(windows) < max_len:  # no rounding past a window (prepare checks
            max_len = need  # that the generation itself fits in it)
        # one generation at a time per process (bass.locking): a call from another thread
        # waits here, then runs as if alone
        with locking.exclusive("generate()"):
            previous = [m.config._attn_implementation for m in models]
            try:
                for model in models:
                    hf.prepare(model, need)  # a window is checked against real positions
                # The engine builds valid lengths by construction (tests check the invariant
                # every step); skip the ops' host-side range checks in the hot loop.
                with length_checks(False):
                    return self._generate(
                        prompts,
                        max_new_tokens,
                        params,
                        stops,
                        seed,
                        time_budget,
                        kw["on_step"],
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
        if seed is None:  # from torch's global generator: torch.manual_seed governs it
            seed = int(torch.randint(0, 2**62, (1,)).item())
        gen = torch.Generator(device=device)  # the draft model's sampling and verification
        gen.manual_seed(seed)  # the seed also keys every sampled position (position_keys)
        policy = self.new_policy()
        t0 = time.perf_counter()
        stats = GenerationStats(rows=len(prompts), forced_acceptance=self.forced_acceptance)
        state = BatchState([list(p) for p in prompts], max_new_tokens, *eos)

        # 1) prefill: main over all prompt tokens (first new token), then the draft; every
        #    prompt token goes through one packed pass, eager (its widths vary)
        n_layers = self.main.config.get_text_config().num_hidden_layers
        self.cache = RaggedKVCache(len(prompts), max_len, n_layers, device)
        chunk = self.prefill_chunk_tokens
        logits, passes = hf.prefill(
            self.main, self.cache, state.seqs, self.attention, chunk_tokens=chunk, route=self.route
        )
        if params.do_sample:  # each row's new token 0, keyed by (seed, prompt, 0)
            keys = position_keys(seed, range(len(prompts)), [0] * len(prompts), 1)
            keys_t = torch.tensor(keys, dtype=torch.int64).to(device, non_blocking=True)
            first = sample_keyed(warp_probs(logits, params), keys_t)
        else:
            first = logits.argmax(dim=-1)
        host = torch.cat([first, nonfinite(logits).long()]).tolist()  # host read
        B = len(prompts)
        raise_if_nonfinite(host[B:], self.main, "main", state.rows, "the prefill")
        stats.main_passes += passes
        stats.prefill_passes = passes
        stats.prefill_tokens = sum(map(len, prompts))
        if isinstance(self.drafter, ModelDrafter):
            stats.draft_passes += self.drafter.start(state.seqs, max_len, device, chunk)
            self.drafter.bucket = self.bucket
            self.drafter.logits_slots = B if self.bucket is not None else None
        elif self.drafter is not None:
            self.drafter.start(prompts, state.seqs)
        state.main_len = [len(p) for p in prompts]
        state.append(list(range(B)), [[t] for t in host[:B]])
        stats.prefill_seconds = time.perf_counter() - t0
        if self.bucket is not None:  # CUDA graphs: the buffers' addresses must never move
            for buf in self.cache.buffers() + (
                self.drafter.cache.buffers() if isinstance(self.drafter, ModelDrafter) else []
            ):
                torch._dynamo.mark_static_address(buf)
        self._compact(state)

        while state.active():
            if time_budget is not None and time.perf_counter() - t0 > time_budget:
                stats.stopped_by_time_budget = True
                break
            self._step(state, policy, params, (gen, seed), stats)
            self._compact(state)
            if on_step is not None:
                on_step(self, state)

        stats.wall_seconds = time.perf_counter() - t0
        stats.tokens_generated = sum(len(o) for o in state.outputs)
        reasons = [r or "time" for r in state.reasons]  # still running when time ran out
        return GenerationResult([list(o) for o in state.outputs], stats, reasons)

    def _draft_lengths(self, policy, state, act, stats) -> list[int]:
        """Each active row's draft length this step: the policy's (per row, or one for
        the batch), capped by what the row may still generate and, for n-grams, by what
        the lookup found."""
        rows = [state.rows[s] for s in act]
        cap = [state.remaining(s) - 1 for s in act]  # the main model adds one token
        signals = None
        if isinstance(self.drafter, NGramDrafter):
            signals = self.drafter.signals(rows, [min(c, MAX_LOOKUP) for c in cap])
        ctx = DraftContext(
            rows=rows,
            max_draft=cap,
            drafter=self.drafter.name,
            available=signals.available if signals else None,
            match_len=signals.match_len if signals else None,
            step=len(stats.steps),
        )
        return policies.lengths_for(policy, ctx)

    def _step(self, state, policy, params, rng, stats) -> None:
        gen, seed = rng  # the draft model's generator; the key of sampled positions
        device = self.cache.lens.device
        t_start = time.perf_counter()
        act = state.active()  # cache rows of the active rows, ascending
        R = len(act)
        # 1) draft lengths: per row (policy and caps); 0 everywhere without a drafter
        k_rows = [0] * R
        if self.drafter is not None:
            k_rows = self._draft_lengths(policy, state, act, stats)
        # 2) draft
        prop = None
        if any(k_rows):
            if isinstance(self.drafter, NGramDrafter):
                prop = self.drafter.propose([state.rows[s] for s in act], k_rows)
            else:
                seqs = [state.seqs[s] for s in act]
                prop = self.drafter.propose(act, seqs, k_rows, params, gen, policy)
        counts = prop.counts if prop is not None else [0] * R
        K = max(counts)
        t_verify = time.perf_counter()
        # 3) verify [last, d_1..d_n] of every active row in ONE packed main pass
        q_lens = [0] * self.cache.batch_size
        idx: list[int] = []  # [R, K+1]: row r's position i -> its token (clamped)
        start = 0
        for r, s in enumerate(act):
            q_lens[s] = n = 1 + counts[r]
            idx += [start + min(i, n - 1) for i in range(K + 1)]
            start += n
        last = [state.seqs[s][-1] for s in act]
        rows = [state.rows[s] for s in act]
        host_drafts = prop.host_tokens if prop is not None else [[]] * R
        # sampling with deterministic drafts (n-grams, or none): keyed draws per position
        keyed = params.do_sample and self.forced_acceptance is None and host_drafts is not None
        if host_drafts is not None:  # drafts on the host (n-grams, or none)
            ids = [t for r in range(R) for t in (last[r], *host_drafts[r])]
            padded = [t for d in host_drafts for t in (*d, *[0] * (K - len(d)))]
            extra = [*idx, *counts, *padded]
            if keyed:
                starts = [len(state.outputs[p]) for p in rows]
                extra += position_keys(seed, rows, starts, K + 1)
        else:  # drafts on the device: gather them into the packed order there
            gidx = [r * (K + 1) + i for r in range(R) for i in range(1 + counts[r])]
            ids, extra = None, [*idx, *counts, *last, *gidx]
        batch = pack(
            q_lens,
            state.main_len,
            device,
            ids=ids,
            bucket=self.bucket,
            logits_multiple=self.logits_multiple,
            extra=extra,
            separate=self.separate,
        )
        e, o = batch.extra, R * (K + 1)
        index, counts_t = e[:o].view(R, K + 1), e[o : o + R]
        if ids is None:
            drafts = prop.tokens[:, :K]
            table = torch.cat([e[o + R : o + 2 * R, None], drafts], dim=1)  # [R, K+1]
            batch.set_input_ids(table.view(-1)[e[o + 2 * R :]])
        else:
            drafts = e[o + R : o + R + R * K].view(R, K)
        t_fwd = time.perf_counter()
        logits = hf.run_packed(
            self.forward, self.main, self.cache, batch, self.attention, self.route
        )
        forward_seconds = time.perf_counter() - t_fwd
        stats.main_passes += 1
        # 4) accept (batched over rows, on the device)
        best = logits.argmax(dim=-1)[index]  # [R, K+1]
        bad_main = nonfinite(logits)[index].any(dim=1)  # [R]
        if self.forced_acceptance is not None:
            acc = forced_accept(counts_t, best, self.forced_acceptance, gen)
        elif keyed:  # the main model's keyed draw at each position; drafts kept while equal
            p = warp_probs(logits[index], params)  # [R, K+1, V]
            keys = e[o + R + R * K :].view(R, K + 1)
            acc = keyed_accept(drafts, p, counts_t, keys)
        elif params.do_sample:  # a draft model's sampled drafts: rejection sampling
            p = warp_probs(logits[index], params)  # [R, K+1, V]
            acc = speculative_accept(drafts, prop.probs[:, :K], p, counts_t, gen)
        else:
            acc = greedy_accept_ids(drafts, best, counts_t)
        read = [acc.accepted, acc.next_tokens, bad_main.long()]
        model_drafts = host_drafts is None
        if model_drafts:
            read += [prop.bad.long(), drafts.reshape(-1)]
        host = torch.cat(read).tolist()  # host read: the one per-step sync
        accepted, next_tokens = host[:R], host[R : 2 * R]
        step, where = len(stats.steps), f"step {len(stats.steps)}"
        raise_if_nonfinite(host[2 * R : 3 * R], self.main, "main", rows, where)
        if model_drafts:
            raise_if_nonfinite(host[3 * R : 4 * R], self.drafter.model, "draft", rows, where)
            flat = host[4 * R :]
            host_drafts = [flat[r * K : r * K + counts[r]] for r in range(R)]
        t_end = time.perf_counter()
        # 5) commit: main keeps [last, d_1..d_a]; the draft rolls back to its valid prefix
        for r, s in enumerate(act):
            state.main_len[s] += accepted[r] + 1
        if model_drafts:
            self.drafter.commit(act, accepted)
        state.append(act, [[*host_drafts[r][: accepted[r]], next_tokens[r]] for r in range(R)])
        # 6) statistics -> policy
        draft_tokens = sum(prop.pass_tokens) if prop is not None else 0
        rec = StepRecord(
            max(k_rows),
            rows,
            counts,
            accepted,
            t_verify - t_start,
            t_end - t_verify,
            verify_tokens=batch.real,
            padding_tokens=batch.tokens - batch.real,
            draft_tokens=draft_tokens,
            forward_seconds=forward_seconds + (prop.forward_seconds if prop else 0.0),
            step_seconds=time.perf_counter() - t_start,
        )
        stats.steps.append(rec)
        if prop is not None:
            stats.draft_passes += prop.passes
        if self.drafter is not None:
            policy.update(
                policies.StepStats(
                    draft_length=rec.draft_length,
                    accepted=accepted,
                    drafted=counts,
                    draft_seconds=rec.draft_seconds,
                    verify_seconds=rec.verify_seconds,
                    step=step,
                    rows=rows,
                    verify_tokens=batch.tokens,
                    draft_pass_tokens=prop.pass_tokens if prop is not None else (),
                )
            )

    def _compact(self, state) -> None:
        """Finished rows cost a packed pass nothing (they bring no tokens), but they keep
        their cache rows and lengths: once at least half the cache's rows are finished,
        the live rows move to the front in place (amortised: each compaction at least
        halves the rows, so a row is moved O(1) times on average). Never with static
        shapes (CUDA graphs), whose buffers must not change shape."""
        if self.bucket is not None:
            return
        n = self.cache.batch_size
        keep = state.active()
        if not keep or 2 * (n - len(keep)) < n:
            return
        self.cache.compact(keep)
        if isinstance(self.drafter, ModelDrafter):
            self.drafter.compact(keep)
        state.compact(keep)

    def generate_text(
        self, texts: Sequence[str], tokenizer, *, chat: bool | None = None, **kw
    ) -> list[str]:
        """Strings in, strings out: tokenizes (with the chat template when the tokenizer
        has one, unless ``chat=False``), generates, decodes the new tokens.

        ``stop_strings`` (in ``kw`` or the config) stop rows as in :meth:`generate`, and
        the returned text of a row that a stop string ended is cut right before the
        stop string (it is not included, as vLLM's default)."""
        texts = options.check("texts", texts, where="generate_text()")
        options.check("text_tokenizer", tokenizer, where="generate_text()")
        chat = options.check_keywords("generate_text()", chat=chat)["chat"]
        has_template = getattr(tokenizer, "chat_template", None) is not None
        if chat and not has_template:
            raise options.fail(
                "chat", chat, "False or None: this tokenizer has no chat template",
                where="generate_text()",
            )  # fmt: skip
        chat = has_template if chat is None else chat
        from .models import encode_prompt

        prompts = [encode_prompt(tokenizer, t, chat) for t in texts]
        if kw.get("eos_token_id") is None and self.generate_defaults.get("eos_token_id") is None:
            kw["eos_token_id"] = tokenizer.eos_token_id  # after an explicit one, the config's
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
