"""Draft-length policies replayed on recorded n-gram traces, free of the machine's noise.

``python bench/replay_policies.py``: greedy decoding and n-gram lookup are both
deterministic, so what a policy's choices would do can be computed rather than timed.
For every prompt the main model's greedy tokens are recorded once, and at every position
what the n-gram lookup proposes (its length and matched suffix) and how much of it greedy
verification would accept. A policy then drives a simulated ``generate``: each step it
gets the :class:`~bass.policies.DraftContext` the engine would build, each row commits
what it accepted plus one token, the step costs ``C(N, drafting)`` seconds plus bass's
host time of a step and the n-gram lookup's (both measured), and the policy's ``update``
gets the :class:`~bass.policies.StepRecord` the engine would report. The batch runs until
its last row is done.

``C`` is measured on this machine first, from real generations (drafting off and
``constant`` k = 1, 2, 4, 8 at every batch size): the median verify seconds of each pass
size seen (``N`` tokens, drafting or not), linear between sizes and beyond the widest.
Each replayed step's time is that median times a noise factor (a slow drift and a
per-step jitter, of the relative spread the measured steps showed around their medians),
one noise sequence per seed, the same for every policy. Times are summed over
consecutive groups of ``batch`` prompts (16 HumanEval prompts: 16 batches of one, ..., one
of 16; the 4 chat prompts up to batch 4).

The lookup's time is what the engine reports as a step's draft seconds under ``constant``
(the lookup, a trivial policy's decision, the proposal), the median over the measured runs.

What a replay leaves out: a policy's own host time beyond a trivial one's (``adaptive``'s
shows in ``bench/results/cpu_policies.md``'s host share: ~0.3% of a step), what a real step
costs beyond its size (the cache's occupancy, the allocator, other processes: the
measured spread is replayed as noise, not as a bias), and sibling lookup (every prompt in a
batch is distinct here). What it gives: every policy, built-in or a plugin
(``--policy name`` or ``name:key=value,...``), on the same steps and the same noise, each
cell in milliseconds; given the measured cost table (kept in the JSON) the replay is
deterministic.

Writes ``bench/results/<setup>_policy_replay.{md,json}`` (the JSON keeps the traces and
the cost tables: ``--load`` replays other policies on them in seconds, without the model);
``--setup tiny`` runs tiny random models in seconds (the smoke test).
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import _machine
from bench_policies import POLICIES, smollm_setup, tiny_setup, workload_args

from bass import Generator
from bass.drafters import NGramDrafter
from bass.policies import DraftContext, StepRecord, bind, registry

RESULTS = Path(__file__).parent / "results"
DEFAULT = "adaptive"
OFF = "drafting off"


# ----------------------------------------------------------------------------- recording


def record(main, prompts, max_new: int) -> list[dict]:
    """Per prompt: its greedy output and, at each position ``t`` (tokens committed), the
    lookup's ``(proposed, matched suffix, greedily accepted)``."""
    res = Generator(main, None).generate(prompts, max_new_tokens=max_new)
    traces = []
    for prompt, out in zip(prompts, res.sequences, strict=True):
        seq = [*prompt, out[0]]
        lookup = NGramDrafter(siblings=False)
        lookup.attach([prompt], [seq])
        steps = []
        for t in range(1, len(out)):
            found, n = lookup.lookup(0, NGramDrafter.max_lookup)
            acc = 0
            while acc < len(found) and t + acc < len(out) and found[acc] == out[t + acc]:
                acc += 1
            steps.append((len(found), n, acc))
            seq.append(out[t])
        traces.append({"length": len(out), "steps": steps})
    return traces


EXTRAS = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48)  # draft tokens in a timed pass


def pass_shapes(B: int) -> list[list[int]]:
    """Tokens per row of the timed passes in a batch of ``B`` rows: ``R`` active rows
    (the rest finished: they bring nothing), plain or with ``e`` draft tokens spread over
    them as evenly as possible."""
    shapes = []
    for R in sorted({r for r in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32) if r < B} | {B}):
        for e in EXTRAS:
            q = [1 + e // R + (i < e % R) for i in range(R)] + [0] * (B - R)
            shapes.append(q)
    return shapes


def measure_costs(main, prompts, B: int, max_new: int, repeats: int) -> dict:
    """For a batch of ``B`` prompts: ``{"plain": {N: s}, "drafting": {N: s}, "host": s,
    "lookup": s, "noise": sd}``. Pass times come from packed passes over the prefilled
    prompts, every shape of :func:`pass_shapes` timed once per round, ``repeats`` rounds
    (round-robin: the machine's slow spells fall on every size alike), median per pass
    size ``N``; logits at every position, as a verify pass computes them. ``host``:
    bass's seconds per step outside the passes (a drafting-off generation); ``lookup``:
    the draft seconds per step of a ``constant`` k=4 n-gram generation; ``noise``: the
    relative spread of the passes' times around their medians."""
    import torch

    from bass import hf
    from bass.cache import RaggedKVCache

    batch = (prompts * B)[:B]
    gen = Generator(main, "ngram", policy="constant", policy_options={"k": 4})
    lookup = statistics.median(
        s.draft_seconds for s in gen.generate(batch, max_new_tokens=max_new).stats.steps
    )
    off = Generator(main, None).generate(batch, max_new_tokens=max_new).stats
    host = off.host_share * off.wall_seconds / max(1, len(off.steps))
    lens = [len(p) for p in batch]
    max_len = max(lens) + max(EXTRAS) + 8
    cpu = torch.device("cpu")
    cache = RaggedKVCache(B, max_len, main.config.num_hidden_layers, cpu)
    times: dict[tuple, list[float]] = {}
    previous = main.config._attn_implementation
    hf.prepare(main, max_len)
    with torch.inference_mode():
        gen.passes.prefill(main, cache, batch)
        for _ in range(repeats):
            for q in pass_shapes(B):
                n = sum(q)
                packed = gen.passes.pack(main, q, lens, cpu, ids=[5] * n, logits_at=range(n))
                t0 = time.perf_counter()
                gen.passes.run(main, cache, packed)  # as the engine runs it
                times.setdefault((n, max(q) > 1), []).append(time.perf_counter() - t0)
    main.set_attn_implementation(previous)
    table = {"plain": {}, "drafting": {}, "host": host, "lookup": lookup}
    spread = []
    for (n, drafting), secs in sorted(times.items()):
        med = statistics.median(secs)
        table["drafting" if drafting else "plain"][n] = med
        spread += [math.log(x / med) for x in secs]
    table["noise"] = statistics.pstdev(spread) if len(spread) > 1 else 0.0
    return table


class Cost:
    """``C(N, drafting)`` from a measured table: linear between the sizes seen, the end
    segments' slopes beyond them; a drafting size never seen falls back on plain sizes."""

    def __init__(self, table: dict):
        self.lines = {}
        for kind in ("plain", "drafting"):
            pts = sorted((int(n), s) for n, s in table[kind].items())
            if pts:
                self.lines[kind] = ([n for n, _ in pts], [s for _, s in pts])
        self.host, self.lookup = table["host"], table.get("lookup", 0.0)

    def __call__(self, n: int, drafting: bool) -> float:
        xs, ys = self.lines.get("drafting" if drafting else "plain") or self.lines["plain"]
        if len(xs) == 1:
            return ys[0]
        i = min(max(bisect.bisect_left(xs, n), 1), len(xs) - 1)
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return max(y0 + (y1 - y0) * (n - x0) / (x1 - x0), 0.25 * min(ys))


# ----------------------------------------------------------------------------- replay


def replay(policy, traces, cost: Cost, noise: float, seed: int) -> dict:
    """One simulated ``generate`` of the prompts behind ``traces`` (``policy=None``:
    drafting off). Returns seconds, steps, drafted and accepted tokens."""
    rng = random.Random(seed)
    pos = {r: 1 for r in range(len(traces))}  # tokens committed (the prefill made one)
    total, steps, drafted_all, accepted_all, drift = 0.0, 0, 0, 0, 0.0
    while pos:
        rows = sorted(pos)
        caps = [traces[r]["length"] - pos[r] - 1 for r in rows]
        found = [traces[r]["steps"][pos[r] - 1] for r in rows]
        avail = [min(f[0], c) for f, c in zip(found, caps, strict=True)]
        ks = [0] * len(rows)
        if policy is not None:
            ctx = DraftContext(
                prompts=rows,
                caps=caps,
                drafter="ngram",
                available=avail,
                match_len=[f[1] if a else 0 for f, a in zip(found, avail, strict=True)],
                step=steps,
            )
            ks = bind(policy).draft_lengths(ctx)
        drafted = [min(k, a) for k, a in zip(ks, avail, strict=True)]
        accepted = [min(f[2], d) for f, d in zip(found, drafted, strict=True)]
        n = sum(1 + d for d in drafted)
        drift = 0.9 * drift + 0.44 * noise * rng.gauss(0.0, 1.0)  # stationary sd: noise
        seconds = cost(n, any(drafted)) * math.exp(drift + noise / 3 * rng.gauss(0.0, 1.0))
        total += seconds + cost.host + (cost.lookup if policy is not None else 0.0)
        if policy is not None:
            policy.update(
                StepRecord(
                    draft_length=max(drafted),
                    accepted=accepted,
                    drafted=drafted,
                    draft_seconds=cost.lookup,
                    verify_seconds=seconds,
                    prompts=rows,
                    verify_tokens=n,
                )
            )
        for r, x in zip(rows, accepted, strict=True):
            pos[r] += x + 1
            if pos[r] >= traces[r]["length"]:
                del pos[r]
        steps += 1
        drafted_all += sum(drafted)
        accepted_all += sum(accepted)
    return {"seconds": total, "steps": steps, "drafted": drafted_all, "accepted": accepted_all}


def parse_policy(spec: str) -> tuple[str, dict]:
    """``name`` or ``name:key=value,...``, the values converted as ``--policy-option``'s
    (:func:`bass.policies.registry.parse_options`); bad names and options fail here."""
    name, _, opts = spec.partition(":")
    options = registry.parse_options(name, [o for o in opts.split(",") if o])
    registry.load(name, **options)
    return name, options


def run_cells(traces_by_set, policies, tables: dict[int, dict], seeds: int) -> dict:
    """Every (prompt set, batch) cell: drafting off and each policy replayed over the
    set's groups of ``batch`` prompts with the costs measured at that batch size."""
    cells = {}
    for name, traces in traces_by_set.items():
        cells[name] = {}
        for B, table in tables.items():
            if len(traces) < B:
                continue
            cost, noise = Cost(table), table["noise"]
            groups = [traces[i : i + B] for i in range(0, len(traces) - B + 1, B)]
            out = {}
            for label, (pname, opts) in {OFF: (None, {}), **policies}.items():
                runs = [
                    replay(
                        None if pname is None else registry.load(pname, **opts),
                        group,
                        cost,
                        noise,
                        seed,
                    )
                    for seed in range(seeds)
                    for group in groups
                ]
                out[label] = {
                    key: sum(r[key] for r in runs) / seeds
                    for key in ("seconds", "steps", "drafted", "accepted")
                }
            base = out[OFF]["seconds"]
            best = min(r["seconds"] for k, r in out.items() if k != OFF)
            for label, r in out.items():
                r["vs_off"] = base / r["seconds"]
                r["regret"] = 1 - best / r["seconds"] if label != OFF else None
            cells[name][B] = out
    return cells


def to_markdown(result: dict) -> str:
    meta = result["meta"]
    lines = [
        *_machine.header(f"Draft-length policies replayed: {meta['setup']}", meta),
        "",
        f"Workload: {meta['max_new']} new tokens per row, greedy, eos ignored; "
        f"{meta['seeds']} noise seeds; pass costs measured on this machine, "
        f"{meta['repeats']} rounds. `vs drafting off`: modelled time of drafting off over "
        "the policy's; regret: `1 - best / own` time among the policies.",
        "",
        "Measured per batch size: a plain pass of all rows, one with 8 draft tokens, bass's "
        "host time and the n-gram lookup's per step, the spread of pass times:",
        "",
    ]
    for B, t in result["costs"].items():
        plain = t["plain"][max(t["plain"], key=int)]
        n8 = min(t["drafting"], key=lambda n: abs(int(n) - (int(B) + 8)))
        lines.append(
            f"- batch {B}: plain {1e3 * plain:.1f} ms, +8 tokens {1e3 * t['drafting'][n8]:.1f} "
            f"ms, host {1e3 * t['host']:.2f} ms, lookup {1e3 * t['lookup']:.2f} ms, spread "
            f"{t['noise']:.1%}"
        )
    for name, by_batch in result["cells"].items():
        lines += [
            "",
            f"## {name} prompts",
            "",
            "| batch | method | ms | vs drafting off | regret | steps | drafted | accepted |",
            "|---:|---|---:|---:|---:|---:|---:|---:|",
        ]
        for B, out in by_batch.items():
            for label, r in out.items():
                shown = f"**{label}** (default)" if label == DEFAULT else label
                regret = "" if r["regret"] is None else f"{r['regret']:.1%}"
                lines.append(
                    f"| {B} | {shown} | {1e3 * r['seconds']:.0f} | {r['vs_off']:.3f}x | "
                    f"{regret} | {r['steps']:.0f} | {r['drafted']:.0f} | {r['accepted']:.0f} |"
                )
    default = [
        (out[DEFAULT]["vs_off"], out[DEFAULT]["regret"], name, B)
        for name, by_batch in result["cells"].items()
        for B, out in by_batch.items()
        if DEFAULT in out
    ]
    if default:
        speed, _, name, B = min(default)
        lines += [
            "",
            f"Default policy: worst cell {speed:.3f}x drafting off ({name} batch {B}); "
            f"largest regret {max(r for _, r, _, _ in default):.1%}.",
        ]
    return "\n".join(lines) + "\n"


def record_and_measure(setup: str, batches, max_new: int, repeats: int):
    """Traces of every distinct prompt of ``setup``'s sets and the cost table of every
    batch size, with the setup's label."""
    main_model, _, sets, label = (smollm_setup if setup == "smollm" else tiny_setup)()
    sets = {k: [list(p) for p in dict.fromkeys(map(tuple, v))] for k, v in sets.items()}
    t0 = time.perf_counter()
    traces = {k: record(main_model, v, max_new) for k, v in sets.items()}
    prompts = next(iter(sets.values()))
    tables = {B: measure_costs(main_model, prompts, B, max_new, repeats) for B in batches}
    print(f"recorded and measured in {time.perf_counter() - t0:.0f} s", flush=True)
    return traces, tables, label


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    workload_args(ap)  # --repeats: rounds of timed passes
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument(
        "--policy",
        action="append",
        default=None,
        help="a policy to replay, 'name' or 'name:key=value,...' (repeatable; default: "
        "the built-in ones as bench_policies.py runs them)",
    )
    ap.add_argument(
        "--load",
        type=Path,
        default=None,
        help="replay on the traces and costs of an earlier run's JSON (no model, seconds)",
    )
    ap.add_argument("--tag", default=None, help="output file stem (default <setup>_policy_replay)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    try:  # a policy not installed, a bad option: said as a usage error, not a traceback
        policies = (
            {spec: parse_policy(spec) for spec in args.policy}
            if args.policy
            else {name: (name, opts) for name, opts in POLICIES.items()}
        )
    except ValueError as exc:
        ap.error(f"--policy: {exc}")
    if args.load is not None:  # an earlier run's traces and costs
        earlier = json.loads(args.load.read_text())
        traces, label = earlier["traces"], earlier["meta"]["setup"]
        tables = {int(B): t for B, t in earlier["costs"].items() if int(B) in batches}
        args.max_new, args.repeats = earlier["meta"]["max_new"], earlier["meta"]["repeats"]
    else:
        traces, tables, label = record_and_measure(args.setup, batches, args.max_new, args.repeats)
    cells = run_cells(traces, policies, tables, args.seeds)
    meta = _machine.run_meta(
        "replay_policies.py",
        argv,
        setup=label,
        max_new=args.max_new,
        seeds=args.seeds,
        repeats=args.repeats,
    )
    result = {"meta": meta, "costs": tables, "cells": cells, "traces": traces}
    stem = args.tag or ("cpu" if args.setup == "smollm" else "tiny") + "_policy_replay"
    args.out.mkdir(parents=True, exist_ok=True)
    text = to_markdown(result)
    (args.out / f"{stem}.md").write_text(text)
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=1, default=str))
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
