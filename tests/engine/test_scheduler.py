"""Continuous batching (:mod:`bass.scheduler`): at most ``max_rows`` rows run at once and
waiting prompts take the slots of finished ones; nothing a row generates depends on when
it was admitted or who shared its steps."""

from __future__ import annotations

import re
import time

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from models import perturbed
from profiles import examples

from bass import FinishedRow, Generator
from bass.batch_state import BatchState
from bass.drafters import ModelDrafter
from bass.options import OptionError
from bass.scheduler import Queue
from bass.testing import assert_greedy_equivalent, greedy_reference
from bass.testing.strategies import ragged_prompts

VOCAB = 64
MAX_NEW = 10
DRAFTS = ["none", "ngram", "same", "perturbed"]


def check_slots(gen, state):
    """After every step: each active slot holds its prompt's own list, and the caches'
    lengths are the row's (the main cache: all but the newest token; a draft cache: a
    prefix of the row, never its newest token)."""
    for s in state.active():
        p = state.prompt_of[s]
        assert state.seqs[s] is state.by_prompt[p]
        assert state.cache_lens()[s] == len(state.seqs[s]) - 1
        if isinstance(gen.drafter, ModelDrafter):
            assert 0 < state.draft_lens[s] <= len(state.seqs[s]) - 1
    assert len(state.active()) <= gen.stats.max_rows


def with_copies(prompts, copies):
    """Each prompt ``copies`` times side by side (the samples of one prompt)."""
    return [list(p) for p in prompts for _ in range(copies)]


@settings(max_examples=examples(10), suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    prompts=ragged_prompts(VOCAB, max_rows=5, max_len=16),
    copies=st.integers(1, 3),
    rows=st.integers(1, 4),
    draft=st.sampled_from(DRAFTS),
    eos_pick=st.none() | st.integers(0, 50),
    chunk=st.sampled_from([8192, 5]),
)
def test_rows_admitted_later_equal_the_main_models_own(
    llama, drafts, prompts, copies, rows, draft, eos_pick, chunk
):
    prompts = with_copies(prompts, copies)
    gen = Generator(llama, drafts[draft], prefill_chunk_tokens=chunk)
    kw = {}
    if eos_pick is not None:  # one row's own token: rows end at different steps
        row = greedy_reference(llama, prompts[eos_pick % len(prompts)], MAX_NEW)
        kw["eos_token_id"] = row[2 + eos_pick % (MAX_NEW - 4)]
    res = assert_greedy_equivalent(gen, prompts, MAX_NEW, max_rows=rows, on_step=check_slots, **kw)
    assert res.stats.max_rows == min(rows, len(prompts))
    assert res.stats.admissions >= -(-len(prompts) // rows)
    assert res.stats.tokens_generated == sum(map(len, res.sequences))


@settings(max_examples=examples(8), suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    prompts=ragged_prompts(VOCAB, max_rows=5, max_len=12),
    copies=st.integers(1, 3),
    rows=st.integers(1, 3),
    draft=st.sampled_from(DRAFTS),
)
def test_seeded_samples_do_not_depend_on_admission_order(
    llama, drafts, prompts, copies, rows, draft
):
    prompts = with_copies(prompts, copies)
    gen = Generator(llama, drafts[draft])
    kw = dict(max_new_tokens=MAX_NEW, do_sample=True, seed=11)
    together = gen.generate(prompts, **kw).sequences
    assert gen.generate(prompts, max_rows=rows, **kw).sequences == together
    # the job reversed (each row keeping its id): admitted in the other order
    n = len(prompts)
    back = gen.generate(prompts[::-1], row_ids=list(range(n))[::-1], max_rows=rows, **kw)
    assert back.sequences[::-1] == together


RIDING = [[1, 2, 3], [4, 5], [6, 7, 8, 9, 10, 11], [12], [13, 14], [15, 16, 17]]


def _row_ender(llama, prompt):
    """An eos that ends the row of ``prompt`` after three tokens (others run on)."""
    return greedy_reference(llama, prompt, MAX_NEW)[2]


@pytest.mark.parametrize("draft", DRAFTS)
def test_admitted_prompts_prefill_in_the_verify_pass(llama, drafts, draft):
    """A prompt admitted while other rows run feeds its whole prompt in their next verify
    pass (no prefill pass of its own) and comes out as the main model's own, greedy and
    seeded sampling alike, with the drafters' host drafts and device drafts."""
    gen = Generator(llama, drafts[draft])
    eos = _row_ender(llama, RIDING[0])
    res = assert_greedy_equivalent(
        gen, RIDING, MAX_NEW, max_rows=2, eos_token_id=eos, on_step=check_slots
    )
    assert res.stats.riding_admissions >= 1
    assert res.stats.prefill_passes == res.stats.admissions - res.stats.riding_admissions
    kw = dict(max_new_tokens=MAX_NEW, do_sample=True, seed=5, eos_token_id=eos)
    together = gen.generate(RIDING, **kw)
    one_by_one = gen.generate(RIDING, max_rows=2, **kw)
    assert one_by_one.sequences == together.sequences
    assert one_by_one.stats.riding_admissions >= 1
    # prompts longer than a prefill chunk take prefill passes of their own
    short = Generator(llama, drafts[draft], prefill_chunk_tokens=1)
    res = short.generate(RIDING[:3], max_new_tokens=MAX_NEW, max_rows=2, eos_token_id=eos)
    assert res.stats.riding_admissions == 0 and res.stats.admissions >= 2


def test_riders_whose_pass_never_comes_get_a_prefill_of_their_own(llama, monkeypatch):
    """Rows admitted to ride in the next verify pass, when every running row ends before
    it (their time budget): the riders are prefilled on their own and go on."""
    from bass import scheduler

    expire, ended = Queue.expire, []

    def end_all_once(self, state, slots, budget, share):
        if not ended and len(state.active()) > len(slots):  # riders wait for this pass
            ended.extend(slots)
            for s in slots:
                state.finish(s, "time")
            return []
        return expire(self, state, slots, budget, share)

    monkeypatch.setattr(scheduler.Queue, "expire", end_all_once)
    gen = Generator(llama, "ngram")
    eos = _row_ender(llama, RIDING[0])
    res = gen.generate(RIDING, max_new_tokens=MAX_NEW, max_rows=2, eos_token_id=eos)
    assert ended and res.finish_reasons.count("time") == len(ended)
    for p, (seq, why) in enumerate(zip(res.sequences, res.finish_reasons, strict=True)):
        want = greedy_reference(llama, RIDING[p], MAX_NEW, eos_token_id=eos)
        assert seq == want[: len(seq)] and (why == "time" or seq == want)
    assert res.stats.riding_admissions < res.stats.admissions


def test_stream_hands_each_row_over_when_it_finishes(llama):
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [10], [11, 12]]
    gen = Generator(llama, "ngram")
    whole = gen.generate(prompts, max_new_tokens=MAX_NEW)
    rows = gen.stream(prompts, max_new_tokens=MAX_NEW, max_rows=1)
    first = next(rows)
    assert isinstance(first, FinishedRow) and first.prompt == 0
    admitted = gen.stats.admissions  # the first row came out before the others started
    rest = list(rows)
    assert admitted < gen.stats.admissions == len(prompts)
    got = [first, *rest]
    assert [r.prompt for r in got] == list(range(len(prompts)))  # one at a time: in order
    assert [r.tokens for r in got] == whole.sequences
    assert [r.finish_reason for r in got] == whole.finish_reasons


@pytest.mark.parametrize("draft", ["ngram", "perturbed"])
def test_a_stream_keeps_nothing_of_a_row_it_handed_over(llama, drafts, draft):
    """A stream's memory beyond its prompts is bounded by the rows at once: a handed-over
    row's lists are released (the n-gram drafter holds a prompt group's rows until its
    last sibling ends), and the statistics keep totals and the latest step's record. Rows
    and totals equal generate()'s (a policy that does not time anything)."""
    prompts = with_copies([[1, 2, 3], [4, 5], [6, 7, 8, 9], [10]], 3)
    gen = Generator(llama, drafts[draft], policy="constant", policy_options={"k": 3})
    kw = {"max_new_tokens": MAX_NEW, "max_rows": 2}
    whole = gen.generate(prompts, **kw)
    released = []

    def on_step(g, state):
        check_slots(g, state)
        handed = [p for p, why in enumerate(state.reasons) if why and p not in state.finished]
        assert all(state.outputs[p] is None is state.by_prompt[p] for p in handed)
        released.append(len(handed))

    rows = list(gen.stream(prompts, on_step=on_step, **kw))
    assert released[-1] >= len(prompts) - 2
    assert sorted((r.prompt, r.tokens, r.finish_reason) for r in rows) == list(
        zip(range(len(prompts)), whole.sequences, whole.finish_reasons)
    )
    stats, want = gen.stats, whole.stats
    last, want_last = stats.steps[0], want.steps[-1]
    assert len(stats.steps) == 1 and (last.step, last.accepted) == (
        want_last.step,
        want_last.accepted,
    )
    assert stats.step_count == len(want.steps) == want.step_count > 1
    assert list(stats.draft_lengths) == [s.draft_length for s in want.steps]
    for name in ("tokens_generated", "row_steps", "accepted_tokens", "verify_tokens"):
        assert getattr(stats, name) == getattr(want, name), name
    assert stats.mean_accepted == want.mean_accepted and stats.summary()["steps"] > 1


def test_on_finish_sees_every_row_once_before_generate_returns(llama):
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [10], [11, 12], [3, 3]]
    seen: list[FinishedRow] = []
    res = Generator(llama, llama).generate(
        prompts, max_new_tokens=MAX_NEW, max_rows=2, on_finish=seen.append
    )
    assert sorted(r.prompt for r in seen) == list(range(len(prompts)))
    assert all(r.tokens == res.sequences[r.prompt] for r in seen)


@pytest.mark.parametrize("draft", ["ngram", "same"])
def test_the_callers_code_between_rows_may_run_the_models(llama, drafts, draft):
    """A stream's loop body and ``on_finish`` run the models as transformers does (to
    score or train on a finished row: their own attention, autograd), and the generation
    goes on unchanged; the models ran bass's attention all along before (an error)."""
    import torch

    x = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        want = llama(x).logits
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [10], [11, 12]]
    gen = Generator(llama, drafts[draft])
    whole = gen.generate(prompts, max_new_tokens=MAX_NEW)

    def use(row):
        with torch.no_grad():
            assert torch.equal(llama(x).logits, want)
        llama(x, labels=x).loss.backward()  # a training step's forward and backward
        llama.zero_grad(set_to_none=True)

    rows = []
    for row in gen.stream(prompts, max_new_tokens=MAX_NEW, max_rows=2):
        use(row)
        rows.append(row)
    assert sorted((r.prompt, r.tokens) for r in rows) == list(enumerate(whole.sequences))
    res = gen.generate(prompts, max_new_tokens=MAX_NEW, max_rows=2, on_finish=use)
    assert res.sequences == whole.sequences


def test_admitted_prompts_with_ids_a_padded_draft_cannot_embed():
    """A draft with fewer embedding rows (a padded vocabulary's, ``shared_vocab``) is fed
    id 0 for the main model's ids past its rows, in its prefill at admission too."""
    from models import tiny_lm

    main, draft = tiny_lm(vocab=72), tiny_lm(vocab=64, seed=1)
    gen = Generator(main, draft, shared_vocab=64, policy="constant", policy_options={"k": 2})
    prompts = [[1, 70, 2], [64, 65, 71], [71], [5, 6, 7, 8], [69, 3]]
    assert_greedy_equivalent(gen, prompts, MAX_NEW, max_rows=2)


def test_stream_checks_its_arguments_when_called(llama):
    gen = Generator(llama, None)
    with pytest.raises(OptionError, match="max_rows"):
        gen.stream([[1, 2]], max_new_tokens=3, max_rows=0)
    with pytest.raises(TypeError, match="on_finish"):
        gen.stream([[1, 2]], max_new_tokens=3, on_finish=print)
    with pytest.raises(TypeError, match=r"stream\(\) got unexpected .*bogus"):
        gen.stream([[1, 2]], max_new_tokens=3, bogus=1)
    with pytest.raises(OptionError, match=r"^stream\(\): max_new_tokens=-1"):  # named as called
        gen.stream([[1, 2]], max_new_tokens=-1)
    with pytest.raises(OptionError, match=r"^generate\(\): max_new_tokens=-1"):
        gen.generate([[1, 2]], max_new_tokens=-1)


def test_the_kv_budget_sizes_the_rows_at_once(llama):
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [10], [11, 12]]
    gen = Generator(llama, llama)
    whole = gen.generate(prompts, max_new_tokens=MAX_NEW)
    per_row = whole.stats.kv_bytes_per_row  # the main and the draft model's caches
    assert per_row > 0 and whole.stats.kv_budget_bytes > 0  # the host's available memory
    res = gen.generate(prompts, max_new_tokens=MAX_NEW, kv_budget_gib=2.5 * per_row / 2**30)
    assert res.stats.max_rows == 2 and res.sequences == whole.sequences
    rounded = r"one row of 16 positions \(the longest prompt plus max_new_tokens, rounded up to"
    with pytest.raises(OptionError, match=r"kv_budget_gib=.* " + rounded):  # 4 + 10 = 14
        gen.generate(prompts, max_new_tokens=MAX_NEW, kv_budget_gib=0.5 * per_row / 2**30)
    exact = r"one row of 16 positions \(the longest prompt plus max_new_tokens\)"
    with pytest.raises(OptionError, match=exact) as err:  # 4 + 12 = 16
        gen.generate(prompts, max_new_tokens=12, kv_budget_gib=0.5 * per_row / 2**30)
    # the minimum the message quotes is enough (rounded up, not to nearest)
    least = float(re.search(r"at least (\S+) GiB", str(err.value)).group(1))
    assert gen.generate(prompts, max_new_tokens=12, kv_budget_gib=least).stats.max_rows == 1
    assert res.stats.summary()["kv_budget_gib"] > 0  # a KiB budget is not shown as 0


@pytest.mark.parametrize("nbytes", [65536, 131077, int(1.2345 * 2**30), 2**30, 3 * 2**20 + 1])
def test_the_minimum_budget_quoted_holds_one_row(nbytes):
    """Rounded up to the 3 digits shown: 65536 bytes were quoted as "6.1e-05 GiB", which
    then was refused as too small."""
    from bass.scheduler import _gib_up

    quoted = float(_gib_up(nbytes))
    assert int(quoted * 2**30) >= nbytes and quoted <= nbytes / 2**30 * 1.01


def test_a_tensor_parallel_rank_holds_its_share_of_the_kv_heads(llama, monkeypatch):
    from bass.cache import RaggedKVCache

    whole = RaggedKVCache.bytes_per_token(llama)
    cfg = llama.config.get_text_config()
    heads = cfg.num_key_value_heads or cfg.num_attention_heads
    monkeypatch.setattr(llama, "_tp_size", 2, raising=False)  # as transformers' TP sets it
    assert RaggedKVCache.bytes_per_token(llama) == whole * (heads // 2) // heads
    monkeypatch.setattr(llama, "_tp_size", 4 * heads, raising=False)  # at least one head
    assert RaggedKVCache.bytes_per_token(llama) == whole // heads


def test_the_cpu_kv_budget_is_shared_by_the_local_ranks(monkeypatch):
    from bass.cache import RaggedKVCache

    monkeypatch.setattr("bass.cache._available_memory", lambda: 8 * 2**30)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert RaggedKVCache.default_budget("cpu") == 4 * 2**30  # half the available memory
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # torchrun: 4 processes on this host
    assert RaggedKVCache.default_budget("cpu") == 2**30


def test_time_budget_counts_from_each_rows_start(llama):
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    res = Generator(llama, "ngram").generate(
        prompts, max_new_tokens=MAX_NEW, max_rows=1, time_budget=0
    )
    # each row, admitted after the one before ended, still got its prefill's token
    assert [len(s) for s in res.sequences] == [1, 1, 1]
    assert res.finish_reasons == ["time"] * 3 and res.stats.stopped_by_time_budget
    assert res.stats.admissions == 3


def test_time_the_caller_takes_counts_against_no_rows_budget(llama):
    """While a stream's loop body (or on_finish, or on_step) runs, the generation waits:
    a slow consumer ended the other rows with "time" although nothing was generated
    meanwhile. Row 0 ends first (a stop sequence); row 1 ends as without the waits."""
    prompts = [[1, 2, 3], [4, 5]]
    first = greedy_reference(llama, prompts[0], 2)
    kw = dict(max_new_tokens=MAX_NEW, time_budget=2.0, stop_sequences=[first])
    want = Generator(llama, "ngram").generate(prompts, **kw).finish_reasons
    assert want[0] == "stop" and "time" not in want  # with no one to wait for
    for run in ("stream", "on_finish", "on_step"):
        gen = Generator(llama, "ngram")
        if run == "stream":
            reasons = {}
            for row in gen.stream(prompts, **kw):
                reasons[row.prompt] = row.finish_reason
                time.sleep(2.4)  # the consumer writes the row somewhere slow
            reasons = [reasons[i] for i in range(len(prompts))]
        else:
            pause = 2.4 if run == "on_finish" else 0.3  # on_step: ten steps, 3 s
            slow = {run: lambda *a, pause=pause: time.sleep(pause)}
            reasons = gen.generate(prompts, **kw, **slow).finish_reasons
        assert reasons == want, run


def state_of(prompts, slots):
    return BatchState([list(p) for p in prompts], MAX_NEW, set(), slots=slots)


def test_prompts_take_every_free_slot_in_order_samples_side_by_side():
    """No slot idles while prompts wait: a prompt's samples (equal prompts side by side)
    take consecutive slots as they free up, rather than waiting for room for them all
    (which left slots idle for up to half the steps once ``n`` reached the rows at once)."""
    a, b, c = [1, 2], [3], [4, 5, 6]
    state, queue = state_of([a, a, a, b, b, c], 3), Queue(6)
    assert len(queue.waiting) == 6
    assert queue.admit(state) == ([0, 1, 2], [0, 1, 2])
    state.finish(1, "eos")
    assert queue.admit(state) == ([1], [3])  # b's first sample; its second waits its turn
    assert len(queue.waiting) == 2  # what the policy sees (DraftContext.waiting)
    state.finish(0, "eos")
    state.finish(2, "eos")
    assert queue.admit(state) == ([0, 2], [4, 5])
    assert not queue and not queue.waiting
    assert queue.admit(state) == ([], [])


def test_a_group_larger_than_the_slots_runs_as_slots_free():
    a, b = [7], [8]
    state, queue = state_of([b, a, a, a, a], 3), Queue(5)
    assert queue.admit(state) == ([0, 1, 2], [0, 1, 2])  # b and two of a's four samples
    state.finish(1, "length")
    assert queue.admit(state) == ([1], [3])  # while b and a's first run
    state.finish(0, "length")
    assert queue.admit(state) == ([0], [4])


def test_admission_refills_a_draft_cache_row(llama):
    """A draft model's cache rows are refilled in place: its buffers never move."""
    gen = Generator(llama, perturbed(llama))
    addresses = []

    def record(g, state):
        addresses.append([b.data_ptr() for b in g.drafter.cache.buffers()])

    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [10], [11, 12]]
    assert_greedy_equivalent(gen, prompts, MAX_NEW, max_rows=2, on_step=record)
    assert all(a == addresses[0] for a in addresses)


@pytest.mark.parametrize("draft", ["ngram", "perturbed"])
def test_no_cache_outlives_its_generation(llama, draft):
    """When a generation ends (done or failed), its KV caches and the drafter's state go:
    a Generator kept between training steps holds no KV memory, and the next call's
    default budget sees the memory free."""
    import gc
    import weakref

    gen = Generator(llama, perturbed(llama) if draft == "perturbed" else draft)
    held = []

    def record(g, state):
        draft_cache = getattr(g.drafter, "cache", None)
        buffers = g.cache.buffers() + (draft_cache.buffers() if draft_cache is not None else [])
        held[:] = [weakref.ref(b) for b in buffers] + [weakref.ref(state)]

    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    first = gen.generate(prompts, max_new_tokens=MAX_NEW, max_rows=2, on_step=record)
    gc.collect()
    assert held and all(ref() is None for ref in held)
    assert gen.cache is None and getattr(gen.drafter, "state", None) is None

    def fail(row):
        raise RuntimeError("the caller's callback failed")

    with pytest.raises(RuntimeError, match="callback failed"):
        gen.generate(prompts, max_new_tokens=MAX_NEW, max_rows=2, on_step=record, on_finish=fail)
    gc.collect()
    assert all(ref() is None for ref in held)
    again = gen.generate(prompts, max_new_tokens=MAX_NEW, max_rows=2)
    assert again.sequences == first.sequences


def test_the_ngram_index_of_a_finished_group_is_dropped(llama):
    """The n-gram drafter keeps its index of a group of equal prompts (a prompt's samples)
    while a row of it runs or waits, and drops it once every row finished: a long job
    holds the index of its running groups, not of every row it ran."""
    prompts = with_copies([[1, 2, 3, 1, 2], [4, 5, 4], [6, 7, 8, 6]], 2)
    gen = Generator(llama, "ngram")
    seen = []

    def record(g, state):
        running = {state.prompt_of[s] for s in state.active()}
        seen.append((running, [bool(i) for i in g.drafter.index]))

    res = gen.generate(prompts, max_new_tokens=MAX_NEW, max_rows=2, on_step=record)
    assert (
        res.sequences == Generator(llama, None).generate(prompts, max_new_tokens=MAX_NEW).sequences
    )
    late = [indexed for running, indexed in seen if running & {4, 5}]
    assert late and all(not any(indexed[:2]) for indexed in late)  # the first group's: gone
    assert any(indexed[4] or indexed[5] for indexed in late)  # the running group's: kept


def test_the_policy_sees_how_many_prompts_wait(llama):
    class Recording:
        def __init__(self):
            self.waiting = []

        def draft_lengths(self, ctx):
            self.waiting.append(ctx.waiting)
            return [0] * ctx.num_rows

        def update(self, record):
            pass

    policy = Recording()
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    Generator(llama, "ngram", policy=policy).generate(prompts, max_new_tokens=4, max_rows=1)
    assert policy.waiting == [2] * 3 + [1] * 3 + [0] * 3  # the first token comes from prefill


@pytest.mark.parametrize("attention", ["auto", "sdpa", "flex", "reference"])
def test_float32_rows_in_reused_slots_equal_the_main_models_own(attention):
    """The suite's float64 models (and head dims under 32) always run the reference, so
    the CPU's own pick (sdpa) and flex never met a slot a finished row left: float32, head
    dim 32, two slots for six prompts, rows ending at different steps."""
    from models import tiny_lm

    main = tiny_lm(hidden=128, heads=4, kv_heads=2, dtype=torch.float32, seed=7)
    prompts = [[3, 9, 4], [5] * 11, [7, 1], [2, 8, 6, 4, 2, 8, 6], [1], [9, 9, 3, 3, 5, 5]]
    eos = greedy_reference(main, prompts[1], 12)[4]  # a token some rows meet early
    gen = Generator(main, "ngram", attention=attention)
    res = assert_greedy_equivalent(gen, prompts, 12, max_rows=2, eos_token_id=eos)
    assert res.stats.admissions >= 3 and len({len(s) for s in res.sequences}) > 1
    if attention == "auto":
        assert res.stats.attention["eager"].startswith("sdpa:")
