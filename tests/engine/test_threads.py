"""Threads (bass.locking): concurrent generate calls, on one Generator and on Generators
sharing a main model and a draft model, each return exactly what they return alone."""

from __future__ import annotations

import contextlib
import threading
import time

import pytest
from models import perturbed, tiny_lm

from bass import Generator, locking

PROMPTS = [[1, 2, 3, 4, 1, 2, 3], [5, 6, 7], [8, 9, 10, 11, 8, 9], [12, 13]]


@pytest.fixture(scope="module")
def gens():
    """Four Generators over two main models and one draft model: A and B share `main`,
    B and C share `draft`; D decodes `main` without drafting."""
    main, main2 = tiny_lm("llama", seed=0), tiny_lm("llama", seed=3)
    draft = perturbed(main, scale=0.2)
    constant = {"policy": "constant", "policy_options": {"k": 3}}
    return {
        "A": Generator(main, "ngram"),
        "B": Generator(main, draft, **constant),
        "C": Generator(main2, draft, **constant),
        "D": Generator(main, None),
    }


# (generator, prompts, generate keywords): greedy and seeded sampling, with stop sequences
CALLS = [
    ("A", PROMPTS, {"max_new_tokens": 12}),
    ("A", PROMPTS[::-1], {"max_new_tokens": 9, "do_sample": True, "seed": 5}),
    ("B", PROMPTS, {"max_new_tokens": 12}),
    ("B", PROMPTS[1:], {"max_new_tokens": 10, "do_sample": True, "seed": 1}),
    ("C", PROMPTS, {"max_new_tokens": 11, "stop_sequences": [[3, 4]]}),
    ("D", PROMPTS[:2], {"max_new_tokens": 8, "do_sample": True, "temperature": 0.7, "seed": 2}),
]


def run_threads(gens, calls, rounds: int):
    """Every call of ``calls`` on its own thread, started together, ``rounds`` times;
    returns each call's results per round (an exception is a result too)."""
    results = [[None] * len(calls) for _ in range(rounds)]

    for r in range(rounds):
        barrier = threading.Barrier(len(calls))

        def call(i, name, prompts, kw, r=r, barrier=barrier):
            barrier.wait()
            try:
                res = gens[name].generate(prompts, **kw)
                results[r][i] = (res.sequences, res.finish_reasons)
            except Exception as exc:
                results[r][i] = exc

        threads = [
            threading.Thread(target=call, args=(i, *c)) for i, c in enumerate(calls)
        ]  # fmt: skip
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not any(t.is_alive() for t in threads), "a generation never returned"
    return results


def test_concurrent_calls_give_the_sequential_output_token_for_token(gens):
    alone = []
    for name, prompts, kw in CALLS:
        res = gens[name].generate(prompts, **kw)
        alone.append((res.sequences, res.finish_reasons))
    for got in run_threads(gens, CALLS + CALLS[:3], rounds=3):
        for i, result in enumerate(got):
            want = alone[i % len(CALLS)]
            assert not isinstance(result, Exception), f"call {i}: {result!r}"
            assert result == want, f"call {i} ({CALLS[i % len(CALLS)][0]}) differs"
    # the models are handed back as they came
    for g in gens.values():
        assert g.main.config._attn_implementation != "bass"
    assert not locking.running()


def test_building_a_generator_waits_for_a_generation_on_its_model(gens):
    """A Generator built while another thread generates on the same model (its CPU
    layouts are installed on the model) waits until that generation returns."""
    main = gens["A"].main
    started, order = threading.Event(), []

    def slow_step(generator, state):
        started.set()
        time.sleep(0.05)

    def generate():  # rows are handed over while the generation holds the model
        rows = dict(on_step=slow_step, on_finish=lambda row: order.append("row"))
        gens["A"].generate(PROMPTS, max_new_tokens=6, **rows)

    t = threading.Thread(target=generate)
    t.start()
    assert started.wait(30)
    Generator(main, "ngram", cpu_linear="unpacked")
    order.append("built")
    t.join(60)
    assert order == ["row"] * len(PROMPTS) + ["built"]
    Generator(main, "ngram")  # the model's layouts as the other tests' Generators had them


def test_a_generation_from_inside_a_generation_is_refused_not_deadlocked(gens):
    gen = gens["A"]

    def nested(generator, state):
        generator.generate([[1, 2]], max_new_tokens=2)

    with pytest.raises(locking.ReentrantGenerationError, match="from inside a running generation"):
        gen.generate(PROMPTS, max_new_tokens=4, on_step=nested)
    assert not locking.running()  # released: the next call runs
    assert len(gen.generate(PROMPTS, max_new_tokens=3).sequences) == len(PROMPTS)


def test_a_generation_beside_an_open_stream_names_the_stream(gens):
    gen = gens["A"]
    stream = gen.stream(PROMPTS, max_new_tokens=3, max_rows=1)
    next(stream)
    with pytest.raises(locking.ReentrantGenerationError, match=r"stream\(\) not read to its end"):
        gen.generate([[1, 2]], max_new_tokens=2)
    stream.close()  # released: the next call runs
    assert len(gen.generate([[1, 2]], max_new_tokens=2).sequences) == 1


def test_a_stream_read_on_by_another_thread_belongs_to_that_thread(gens):
    """A stream moved between threads (a server's pool): a generation in its loop body is
    refused on the thread reading it now (it waited forever), and one on the thread that
    started it waits its turn (it was refused as the stream's own)."""
    gen, want = gens["A"], gens["A"].generate([[1, 2]], max_new_tokens=2).sequences
    stream = gen.stream(PROMPTS, max_new_tokens=3, max_rows=1)
    next(stream)  # started here
    caught, reading, order = [], threading.Event(), []

    def read_on():
        try:
            next(stream)
            reading.set()
            try:
                gen.generate([[1, 2]], max_new_tokens=2)
            except locking.ReentrantGenerationError as exc:
                caught.append(exc)
            time.sleep(0.2)  # the starting thread's generation waits meanwhile
            order.extend("row" for _ in stream)
        finally:
            reading.set()

    t = threading.Thread(target=read_on, daemon=True)
    t.start()
    try:
        assert reading.wait(30)
        assert gen.generate([[1, 2]], max_new_tokens=2).sequences == want  # after the stream
        order.append("mine")
    except BaseException:  # failing: the stream lets go, so later tests do not wait on it
        with contextlib.suppress(ValueError):  # (running in the other thread)
            stream.close()
        raise
    t.join(30)
    assert not t.is_alive() and len(caught) == 1, "the reading thread deadlocked"
    assert order == ["row"] * (len(PROMPTS) - 2) + ["mine"]


def test_bad_arguments_fail_at_once_while_another_thread_generates(gens):
    """Argument checks come before the wait for the lock."""
    started, release = threading.Event(), threading.Event()

    def hold(generator, state):
        started.set()
        release.wait(30)

    t = threading.Thread(target=lambda: gens["A"].generate(PROMPTS, max_new_tokens=3, on_step=hold))
    t.start()
    try:
        assert started.wait(30)
        with pytest.raises(ValueError, match="seed=-1 is not allowed"):
            gens["B"].generate(PROMPTS, max_new_tokens=3, seed=-1)
    finally:
        release.set()
        t.join(60)
