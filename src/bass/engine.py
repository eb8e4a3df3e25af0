"""The BASS decode loop: lengths -> propose -> verify -> accept -> commit -> learn, for a batch.

:class:`Generator` runs batched speculative decoding on unmodified transformers causal LMs
(attention routed through :mod:`bass.hf`, every pass packed by :mod:`bass.packing`, the
device's needs decided once by :mod:`bass.backends`). Reading it top to bottom:

- :meth:`Generator.generate` checks its arguments (:mod:`bass.options`) and runs
  ``_generate``: a prompt takes a cache *slot*; waiting prompts take the slots of finished
  rows, their prefill riding in the next verify pass (:mod:`bass.scheduler`).
- ``Generator._step`` is one step for the *active rows*, six numbered phases over explicit
  state (:class:`bass.batch_state.BatchState`): 1) **lengths**, the drafter's offer and
  the policy's per-row draft lengths and early stop; 2) **propose**, the drafter's tokens
  (:mod:`bass.drafters`); 3) **verify**, every row's ``[last, d_1..d_n]`` in ONE packed
  main pass (:mod:`bass.verify`); 4) **accept** on the device, then the step's one host
  read (:mod:`bass.sampling`); 5) **commit**, the drafter keeps its accepted drafts and
  rows append them plus one main-model token; 6) **learn**, one
  :class:`~bass.stats.StepRecord` for the statistics and the policy's ``update``.
- The hooks the step calls, and the data they exchange: :mod:`bass.hooks`; the terms and
  the bookkeeping invariant: docs/concepts/engine.md.
"""

from __future__ import annotations

import inspect
import time
import warnings
from collections.abc import Iterator, Sequence

import torch

from . import backends, compat, compiled, hf, locking, models, options, policies, scheduler
from .batch_state import NonFiniteLogitsError
from .cache import RaggedKVCache
from .distributed import coordinator_for
from .drafters import make_drafter
from .hooks import DraftContext, Drafter, Proposal, StepView
from .ops import length_checks, resolve
from .options import generator_defaults
from .repetition import SeenTokens
from .sampling import generator_seed
from .stats import FinishedRow, GenerationResult, GenerationStats, StepRecord
from .stopping import decode_rows
from .verify import (
    accept,
    check_offer,
    check_passes,
    check_proposal,
    draft_keys,
    read_step,
    verify_pass,
)

__all__ = ["Generator", "NonFiniteLogitsError"]


def _policy_spec(policy, policy_options, cfg_gen: dict) -> tuple:
    """``(policy, its options)``: the arguments over the config's (``cfg_gen``). The
    file's ``[policy.options]`` are its policy's: merged under the options given when the
    policy is the file's (as the CLI's ``--policy-option``), dropped, with a warning, for
    another policy."""
    file_policy = cfg_gen.get("policy", policies.DEFAULT)
    file_options = cfg_gen.get("policy_options") or {}
    if policy is None:
        policy = file_policy
    if isinstance(policy, str) and policy == file_policy:
        return policy, {**file_options, **(policy_options or {})}
    if file_options:
        theirs = ", ".join(sorted(file_options))
        warnings.warn(
            f"Generator(): the config's [policy.options] ({theirs}) are for the policy "
            f"{file_policy!r}, not {policy!r}: not used",
            UserWarning,
            stacklevel=3,
        )
    return policy, dict(policy_options or {})


def _check_before_loading(cls, kw: dict) -> None:
    """``Generator.from_pretrained``'s keywords for the Generator checked before any model
    loads (a hub model: minutes, gigabytes): unknown names, each value, the config file,
    the policy with its options."""
    known = set(inspect.signature(cls.__init__).parameters) - {"self", "main", "draft"}
    unknown = sorted(set(kw) - known)
    if unknown:
        raise TypeError(f"Generator.from_pretrained() got unexpected keyword arguments: {unknown}")
    where = "Generator.from_pretrained()"
    checked = options.check_keywords(
        where, **{k: v for k, v in kw.items() if k in options.OPTIONS and k != "config"}
    )
    cfg_gen = {}
    if kw.get("config") is not None:
        cfg_gen = options.read_config(kw["config"]).generator_kwargs()
    with warnings.catch_warnings():  # said once, by the Generator itself
        warnings.simplefilter("ignore")
        spec = _policy_spec(checked.get("policy"), checked.get("policy_options"), cfg_gen)
    policies.make(*spec)  # a policy that cannot be built: refused before loading


class Generator:
    """Batched speculative decoding with a main model and a draft model (or n-grams).

    Args:
        main: a transformers causal LM (Llama, Mistral, Qwen2, Qwen3, ... any decoder whose
            attention goes through transformers' AttentionInterface).
        draft: a smaller causal LM with the same vocabulary; ``"ngram"`` for prompt-lookup
            drafting (or a configured :class:`bass.drafters.NGramDrafter`, e.g.
            ``NGramDrafter(max_ngram=4, siblings=False)``); a :class:`bass.drafters.Drafter`
            of yours, or the name of one installed under the ``bass.drafters`` entry points;
            or ``None`` for regular (non-speculative) decoding.
        policy: a draft-length policy name from :func:`bass.policies.available` or a
            policy instance; ``policy_options`` are its keyword options.
        attention: the packed attention implementation (``"auto"``, ...: ``bass ops`` lists them).
        forced_acceptance: BENCHMARKING ONLY. Accept each drafted token with this
            probability regardless of the models (the main model's argmax follows):
            random-weight models timed at a known acceptance (``stats.forced_acceptance``).
        config: a TOML file path (a :class:`bass.config.Config`, a dict): its
            ``[policy]``, ``[generation]`` and ``[model]`` (``chat`` for generate_text)
            are the defaults; arguments given explicitly win (``compile=False`` too). Its
            ``[policy.options]`` belong to its policy: kept when ``policy=`` names the
            same one, left out when it names another (as on the command line).
        compile: ``True`` compiles the per-step forward (every packed pass after the
            prefill) with ``torch.compile(fullgraph=True)``; a backend name or callable
            selects the backend. ``"reduce-overhead"`` compiles it with Inductor's
            CUDA graphs (``mode="reduce-overhead"``) and turns on ``static_shapes``.
        static_shapes: pass shapes that a CUDA graph can replay: token counts padded to
            :data:`bass.packing.TOKEN_BUCKETS`, the cache never compacted nor reallocated
            (docs/concepts/engine.md, "Static shapes"). Default: on with
            ``compile="reduce-overhead"``, else off (eager passes compute real tokens only).
        prefill_chunk_tokens: the most tokens one prefill pass feeds (a prompt may span passes).
        cpu_linear: models on a CPU (:class:`bass.backends.CPUBackend`): ``"auto"``
            (default): each linear layer's matrix product in the layout measured fastest
            for the pass's row count, a packed copy of the weights where memory allows
            (docs/guides/performance.md); ``"unpacked"``: the copy-free layouts only;
            ``"torch"``: ``F.linear`` as is. Ignored off the CPU.
        backend: a :class:`bass.backends.Backend` instead of the one chosen for the main
            model's device (e.g. ``CPUBackend(memory_share=0.25)``).
        draft_sampling: how a sampling drafter's tokens are drawn and verified:
            ``"coupled"`` (default: each with the keyed draw of the position it would
            take, kept while it equals the main model's; every sampled row equals plain
            sampling with the same seed) or ``"rejection"`` (rejection sampling; which
            sample comes out depends on the batch): docs/concepts/exactness.md.
        shared_vocab: the tokenizer's length, for a draft whose logits differ by padding only.

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
        policy: str | policies.Policy | None = None,
        policy_options: dict | None = None,
        attention: str | None = None,
        compile: bool | str | object | None = None,
        config=None,
        forced_acceptance: float | None = None,
        static_shapes: bool | None = None,
        prefill_chunk_tokens: int = 8192,
        cpu_linear: str | None = None,
        shared_vocab: int | None = None,
        backend: backends.Backend | None = None,
        draft_sampling: str | None = None,
    ):
        # types and ranges first, before any work (bass.options, as the config file's), in
        # the signature's order, config last
        given = dict(locals())
        for name in ("self", "draft", "backend", "config"):
            del given[name]
        checked = options.check_keywords("Generator()", **given, config=config)
        if shared_vocab is not None and not isinstance(draft, torch.nn.Module):
            why = f"None: it applies to a draft model (logits padded), not draft={draft!r}"
            raise options.fail("shared_vocab", shared_vocab, why, where="Generator()")
        policy_options, shared_vocab = checked["policy_options"], checked["shared_vocab"]
        forced_acceptance = checked["forced_acceptance"]
        prefill_chunk_tokens = checked["prefill_chunk_tokens"]
        # 1) settings: explicit arguments (None: not given) > the config file > defaults
        cfg_gen, self.generate_defaults, self.chat_default = generator_defaults(config, main)
        policy, policy_options = _policy_spec(policy, policy_options, cfg_gen)
        models.warn_unapplied(main)  # penalties in its generation_config: said, not applied

        def setting(name, given):  # given > the config file's > the declared default
            return given if given is not None else cfg_gen.get(name, options.OPTIONS[name].default)

        compile, cpu_linear = setting("compile", compile), setting("cpu_linear", cpu_linear)
        draft_sampling = setting("draft_sampling", draft_sampling)
        self.draft_sampling, self.coupled = draft_sampling, draft_sampling == "coupled"
        self.backend = backends.select_backend(main.device, cpu_linear, backend)
        self.main, self.forced_acceptance = main, forced_acceptance
        self.attention = setting("attention", attention)
        if self.attention != "auto":  # it must run on the main model's device
            resolve(self.attention, main.device)  # raises saying why not
        # 2) the policy (checked now, not mid-generation) and the drafter
        self.policy_spec = (policy, dict(policy_options or {}))
        self.new_policy()
        # its hooks' failures named as its own when it is another package's (bass.plugins)
        self._drafting: Drafter | None = make_drafter(draft, main, shared_vocab)
        # 3) how passes run: compiled or not, static shapes, the device's tuning
        with locking.exclusive("Generator()"):  # not while a generation runs on them
            self.backend.prepare(self.models)
        self.passes, self._compiled = compiled.passes_for(
            self.backend, compile, static_shapes, self.attention, prefill_chunk_tokens
        )
        # 4) scale-out: a tensor-parallel main model's group takes host decisions once,
        #    on its first rank (bass.distributed); a model not sharded: nothing to share
        self.coord = coordinator_for(main)

    @property
    def drafter(self) -> Drafter | None:
        """The drafter: the one given (a draft model's :class:`bass.drafters.ModelDrafter`,
        an n-gram drafter, yours), or ``None`` for regular decoding."""
        return getattr(self._drafting, "inner", self._drafting)

    @property
    def models(self) -> list[torch.nn.Module]:
        """The main model, then the draft model if there is one."""
        draft = self.drafter.model if self.drafter is not None else None
        return [self.main] + ([draft] if draft is not None else [])

    @property
    def prefill_chunk_tokens(self) -> int:
        return self.passes.chunk_tokens

    @classmethod
    def from_pretrained(
        cls,
        main: str,
        draft: str | None = None,
        *,
        dtype=None,
        device=None,
        tp_size: int = 1,
        **kw,
    ):
        """Load main (and draft) models by Hugging Face name or local path. Where the two
        models' logit counts differ, their tokenizers are compared: one tokenizer with
        embedding matrices padded to different sizes (Qwen2.5 7B+ with 0.5B-3B) sets
        ``shared_vocab``; different tokenizers are refused. ``draft`` may also name an
        installed drafter (``"ngram"``).

        ``tp_size > 1`` (under ``torchrun``): the main model is sharded over that many
        ranks by transformers' own tensor-parallel plan (a size that does not divide its
        heads is refused before loading), the draft model replicated on every rank; every
        rank then calls :meth:`generate` with the same arguments (:mod:`bass.distributed`).
        """
        from .models import load_pair

        main, draft, dtype, device = options.pretrained_arguments(
            main, draft, dtype, device, kw.get("config")
        )
        _check_before_loading(cls, kw)
        main_model, draft_model, padded = load_pair(main, draft, dtype, device, tp_size)
        if kw.get("shared_vocab") is None:
            kw["shared_vocab"] = padded
        return cls(main_model, draft_model, **kw)

    def new_policy(self):
        """A fresh policy as configured (:func:`bass.policies.make`); a named plugin is
        looked up once per ``policy_spec`` (:func:`bass.policies.maker`). An instance is
        compared by identity (a dataclass policy's ``==`` compares its fields)."""
        spec = (self.policy_spec[0], dict(self.policy_spec[1]))
        made = self.__dict__.get("_policy_maker") or ((None, None), None)
        if made[0] != spec if isinstance(spec[0], str) else made[0][0] is not spec[0]:
            made = self._policy_maker = (spec, policies.maker(*spec))
        return made[1]()

    # ----------------------------------------------------------------- generation

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int | None = None,
        do_sample: bool | None = None,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        min_p: float | None = None,
        repetition_penalty: float | None = None,
        frequency_penalty: float | None = None,
        presence_penalty: float | None = None,
        eos_token_id: int | Sequence[int] | None = None,
        seed: int | None = None,
        time_budget: float | None = None,
        stop_sequences: Sequence[Sequence[int]] | None = None,
        stop_strings: str | Sequence[str] | None = None,
        tokenizer=None,
        on_step=None,
        row_ids: Sequence[int] | None = None,
        n: int | None = None,
        max_rows: int | None = None,
        kv_budget_gib: float | None = None,
        on_finish=None,
        logprobs: bool | str | None = None,
        prompt_logprobs: bool | None = None,
    ) -> GenerationResult:
        """Generate up to ``max_new_tokens`` for every prompt (token-id lists, any lengths,
        any number of them).

        Greedy output equals the main model's own greedy decoding token for token; sampled
        output follows the main model's (temperature/top-k/top-p/min-p warped) distribution
        exactly; penalties change both (:mod:`bass.repetition`). A row also stops
        after its new tokens end with one of ``stop_sequences`` (token-id lists; the stop
        sequence is kept, as eos is), or once the text of its new tokens (decoded with
        ``tokenizer``, special tokens skipped) contains one of ``stop_strings``: it ends
        with the token that completes the stop string, even when a step accepted more tokens
        after it, and keeps the tokens that spell it (generate_text cuts the text before
        it). ``time_budget`` (seconds) stops a row where it is once that long has passed
        since it started (its prefill). ``result.finish_reasons`` says which rows ended how;
        ``logprobs`` (``"raw"`` or ``True``, ``"processed"``) adds each new token's
        log-probability, ``prompt_logprobs`` each prompt token's. A keyword passed as
        ``None`` counts as not given: the config's applies.

        **Continuous batching** (:mod:`bass.scheduler`): at most ``max_rows`` rows run at
        once, no more than ``kv_budget_gib`` GiB of KV caches hold; a finished row's slot goes
        to the next waiting prompt, in order. No row depends on when it was admitted.
        ``on_finish`` gets each :class:`bass.FinishedRow` as it finishes (:meth:`stream`).

        ``on_step`` is called with ``(generator, state)`` after each step (tests use it to
        check the bookkeeping invariant). ``row_ids``: one int >= 0 per prompt that keys its
        sampled draws with the seed (default: its index): a job split over calls or ranks
        (:func:`bass.distributed.generate`) draws the same samples as one call when each row
        keeps its global index. ``n``: samples per prompt (rows ``i*n .. i*n+n-1`` of the
        result are prompt ``i``'s; ``FinishedRow.prompt`` counts rows).

        Runs under ``torch.inference_mode`` (``torch.no_grad`` for models FSDP wraps:
        :func:`bass.compat.generation_mode`). With a tensor-parallel main model every rank
        of its group must call this with the same arguments (checked); the group's first
        rank takes every host decision (draft lengths, early stops, the time budget, the
        seed, the rows at once) and shares it (:mod:`bass.distributed`).
        """
        return self._drain(self._job(prompts, locals()), on_finish)

    def _drain(self, job: scheduler.Job, on_finish=None) -> GenerationResult:
        rows = self._run(job)
        try:
            while True:
                try:
                    row = next(rows)
                except StopIteration as done:
                    return done.value
                if on_finish is not None:
                    on_finish(row)
        finally:  # a callback that raised: the generation unwinds here, not at collection
            rows.close()

    def stream(self, prompts: Sequence[Sequence[int]], **kw) -> Iterator[FinishedRow]:
        """:meth:`generate` as an iterator of each :class:`bass.FinishedRow` as it finishes,
        checked when called, run while iterated (holding the generation lock,
        :mod:`bass.locking`, until exhausted or closed; the loop's body in its grad mode)."""
        if "on_finish" in kw:
            raise TypeError("stream() yields each finished row; on_finish is generate()'s")
        job = self._job(prompts, {"self": self, **kw}, "stream")
        return self._run(job._replace(keep=False))  # each row released once handed over

    _KEYWORDS = frozenset(inspect.signature(generate).parameters) - {"self", "prompts"}

    def _job(self, prompts, given: dict, call: str = "generate") -> scheduler.Job:
        given = {k: v for k, v in given.items() if k not in ("self", "prompts")}
        defaults, keywords = self.generate_defaults, self._KEYWORDS
        return scheduler.Job.check(prompts, given, defaults, self.models, keywords, call)

    def _run(self, job: scheduler.Job):
        """The generation of ``job``, as a generator of :class:`FinishedRow` that returns
        the :class:`GenerationResult`."""
        models = self.models
        # one at a time per process (bass.locking); the models handed back as they came
        with locking.exclusive(f"{job.call}()"), hf.attention_restored(models) as theirs:
            try:
                for model, role in zip(models, ("main", "draft")):  # a window is checked
                    hf.prepare(model, job.need, role)  # against the real positions
                self.backend.refresh(models)  # weights may have changed since, in any way
                if self._compiled is not None:  # a compiled region checks the modules too
                    self._compiled.check(models)
                # ids a pass may take, and the logits' width (read again: resized too)
                self.vocab = self.main.get_input_embeddings().weight.shape[0]
                self.width = self.main.get_output_embeddings().weight.shape[0]
                self.coord.agree_generation(job.prompts, job.kw, job.row_ids)  # TP ranks
                work = scheduler.named_by_prompt(job, self._generate(job, theirs))
                mode = compat.generation_mode(models)  # (reads every module: once)
                try:  # grad mode, no host-side length checks (valid by construction: tests
                    while True:  # check the invariant every step): the work's, not the caller's
                        with length_checks(False), mode:
                            try:
                                row = next(work)
                            except StopIteration as done:
                                return done.value
                        yield row  # the caller's code runs in its own grad mode
                        locking.resumed()  # (on whichever thread reads the stream on)
                finally:
                    work.close()
            finally:  # hand the caches' memory back (a training step may want it)
                self.cache = None
                if self._drafting is not None:
                    self._drafting.finish()

    def _generate(self, job: scheduler.Job, theirs: list):
        device = self.main.device
        kw, prompts = job.kw, job.prompts
        seed, time_budget, on_step = kw["seed"], kw["time_budget"], kw["on_step"]
        if seed is None:  # from torch's global generator: torch.manual_seed governs it
            seed = self.coord.share([int(torch.randint(0, 2**62, (1,)).item())])[0]
        # the draft model's sampling and verification (the seed also keys every sampled
        # position with the row ids: position_keys)
        gen = torch.Generator(device=device).manual_seed(generator_seed(seed, job.row_ids))
        hooks = policies.bind(self.new_policy())  # the policy's hooks, resolved once
        t0 = time.perf_counter()
        stats = GenerationStats(rows=len(prompts), forced_acceptance=self.forced_acceptance)
        stats.backend, stats.keep_steps = self.backend.describe(), job.keep
        stats.attention = self.passes.attention(device, self.main)
        for model in self.models[1:]:  # the draft model's passes, where they differ
            for kind, pick in self.passes.attention(device, model).items():
                if pick != stats.attention.get(kind):
                    stats.attention[f"draft {kind}"] = pick
        self.stats = stats  # the running generation's statistics (on_step callbacks read it)
        # 1) the rows at once (slots): max_rows, and what the KV budget holds
        slots = scheduler.rows_at_once(job, self.models, device, self.coord.share, stats)
        state = job.new_state(slots)
        n_layers = self.main.config.get_text_config().num_hidden_layers
        self.cache = RaggedKVCache(slots, job.max_len, n_layers, device)
        if self.drafter is not None:
            n = self._drafting.start(state, self.passes, job.max_len, device)
            stats.draft_passes += check_passes(self._drafting, "start", n)
        seen = SeenTokens.start(job.params, slots, self.width, device)
        queue, sampling = scheduler.Queue(len(prompts)), (job.params, gen, seed, seen)

        # 2) steps until every row has finished: waiting prompts take the slots of finished
        #    rows (their prefill first), rows past their time budget stop where they are
        while True:
            yield from self._hand_over(state, job.keep, queue, theirs)  # before a prefill fails
            first = stats.admissions == 0
            # admitted rows: prefilled now, or riding in this step's verify pass (fill)
            fill = scheduler.admit_waiting(self, state, queue, sampling, stats)
            if first and stats.admissions and self.passes.bucket is not None:  # CUDA graphs:
                for cache in (self.cache, getattr(self.drafter, "cache", None)):  # the first
                    for buf in cache.buffers() if isinstance(cache, RaggedKVCache) else ():
                        torch._dynamo.mark_static_address(buf)  # prefill's must not move
            slots = [s for s in state.active() if s not in fill]  # running ones, in time:
            slots = queue.expire(state, slots, time_budget, self.coord.share)
            yield from self._hand_over(state, job.keep, queue, theirs)  # first token, time
            if not slots:
                if fill:  # no verify pass to ride in after all: a prefill pass of their own
                    scheduler.prefill(self, state, fill, sampling, stats, admitted=True)
                if queue or fill:
                    continue
                break
            self._step(state, hooks, sampling, stats, slots, len(queue.waiting), fill)
            if not queue:  # a slot no prompt will take again: compaction may drop it
                self._compact(state)
            if on_step is not None:
                t = time.perf_counter()
                on_step(self, state)
                queue.paused += time.perf_counter() - t
        stats.stopped_by_time_budget = "time" in state.reasons
        stats.wall_seconds = time.perf_counter() - t0
        stats.tokens_generated = state.tokens  # counted as rows were handed over
        return GenerationResult(stats=stats, **state.results(job.keep))

    def _hand_over(self, state, keep: bool, queue, theirs: list):
        """The finished rows to the caller, if any; the time its code takes with them (a
        stream's loop body, ``on_finish``) is no row's time budget (``queue.paused``); the
        models have their own attention meanwhile (``theirs``, :func:`bass.hf.handed_back`)."""
        if not state.finished:
            return
        t = time.perf_counter()
        with hf.handed_back(self.models, theirs):
            yield from scheduler.hand_over(state, keep)
        queue.paused += time.perf_counter() - t

    def _step(self, state, hooks, sampling, stats, slots, waiting: int, fill=()) -> None:
        """One speculative step for the active rows ``slots`` (``waiting`` prompts wait for a
        slot; ``fill``: rows just admitted, whose prefill rides in the verify pass): lengths
        -> propose -> verify -> accept -> commit -> learn (docs/concepts/engine.md)."""
        t_start = time.perf_counter()
        params, gen, seed, seen = sampling
        prompts = [state.prompt_of[s] for s in slots]
        caps = tuple(state.remaining(s) - 1 for s in slots)  # (main model: +1); no plugin edits
        view = StepView(slots, prompts, caps, state, params, gen, agree=self.coord.share_mask)
        view.penalty = seen
        drafter, step = self._drafting, stats.step_count
        # 1) lengths: what the drafter has (n-grams), then the policy's lengths and stop
        lengths, ctx = [0] * len(slots), None
        if drafter is not None:
            view.offer = offer = drafter.offer(view)
            found, match = check_offer(drafter, offer, len(slots)) or (None, None)
            ctx = DraftContext(prompts, caps, drafter.name, found, match, step, waiting)
            lengths = hooks.draft_lengths(ctx)  # capped; an n-gram proposes what it found
        lengths = self.coord.share(lengths)  # a TP group: its leader's
        # 2) propose: up to lengths[r] tokens per row (a sampling drafter draws coupled)
        sampled = params.do_sample and self.forced_acceptance is None
        prop, coupled = Proposal.none(slots), sampled and self.coupled
        if any(lengths):
            view.stop = hooks.early_stop(ctx)
            view.keys = draft_keys(state, slots, max(lengths), seed, self.main) if coupled else None
            prop = drafter.propose(view, list(lengths))  # a copy: checked against ours
            prop = check_proposal(drafter, prop, lengths, params, (self.vocab, self.width), coupled)
        t_verify = time.perf_counter()
        # 3) verify [last, d_1..d_n] of every active row in ONE packed main pass
        keyed = sampled and (coupled or prop.probs is None)  # else rejection sampling
        v = verify_pass(self, state, slots, prop, keyed, seed, fill)
        t_fwd = time.perf_counter()
        logits = self.passes.run(self.main, self.cache, v.batch)
        forward_seconds = time.perf_counter() - t_fwd
        if v.copies:  # new rows whose prompt another new row fed: its cache row copied
            self.cache.copy_prefix(*v.copies)
        # 4) accept (on the device), then the step's one host read (+ new rows' first tokens)
        scores = seen and seen.verify_scores(logits[: v.n], v, state, slots)  # (penalised)
        acc = accept(v, logits, prop, params, gen, self.forced_acceptance, scores)
        tail = scheduler.first_read(state, fill, logits[v.n : v.n + v.filled], sampling)
        accepted, rows, conf, first, lp = read_step(acc, logits, v, prop, prompts, step, self, tail)
        t_end = time.perf_counter()
        # 5) commit: the drafter keeps its accepted drafts; rows append [d_1..d_a, next]
        if drafter is not None:
            drafter.commit(prop, accepted)
        state.append(slots, rows, lp)
        if fill:  # the new rows' first tokens (raises on their non-finite logits)
            scheduler.take_first(self.main, state, fill, first)
            stats.riding_admissions += 1
        # 6) learn: the step's one record, for the statistics and the policy
        rec = StepRecord(
            max(lengths, default=0),
            accepted,
            prop.drafted,
            t_verify - t_start,
            t_end - t_verify,
            step,
            prompts,
            verify_tokens=v.n,
            prefill_tokens=v.batch.real - v.n,
            padding_tokens=v.batch.tokens - v.batch.real,
            draft_pass_tokens=prop.pass_tokens,
            forward_seconds=forward_seconds + prop.forward_seconds,
            step_seconds=time.perf_counter() - t_start,
            confidence=conf,
        )
        stats.record(rec)
        stats.main_passes += 1
        stats.draft_passes += prop.passes
        if drafter is not None:
            hooks.update(rec)

    def _compact(self, state) -> None:
        """Once at least half the cache's slots are finished, the live rows move to the
        front in place (docs/concepts/engine.md, step 5); never with static shapes."""
        if self.passes.bucket is not None:
            return
        keep, n = state.active(), self.cache.batch_size
        if not keep or 2 * (n - len(keep)) < n:
            return
        self.cache.compact(keep)
        if self.drafter is not None:
            self._drafting.compact(keep)
        state.compact(keep)

    def generate_text(
        self, texts: Sequence[str], tokenizer, *, chat: bool | None = None, **kw
    ) -> list[str]:
        """Strings in, strings out: tokenizes (with the chat template when the tokenizer
        has one, unless ``chat=False``), generates, decodes the new tokens.

        ``stop_strings`` (in ``kw`` or the config) stop rows as in :meth:`generate`, and
        a row a stop string ended is cut right before it (as vLLM's default); ``logprobs``
        only with ``on_finish`` (its rows carry them; the texts do not)."""
        if chat is None:
            chat = self.chat_default  # the config's [model].chat, if any
        texts, chat = options.text_arguments(texts, tokenizer, chat, kw)
        prompts = [models.encode_prompt(tokenizer, t, chat) for t in texts]
        if kw.get("eos_token_id") is None and self.generate_defaults.get("eos_token_id") is None:
            kw["eos_token_id"] = models.default_eos(tokenizer, self.main)  # after explicit, config
        kw.setdefault("tokenizer", tokenizer)
        job = self._job(prompts, kw, "generate_text")  # (n rows per text with n)
        res, stops = self._drain(job, kw.get("on_finish")), kw.get("stop_strings")
        stops = self.generate_defaults.get("stop_strings") if stops is None else stops
        return decode_rows(tokenizer, res, stops, job.prompts)
