"""End to end, side by side in one run: what batched speculative decoding buys.

Methods (same prompts, same models, greedy, every row generates exactly ``max_new``
tokens: eos is ignored so all methods do equal work):

* ``hf-generate``: transformers ``generate``, batched, left-padded (regular decoding);
* ``bass-regular``: bass with drafting off (``draft=None``);
* ``bass-regular compiled`` (CPU mode): the same with ``compile=True``, timed after a
  warm-up generation whose time (compilation included) is reported beside it;
* ``bass-regular F.linear`` (CPU mode): drafting off with ``cpu_linear="torch"``: the
  linear layers in torch's own layout, not the calibrated ones (:mod:`bass.cpu_linear`);
* ``bass[<policy>]``: BASS with each draft-length policy (``adaptive`` is the default);
* ``hf-assisted (1 at a time)``: transformers' single-sequence speculative decoding
  (on GPU only up to batch 8, and with real, i.e. near-zero, acceptance on random weights)
  (``assistant_model=`` for a draft model, ``prompt_lookup_num_tokens=`` for n-grams), one
  prompt at a time, since it refuses batches.

Reported per (method, batch size): ms per token per sequence (wall / max_new), total
tokens/s, mean accepted draft tokens per step per row, main-model passes per token per
row, the tokens each decoding pass of the main model computed (real, and padding: bass's
packed passes compute none; ``generate`` decodes one token per row per pass, its prefill
pads every prompt to the longest), the host share of a step (time outside the models'
forward passes) and the speedup over ``hf-generate`` at the same batch size, from the
same run.

Modes:

* ``--cpu`` (default): the embedded default model (SmolLM2-135M-Instruct) with n-gram
  drafting on the first 16 HumanEval prompts (``--workload edit``: the code-edit prompts,
  whose answers copy most of their input); batch sizes 1, 2, 4, 8, 16.
* ``--gpu``: a 7B Llama-shaped main model and a ~300M draft with RANDOM weights in bf16
  (none can be downloaded), batch sizes 1-32, swept over the clearly labelled
  forced-acceptance mode (each draft token accepted with probability p): a systems
  measurement, never a quality one. Adds the bandwidth floor (weight bytes / measured
  copy bandwidth per main pass) and a GPU utilisation estimate like the paper's.
* ``--smoke``: tiny random models, two batch sizes, a few tokens (the tests run this).

Writes ``bench/results/<tag>_e2e.{md,json}`` and PNG plots (latency per token against
batch size per method; draft length over steps per policy); the reporting is in
``bench/_e2e_report.py``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _e2e_report import (  # noqa: F401 (re-exported: the tests use them from here)
    PAPER,
    cpu_targets,
    device_meta,
    paper_comparison,
    plot,
    to_markdown,
    weight_bytes,
)
from _machine import run_meta
from _prompts import edit_prompts, humaneval_prompts

RESULTS = Path(__file__).parent / "results"
CPU_POLICIES = {
    "adaptive": {},
    "bass": {},
    "constant": {"k": 4},
    "hf-heuristic": {},
    "goodput": {},
}
GPU_POLICIES = {"adaptive": {}, "bass": {}, "constant": {"k": 4}}


# ----------------------------------------------------------------------------- setups


def cpu_setup(n_prompts: int, workload: str = "humaneval"):
    from bass import load_default_pair

    main, tok = load_default_pair()
    prompts = humaneval_prompts(tok, 16) if workload == "humaneval" else edit_prompts(tok)
    label = f"SmolLM2-135M-Instruct + n-gram, {workload} prompts"
    return main, "ngram", (prompts * n_prompts)[:n_prompts], label


def random_llama(hidden, layers, heads, kv_heads, inter, vocab, dtype, device, seed=0):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=inter,
        vocab_size=vocab,
        max_position_embeddings=4096,
    )
    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaForCausalLM(cfg).to(dtype)
    return model.eval()


def smoke_setup(n_prompts: int):
    main = random_llama(32, 2, 4, 2, 64, 128, torch.float32, "cpu")
    draft = random_llama(16, 1, 2, 1, 32, 128, torch.float32, "cpu", seed=1)
    g = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(0, 128, (int(n),), generator=g).tolist()
        for n in torch.randint(3, 12, (n_prompts,), generator=g)
    ]
    return main, draft, prompts, "tiny random Llama pair (smoke)"


def gpu_setup(n_prompts: int):
    dev = "cuda"
    main = random_llama(4096, 32, 32, 8, 14336, 32000, torch.bfloat16, dev)  # ~7B, GQA 32/8
    draft = random_llama(1024, 24, 16, 8, 2816, 32000, torch.bfloat16, dev, seed=1)  # ~0.3B
    g = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(0, 32000, (int(n),), generator=g).tolist()
        for n in torch.randint(100, 400, (n_prompts,), generator=g)
    ]
    return main, draft, prompts, "random 7B Llama-shaped main + ~0.3B draft, bf16"


# ----------------------------------------------------------------------------- methods


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def hf_generate(main, prompts, max_new, pad_id=0):
    """Regular batched decoding with transformers, left padding."""
    width = max(map(len, prompts))
    dev = main.device
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long, device=dev)
    mask = torch.zeros_like(ids)
    for b, p in enumerate(prompts):
        ids[b, width - len(p) :] = torch.tensor(p, device=dev)
        mask[b, width - len(p) :] = 1
    _sync()
    t0 = time.perf_counter()
    with torch.inference_mode():
        main.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=max_new,
            min_new_tokens=max_new,
            do_sample=False,
            pad_token_id=pad_id,
        )
    _sync()
    return {
        "wall_s": time.perf_counter() - t0,
        "mean_accepted": 0.0,
        "main_passes_per_token": 1.0,
        "pass_tokens": len(prompts),  # one token per row per decoding pass
        "padding_share": 0.0,
        "prefill_padding": 1 - sum(map(len, prompts)) / (len(prompts) * width),
        # padded positions computed (the prefill pads every prompt to the longest)
        "main_positions": len(prompts) * (width + max_new - 1),
        "draft_positions": 0,
    }


def hf_assisted(main, draft, prompts, max_new, pad_id=0):
    """Single-sequence speculative decoding with transformers, one prompt at a time."""
    kw = {"prompt_lookup_num_tokens": 10} if draft == "ngram" else {"assistant_model": draft}
    _sync()
    t0 = time.perf_counter()
    with torch.inference_mode():
        for p in prompts:
            ids = torch.tensor([p], device=main.device)
            main.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_new,
                min_new_tokens=max_new,
                do_sample=False,
                pad_token_id=pad_id,
                **kw,
            )
    _sync()
    return {
        "wall_s": time.perf_counter() - t0,
        "mean_accepted": float("nan"),
        "main_passes_per_token": float("nan"),
    }


def bass_runner(
    main,
    draft,
    prompts,
    max_new,
    policy=None,
    options=None,
    forced=None,
    compile=False,
    cpu_linear="auto",
    attention=None,
):
    """A :class:`bass.Generator` built once (and, with ``compile``, warmed up: the
    compilation is timed and reported, not counted); returns ``(run, warmup_s)``, ``run()``
    timing one generation of ``prompts``. Each generation starts a fresh policy."""
    from bass import Generator

    gen = Generator(
        main,
        draft,
        policy=policy or "constant",
        policy_options=options if policy else {"k": 0},
        forced_acceptance=forced,
        compile=compile,
        cpu_linear=cpu_linear,
        attention=attention,
    )
    warmup = None
    if compile:  # compile (and autotune) before timing; report what it cost
        _sync()
        t0 = time.perf_counter()
        gen.generate(prompts, max_new_tokens=max_new, seed=0)
        _sync()
        warmup = time.perf_counter() - t0

    def run() -> dict:
        _sync()
        t0 = time.perf_counter()
        res = gen.generate(prompts, max_new_tokens=max_new, seed=0)
        _sync()
        st = res.stats
        wall = time.perf_counter() - t0
        prompt_tokens = sum(map(len, prompts))
        # positions each model processed (useful or rejected): for the FLOPs estimate
        main_positions = prompt_tokens + sum(d + 1 for s in st.steps for d in s.drafted)
        draft_positions = (
            (prompt_tokens + sum(d for s in st.steps for d in s.drafted)) if draft else 0
        )
        return {
            "wall_s": wall,
            "mean_accepted": st.mean_accepted,
            "main_passes_per_token": st.main_passes_per_token,
            "main_positions": main_positions,
            "draft_positions": draft_positions,
            "draft_length_trace": st.draft_length_trace(),
            "pass_tokens": st.verify_tokens / max(1, len(st.steps)),
            "padding_share": st.padding_share,
            "prefill_padding": 0.0,  # packed: every prompt token once
            "host_share": st.host_share,
        }

    return run, warmup


def bass_run(main, draft, prompts, max_new, *args, **kw) -> dict:
    """One timed generation (:func:`bass_runner`), its warm-up time added when compiled."""
    run, warmup = bass_runner(main, draft, prompts, max_new, *args, **kw)
    return {**run(), **({"warmup_s": warmup} if warmup is not None else {})}


def paired(base: list[float], walls: list[float]) -> float:
    """Speed against ``base``: the median over rounds of base's wall over the method's in
    the same round (the machine's slow spells, tens of seconds on a shared CPU, hit both
    alike); a method timed once (hf-assisted) against base's median."""
    if len(walls) != len(base):
        return statistics.median(base) / statistics.median(walls)
    return statistics.median(b / w for b, w in zip(base, walls, strict=True))


# ----------------------------------------------------------------------------- driver


def run_grid(
    main,
    draft,
    prompts,
    batches,
    max_new,
    policies,
    forced=(None,),
    assisted_upto=64,
    compiled=False,
    graph_batches=(),
    repeats=1,
    on_rows=None,
    attention=None,
    warm_round=False,
):
    """``forced``: forced-acceptance probabilities to sweep (``(None,)``: real acceptance);
    ``compiled``: also time bass-regular with ``compile=True`` (after a warm-up) and with
    ``cpu_linear="torch"`` (CPU);
    ``graph_batches``: after every batch size's eager rows, these batch sizes again with
    CUDA graphs (``compile="reduce-overhead"``, after a warm-up that compiles and
    captures), bass-regular and every policy, against that batch's eager hf-generate;
    ``attention``: the packed attention implementation of every bass run (None: auto);
    ``repeats``: rounds, each timing every method once, back to back, the order rotating
    from round to round (hf-assisted, slow, runs once); a method's wall is its median,
    its speedup the paired median (:func:`paired`) against hf-generate;
    ``warm_round``: one untimed round of every eager method at each batch size first (on a
    GPU, each new shape's Triton and cuBLAS first-use costs: eager walls of one timed round
    differed 3x between two calls of an H200 lease without it, 2026-11-29);
    CUDA-graph rows: each policy's before bass-regular's (BASS's were never reached within
    a lease's stage; regular decoding's had been measured);
    ``on_rows(rows)``: called with every row so far after each batch size's eager rows and
    after each CUDA-graph row (a run cut off by a time limit keeps what it measured)."""
    # warm-up, discarded: first-use costs (kernel loading, cuBLAS handles, allocator growth)
    # would otherwise land on whichever method runs first at batch 1
    hf_generate(main, prompts[:1], 2)
    bass_run(main, draft, prompts[:1], 2, "constant", {"k": 2}, forced[0], attention=attention)
    rows, bases = [], {}
    for B, graphs in [(B, False) for B in batches] + [(B, True) for B in graph_batches]:
        ps = prompts[:B]
        suffix, kw = (" (CUDA graphs)", {"compile": "reduce-overhead"}) if graphs else ("", {})
        specs = {} if graphs else {"bass-regular": ((None, ps, max_new), kw)}  # label -> args
        if compiled and not graphs:
            specs["bass-regular compiled"] = ((None, ps, max_new), {"compile": True})
            specs["bass-regular F.linear"] = ((None, ps, max_new), {"cpu_linear": "torch"})
        for name, opts in policies.items():
            for p in forced:
                label = f"bass[{name}]" if p is None else f"bass[{name}] p={p}"
                specs[label + suffix] = ((draft, ps, max_new, name, opts, p), kw)
        if graphs:
            specs["bass-regular" + suffix] = ((None, ps, max_new), kw)
        # eager: every method built first, then rounds in rotating order; CUDA graphs: one
        # method at a time (each compiles for a long while: a time limit keeps the rows done)
        groups = [list(specs)] if not graphs else [[label] for label in specs]
        for group in groups:
            runners = (
                {} if graphs else {"hf-generate": lambda ps=ps: hf_generate(main, ps, max_new)}
            )
            warmups = {}
            for label in group:
                args, kw = specs[label]
                runners[label], warmup = bass_runner(main, *args, **kw, attention=attention)
                if warmup is not None:
                    warmups[label] = warmup
            names = list(runners)
            if warm_round and not graphs:  # untimed: first-use costs of this batch's shapes
                for m in names:
                    runners[m]()
            runs: dict[str, list[dict]] = {m: [] for m in names}
            for i in range(repeats):
                for m in names[i % len(names) :] + names[: i % len(names)]:
                    runs[m].append(runners[m]())
            if len(ps) <= assisted_upto and not graphs:  # one prompt at a time: small batches
                runs["hf-assisted (1 at a time)"] = [hf_assisted(main, draft, ps, max_new)]
            if not graphs:
                bases[B] = ([r["wall_s"] for r in runs["hf-generate"]],
                            [r["wall_s"] for r in runs["bass-regular"]])  # fmt: skip
            base, regular = bases.get(B, (None, None))
            for method, rs in runs.items():
                walls = [r["wall_s"] for r in rs]
                r = dict(sorted(rs, key=lambda x: x["wall_s"])[len(rs) // 2])  # the median run
                wall = statistics.median(walls)
                r.update(
                    batch=B,
                    method=method,
                    wall_s=wall,
                    walls=walls,
                    ms_per_token_per_seq=1000 * wall / max_new,
                    tokens_per_s=B * max_new / wall,
                    speedup=paired(base, walls) if base else float("nan"),
                    vs_regular=paired(regular, walls) if regular else float("nan"),
                )
                if method in warmups:
                    r["warmup_s"] = warmups[method]
                rows.append(r)
            if on_rows is not None:
                on_rows(rows)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--cpu", action="store_const", dest="mode", const="cpu")
    mode.add_argument("--gpu", action="store_const", dest="mode", const="gpu")
    mode.add_argument("--smoke", action="store_const", dest="mode", const="smoke")
    ap.add_argument("--batches", default=None, help="comma-separated batch sizes")
    ap.add_argument("--max-new", type=int, default=None)
    ap.add_argument(
        "--forced-acceptance",
        default=None,
        help="comma-separated probabilities of the forced-acceptance sweep "
        "(GPU mode default: 0.5,0.7,0.9; random weights need it)",
    )
    ap.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="rounds of every method (CPU mode default: 3; GPU and smoke: 1)",
    )
    ap.add_argument(
        "--workload",
        choices=("humaneval", "edit"),
        default="humaneval",
        help="CPU mode's prompts (edit: code edits; writes cpu_edit_e2e.*)",
    )
    ap.add_argument(
        "--policies",
        default=None,
        help="comma-separated policies to run (default: the mode's set: "
        f"GPU {','.join(GPU_POLICIES)}; CPU {','.join(CPU_POLICIES)})",
    )
    ap.add_argument(
        "--graph-batches",
        default=None,
        help="batch sizes run again with CUDA graphs after the eager grid, bass-regular and "
        "every policy (GPU mode default: 1,2,4,8; '' for none)",
    )
    ap.add_argument(
        "--assisted-upto",
        type=int,
        default=None,
        help="largest batch timed with hf-assisted (GPU default 8, CPU 64; 0: never)",
    )
    ap.add_argument(
        "--attention",
        default=None,
        help="packed attention implementation of every bass run (default: auto)",
    )
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--no-plots", action="store_true")
    args = ap.parse_args(argv)
    mode = args.mode or "cpu"
    defaults = {"cpu": ("1,2,4,8,16", 64), "gpu": ("1,2,4,8,16,32", 128), "smoke": ("1,2", 4)}
    batches = [int(b) for b in (args.batches or defaults[mode][0]).split(",")]
    max_new = args.max_new or defaults[mode][1]
    repeats = args.repeats or (3 if mode == "cpu" else 1)
    setup = {"cpu": cpu_setup, "gpu": gpu_setup, "smoke": smoke_setup}[mode]
    if mode == "cpu":
        main_model, draft, prompts, label = setup(max(batches), args.workload)
    else:
        main_model, draft, prompts, label = setup(max(batches))
    sweep = args.forced_acceptance or ("0.5,0.7,0.9" if mode == "gpu" else None)
    forced = tuple(float(p) for p in sweep.split(",")) if sweep else (None,)
    known = GPU_POLICIES if mode == "gpu" else CPU_POLICIES
    policies = (
        {n: {**CPU_POLICIES, **GPU_POLICIES}[n] for n in args.policies.split(",")}
        if (args.policies)
        else known
    )
    graphs = (
        args.graph_batches
        if args.graph_batches is not None
        else ("1,2,4,8" if mode == "gpu" else "")
    )
    meta = run_meta(
        "bench_e2e.py",
        sys.argv[1:] if argv is None else argv,
        cuda=mode == "gpu",
        setup=label,
        mode=mode,
        max_new=max_new,
        repeats=repeats,
        forced_acceptance=None if forced == (None,) else list(forced),
        attention=args.attention or "auto",
    )
    tag = {"cpu": "cpu", "gpu": "gpu", "smoke": "smoke"}[mode]
    if mode == "cpu" and args.workload != "humaneval":
        tag = f"cpu_{args.workload}"
    args.out.mkdir(parents=True, exist_ok=True)

    def report(rows) -> str:  # after every batch size: a run cut short keeps its rows
        if mode == "gpu":
            meta.update(device_meta(rows, main_model, draft, meta["machine"], "cuda"))
        text = to_markdown(rows, meta)
        (args.out / f"{tag}_e2e.md").write_text(text)
        data = {"meta": meta, "rows": rows}
        (args.out / f"{tag}_e2e.json").write_text(json.dumps(data, indent=1))
        return text

    rows = run_grid(
        main_model,
        draft,
        prompts,
        batches,
        max_new,
        policies,
        forced,
        assisted_upto=args.assisted_upto
        if args.assisted_upto is not None
        else (8 if mode == "gpu" else 64),
        compiled=mode == "cpu",
        graph_batches=[int(b) for b in graphs.split(",") if b],
        repeats=repeats,
        on_rows=report,
        attention=args.attention,
        warm_round=mode == "gpu",
    )
    text = report(rows)
    if not args.no_plots:
        plot(
            rows,
            args.out / f"{tag}_e2e_latency.png",
            args.out / f"{tag}_e2e_draft_length.png",
            label,
        )
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
