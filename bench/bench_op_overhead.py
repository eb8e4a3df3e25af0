"""Eager per-call cost on CPU of the bass ops, against the plain functions they wrap.

Two ways to run it:

* ``pytest bench --benchmark-enable`` (``nox -s bench``): a pytest-benchmark suite, one
  benchmark per (shape, call); ``bench/conftest.py`` collects this ``bench_*.py`` file.
* ``python bench/bench_op_overhead.py``: times the same calls with
  ``torch.utils.benchmark.Timer`` and writes ``bench/results/cpu_op_overhead.md`` and
  ``.json`` (median µs per call and the ratio to the plain-Python reference function).

What is compared, for ``ragged_attention``: the public op (dispatcher, input checks
including the host read of the lengths, the plan, kept per set of lengths on a CPU), the
same with ``length_checks(False)``, the plan's ``attend`` alone on the op's flattened
queries (what ``impl=auto`` runs on CPU, planned once: the baseline, ratio 1) and, for
scale, a plain ``torch.nn.functional.scaled_dot_product_attention`` on the same tensors
(GQA, no mask: it computes less than the ragged op). For ``kv_append``: the op, its
Python wrapper and the plain ``bass.ops.reference.append`` it runs (the baseline).

The packed forms (what the engine calls, twice per layer per pass): the same rows as one
flat batch of ``N = sum(q_lens)`` tokens, the queries and new keys transposed views as a
Hugging Face decoder hands them over. ``ragged_attention_packed`` is timed against the
plan's ``attend`` (``impl=auto`` on CPU, planned once from host lengths as an engine pass
does: the baseline), so ``overhead µs`` is what dispatch, checks and planning per call
cost; ``kv_append_packed`` against the plan's ``append`` likewise. Both also on an
empty pass (every row brings no token, ``N = 0``), where the plain functions do almost
nothing: the op's time there is its fixed cost per call.

Default grad mode, no ``torch.no_grad``; inputs do not require grad; one torch thread
(``--threads`` to change; see :data:`THREADS`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import os
import platform
import shlex
import statistics
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from _machine import STARTED_AT
from torch.utils import benchmark as torch_benchmark

import bass
from bass.ops import plan, reference

RESULTS_DIR = Path(__file__).resolve().parent / "results"
RESULT_NAME = "cpu_op_overhead"

SHAPES: dict[str, dict[str, int]] = {
    "tiny": {"B": 2, "Hq": 4, "Hkv": 2, "T": 2, "S": 16, "D": 8},
    "large": {"B": 8, "Hq": 32, "Hkv": 8, "T": 4, "S": 512, "D": 128},
}

# One intra-op thread by default: this measures per-call overhead, and on a small shared
# machine a second OpenMP thread turns other processes' load into 10-40 ms stalls per call.
THREADS = 1

ATTENTION_BASELINE = "Plan.attend, planned once (plain Python)"
APPEND_BASELINE = "bass.ops.reference.append (plain Python)"
PACKED_ATTENTION_BASELINE = "Plan.attend of a packed pass, planned once (plain Python)"
PACKED_APPEND_BASELINE = "Plan.append of a packed pass, planned once (plain Python)"


def padded_plan(q, k, q_lens, kv_lens):
    """The plan the padded op makes for these rows, and its flattened queries."""
    B, Hq, T, D = q.shape
    p = plan._plan_call("ragged_attention", "auto", q_lens, kv_lens, B * T, k.shape[2], False, T)
    return p, q.transpose(0, 1).reshape(1, Hq, B * T, D)


def packed_plan(cu, cache_lens, N, S):
    q_lens, lens = cu.diff().tolist(), cache_lens.tolist()
    return plan.Plan.for_pass("auto", q_lens, lens, N, cu, cache_lens, cache_lens + cu.diff(), S)


def flat_append(k, v, k_new, v_new, cache_lens, new_lens):
    B, H, T, D = k_new.shape
    starts = torch.arange(B, dtype=torch.int32) * T
    flat = [t.transpose(0, 1).reshape(1, H, B * T, D) for t in (k_new, v_new)]
    return (k, v, *flat, starts, new_lens, cache_lens)


BASELINES = {
    "ragged_attention": ATTENTION_BASELINE,
    "kv_append": APPEND_BASELINE,
    "ragged_attention_packed": PACKED_ATTENTION_BASELINE,
    "kv_append_packed": PACKED_APPEND_BASELINE,
}


@dataclasses.dataclass(frozen=True)
class Call:
    """One timed call: ``fn()`` runs it; ``length_checks`` is the setting it runs under."""

    label: str
    group: str  # a key of BASELINES
    fn: Callable[[], object]
    length_checks: bool = True
    against: str | None = None  # the baseline's label, if not the group's

    @property
    def baseline(self) -> str:
        return self.against or BASELINES[self.group]


def make_inputs(shape: str, seed: int = 0) -> dict[str, torch.Tensor | float]:
    """Random CPU float32 inputs of ``SHAPES[shape]``; rows have different lengths."""
    d = SHAPES[shape]
    B, Hq, Hkv, T, S, D = (d[n] for n in ("B", "Hq", "Hkv", "T", "S", "D"))
    g = torch.Generator().manual_seed(seed)
    # Row b has q_len in 1..T and a cache of between half and all of S (and >= q_len).
    q_lens = torch.tensor([1 + b % T for b in range(B)], dtype=torch.int32)
    kv_lens = torch.tensor([S - (b * S) // (2 * B) for b in range(B)], dtype=torch.int32)
    N = int(q_lens.sum())
    cu_q_lens = torch.zeros(B + 1, dtype=torch.int32)
    cu_q_lens[1:] = q_lens.cumsum(0)
    return {
        "q": torch.randn(B, Hq, T, D, generator=g),
        "k": torch.randn(B, Hkv, S, D, generator=g),
        "v": torch.randn(B, Hkv, S, D, generator=g),
        "q_lens": q_lens,
        "kv_lens": kv_lens,
        "scale": D**-0.5,
        "k_new": torch.randn(B, Hkv, T, D, generator=g),
        "v_new": torch.randn(B, Hkv, T, D, generator=g),
        "cache_lens": kv_lens - q_lens,  # the append ends where the attention's keys end
        "new_lens": q_lens,
        # packed: [1, N, H, D] buffers seen as [1, H, N, D], as a HF decoder passes them
        "q_packed": torch.randn(1, N, Hq, D, generator=g).transpose(1, 2),
        "k_new_packed": torch.randn(1, N, Hkv, D, generator=g).transpose(1, 2),
        "v_new_packed": torch.randn(1, N, Hkv, D, generator=g).transpose(1, 2),
        "cu_q_lens": cu_q_lens,
    }


def make_calls(x: dict) -> list[Call]:
    """The calls to time on inputs ``x`` (``kv_append`` mutates ``x['k']``/``x['v']``,
    rewriting the same slots with the same values on every call)."""
    q, k, v, q_lens, kv_lens, scale = (x[n] for n in ("q", "k", "v", "q_lens", "kv_lens", "scale"))
    append = (k, v, x["k_new"], x["v_new"], x["cache_lens"], x["new_lens"])
    attention = "ragged_attention"
    padded, flat_q = padded_plan(q, k, q_lens, kv_lens)
    flat = flat_append(*append)
    return [
        Call(
            "torch.ops.bass.ragged_attention (impl=auto)",
            attention,
            lambda: torch.ops.bass.ragged_attention(q, k, v, q_lens, kv_lens, scale),
        ),
        Call(
            "torch.ops.bass.ragged_attention (impl=auto, length_checks off)",
            attention,
            lambda: torch.ops.bass.ragged_attention(q, k, v, q_lens, kv_lens, scale),
            length_checks=False,
        ),
        Call(
            ATTENTION_BASELINE,
            attention,
            lambda: padded.attend(flat_q, k, v, scale),
        ),
        Call(
            "F.scaled_dot_product_attention (enable_gqa, no mask)",
            attention,
            lambda: F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True),
        ),
        Call("torch.ops.bass.kv_append", "kv_append", lambda: torch.ops.bass.kv_append(*append)),
        Call(
            "bass.ops.kv_append (Python wrapper)", "kv_append", lambda: bass.ops.kv_append(*append)
        ),
        Call(APPEND_BASELINE, "kv_append", lambda: reference.append(*flat)),
        *make_packed_calls(x),
    ]


def make_packed_calls(x: dict) -> list[Call]:
    """The packed ops' calls on inputs ``x`` (the same rows, one flat batch)."""
    k, v, kv_lens, scale, cu = (x[n] for n in ("k", "v", "kv_lens", "scale", "cu_q_lens"))
    attention = (x["q_packed"], k, v, cu, kv_lens, scale)
    append = (k, v, x["k_new_packed"], x["v_new_packed"], cu, x["cache_lens"])
    group, append_group = "ragged_attention_packed", "kv_append_packed"
    op, append_op = torch.ops.bass.ragged_attention_packed, torch.ops.bass.kv_append_packed
    B = k.shape[0]  # an empty pass: no row brings a token
    none = torch.zeros(B + 1, dtype=torch.int32)
    empty_q = x["q_packed"][:, :, :0]
    empty_new = x["k_new_packed"][:, :, :0]
    attention_empty = (empty_q, k, v, none, kv_lens, scale)
    append_empty = (k, v, empty_new, empty_new, none, x["cache_lens"])
    fn_empty = "Plan.attend of a packed pass (plain Python, empty pass)"
    append_fn_empty = "Plan.append of a packed pass (plain Python, empty pass)"
    N, S = x["q_packed"].shape[2], k.shape[2]
    full, empty = packed_plan(cu, x["cache_lens"], N, S), packed_plan(none, x["cache_lens"], 0, S)
    return [
        Call("torch.ops.bass.ragged_attention_packed (impl=auto)", group, lambda: op(*attention)),
        Call(
            "torch.ops.bass.ragged_attention_packed (impl=auto, length_checks off)",
            group,
            lambda: op(*attention),
            length_checks=False,
        ),
        Call(
            PACKED_ATTENTION_BASELINE,
            group,
            lambda: full.attend(x["q_packed"], k, v, scale),
        ),
        Call("torch.ops.bass.kv_append_packed", append_group, lambda: append_op(*append)),
        Call(
            "torch.ops.bass.kv_append_packed (length_checks off)",
            append_group,
            lambda: append_op(*append),
            length_checks=False,
        ),
        Call(PACKED_APPEND_BASELINE, append_group, lambda: full.append(*append[:4])),
        Call(
            "torch.ops.bass.ragged_attention_packed (empty pass, length_checks off)",
            group,
            lambda: op(*attention_empty),
            length_checks=False,
            against=fn_empty,
        ),
        Call(
            fn_empty,
            group,
            lambda: empty.attend(empty_q, k, v, scale),
            against=fn_empty,
        ),
        Call(
            "torch.ops.bass.kv_append_packed (empty pass, length_checks off)",
            append_group,
            lambda: append_op(*append_empty),
            length_checks=False,
            against=append_fn_empty,
        ),
        Call(
            append_fn_empty,
            append_group,
            lambda: empty.append(*append_empty[:4]),
            against=append_fn_empty,
        ),
    ]


CALL_LABELS = [c.label for c in make_calls(make_inputs("tiny"))]


def time_call(
    call: Call, *, repetitions: int | None, min_run_time: float, threads: int = THREADS
) -> tuple[list[float], int]:
    """Seconds per call of each timed block, and the number of calls timed.

    ``repetitions=None``: ``Timer.blocked_autorange(min_run_time)``; otherwise exactly that
    many calls in one block (a smoke run). ``threads``: torch's intra-op threads while
    timing.
    """
    timer = torch_benchmark.Timer(
        stmt="fn()",
        globals={"fn": call.fn},
        num_threads=threads,
        label=call.group,
        description=call.label,
    )
    with bass.ops.length_checks(call.length_checks):
        call.fn()  # warm-up (first-call dispatch caches, allocator)
        if repetitions is None:
            m = timer.blocked_autorange(min_run_time=min_run_time)
        else:
            m = timer.timeit(number=repetitions)
    return list(m.times), m.number_per_run * len(m.raw_times)


def measure(
    shapes: Iterable[str] = tuple(SHAPES),
    *,
    repetitions: int | None = None,
    min_run_time: float = 1.0,
    rounds: int = 5,
    threads: int = THREADS,
) -> list[dict]:
    """Time every call on every shape; one row per (shape, call).

    The calls of a shape are timed round-robin, ``rounds`` times ``min_run_time / rounds``
    seconds each, and the median is over all blocks of all rounds, so a burst of load
    from elsewhere on the machine skews every call alike rather than one call. With
    ``repetitions``, one round of that many calls each.
    """
    rounds = 1 if repetitions is not None else rounds
    rows = []
    for shape in shapes:
        calls = make_calls(make_inputs(shape))
        blocks: dict[str, list[float]] = {c.label: [] for c in calls}
        runs = dict.fromkeys(blocks, 0)
        for _ in range(rounds):
            for call in calls:
                times, n = time_call(
                    call,
                    repetitions=repetitions,
                    min_run_time=min_run_time / rounds,
                    threads=threads,
                )
                blocks[call.label] += times
                runs[call.label] += n
        medians = {label: statistics.median(times) for label, times in blocks.items()}
        rows += [
            {
                "shape": shape,
                "dims": SHAPES[shape],
                "group": call.group,
                "call": call.label,
                "median_us": medians[call.label] * 1e6,
                "runs": runs[call.label],
                "blocks": len(blocks[call.label]),
                "baseline": call.baseline,
                "ratio_vs_baseline": medians[call.label] / medians[call.baseline],
                "overhead_us": (medians[call.label] - medians[call.baseline]) * 1e6,
            }
            for call in calls
        ]
    return rows


def machine_info(threads: int = THREADS) -> dict:
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {
        "processor": platform.processor() or platform.machine(),
        "cpu_model": model,
        "cpu_count": os.cpu_count(),
        "torch_threads": threads,
        "load_average_1_5_15min": [round(x, 2) for x in os.getloadavg()],
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "bass": bass.__version__,
        "commit": STARTED_AT,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def _dims(d: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in d.items())


def to_markdown(rows: list[dict], info: dict, command: str) -> str:
    lines = [
        "# Eager per-call overhead of the bass ops on CPU",
        "",
        f"Command: `{command}`  ",
        f"Commit: {info.get('commit', 'unknown')}  ",
        f"Date: {info['date']}  ",
        f"Machine: {info['processor']} ({info['cpu_model'] or 'unknown model'}), "
        f"{info['cpu_count']} CPUs, torch threads {info['torch_threads']}, "
        f"{info['platform']}  ",
        f"Load average (1/5/15 min) before: {info.get('load_average_before', '?')}, after: "
        f"{info['load_average_1_5_15min']} (a shared machine: other loads inflate timings)  ",
        f"Software: torch {info['torch']}, Python {info['python']}, bass {info['bass']}",
        "",
        "Median wall time per call (`torch.utils.benchmark.Timer`, float32, default grad "
        "mode; the calls are timed round-robin in several rounds and the median is over all "
        "timed blocks). Ratio and overhead: against the plain-Python function of the same "
        "op on the same shape (the plan's `attend` or `reference.append` the op runs, "
        "planned once; for the packed ops the plan's `attend` or `append` of the pass, "
        "so the overhead is dispatch, checks and the implementation choice). The packed "
        "calls take the same rows as one flat batch of N = sum(q_lens) tokens, queries and "
        "new keys as transposed views; on an empty pass (no row brings a token, N = 0) "
        "they are measured against their plain functions on that pass: the op's time there "
        "is its fixed cost per call. SDPA computes unmasked GQA attention over the whole "
        "cache, for scale only.",
    ]
    for shape in dict.fromkeys(r["shape"] for r in rows):
        shape_rows = [r for r in rows if r["shape"] == shape]
        lines += [
            "",
            f"## {shape}: {_dims(shape_rows[0]['dims'])}",
            "",
            "| call | median µs | ratio vs plain-python reference | overhead µs |",
            "|---|---:|---:|---:|",
        ]
        lines += [
            f"| `{r['call']}` | {r['median_us']:.1f} | {r['ratio_vs_baseline']:.2f} "
            f"| {r['overhead_us']:+.1f} |"
            for r in shape_rows
        ]
    return "\n".join(lines) + "\n"


def write_results(
    rows: list[dict], out_dir: Path, command: str, info: dict | None = None
) -> tuple[Path, Path]:
    """Write ``cpu_op_overhead.md`` and ``.json`` under ``out_dir``; return their paths."""
    info = machine_info() if info is None else info
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    md = out_dir / f"{RESULT_NAME}.md"
    js = out_dir / f"{RESULT_NAME}.json"
    md.write_text(to_markdown(rows, info, command), encoding="utf-8")
    payload = {"command": command, "machine": info, "unit": "microseconds", "results": rows}
    js.write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return md, js


def run(
    shapes: Iterable[str] = tuple(SHAPES),
    *,
    repetitions: int | None = None,
    min_run_time: float = 1.0,
    rounds: int = 5,
    threads: int = THREADS,
    out_dir: Path = RESULTS_DIR,
    command: str = "python bench/bench_op_overhead.py",
) -> tuple[list[dict], Path, Path]:
    """Measure and write the results; what the script and the smoke test call."""
    load_before = [round(x, 2) for x in os.getloadavg()]
    rows = measure(
        shapes, repetitions=repetitions, min_run_time=min_run_time, rounds=rounds, threads=threads
    )
    info = machine_info(threads)
    info["load_average_before"] = load_before
    md, js = write_results(rows, out_dir, command, info)
    return rows, md, js


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    parser.add_argument(
        "--min-run-time", type=float, default=1.0, help="seconds of timing per call and shape"
    )
    parser.add_argument("--rounds", type=int, default=5, help="round-robin passes over the calls")
    parser.add_argument("--threads", type=int, default=THREADS, help="torch intra-op threads")
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    script = ["python", *sys.argv] if argv is None else ["python", __file__, *argv]
    command = shlex.join(script)
    _, md, js = run(
        args.shapes,
        min_run_time=args.min_run_time,
        rounds=args.rounds,
        threads=args.threads,
        out_dir=args.out_dir,
        command=command,
    )
    print(md.read_text(encoding="utf-8"))
    print(f"wrote {md} and {js}")
    return 0


# --------------------------------------------------------------------------- pytest-benchmark


@contextlib.contextmanager
def torch_threads(n: int):
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def _benchmark(benchmark, shape: str, label: str) -> None:
    call = next(c for c in make_calls(make_inputs(shape)) if c.label == label)
    benchmark.group = f"{shape}: {call.group}"
    benchmark.extra_info.update(dims=SHAPES[shape], baseline=call.baseline, threads=THREADS)
    with bass.ops.length_checks(call.length_checks), torch_threads(THREADS):
        benchmark(call.fn)


try:  # the suite needs pytest; the script does not
    import pytest
except ImportError:  # pragma: no cover
    pass
else:

    @pytest.mark.parametrize("label", CALL_LABELS)
    @pytest.mark.parametrize("shape", list(SHAPES))
    def test_op_overhead(benchmark, shape, label):
        _benchmark(benchmark, shape, label)


if __name__ == "__main__":
    sys.exit(main())
