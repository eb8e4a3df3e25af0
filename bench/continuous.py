"""Continuous batching against static chunks and transformers' own, on a many-prompt job.

``python bench/continuous.py``: the embedded default model (SmolLM2-135M-Instruct, CPU),
the 64 chat prompts of ``_prompts.CHAT_MIXED`` in the chat template, greedy, at most
``--max-new-tokens`` (192) new tokens a row, every row ending at eos: the answers' lengths
spread from a few tokens to the cap, so a batch that waits for its longest row idles.
``--rows`` (16) rows generate at once. ``--order``: the prompts shuffled (a fixed seed-0
permutation, the default: a job's order knows nothing of its answers' lengths) or as given
(``CHAT_MIXED`` lists them by answer length, so static chunks hold rows of like lengths:
static batching's best case). Methods, side by side in one run, each in its own
process (its peak RSS is that method's peak memory; loading the model is timed apart and
not counted in tokens/s):

* ``transformers-generate_batch``: transformers' continuous batching,
  ``model.generate_batch`` (paged KV cache), its settings left at their defaults except
  greedy decoding with the same max_new_tokens and eos, ``max_requests_per_batch=--rows``
  (the requests in one forward pass: its concurrency) and ``num_blocks``: a KV cache for
  ``--rows`` requests of the longest prompt plus the cap (its CPU default takes 60% of the
  free RAM; ``--hf-num-blocks 0`` keeps that default). What was used is recorded;
* ``bass-static-off``, ``bass-static``: :class:`bass.Generator` on consecutive chunks of
  ``--rows`` prompts, one ``generate`` call each (every chunk waits for its longest row:
  bass before continuous batching), drafting off and the default drafter (n-gram, default
  policy);
* ``bass-continuous-off``, ``bass-continuous``: one ``generate`` call over all prompts with
  ``max_rows=--rows`` (a finished row's slot goes to the next prompt), drafting off and n-gram;
* ``cli``: the same job through ``python -m bass generate --prompts-file F --batch-size
  ROWS --max-new-tokens N --output O --no-progress`` (n-gram): the wall time of the whole
  command (model load included) and the tokens/s its summary prints.

``--rounds`` (2) rounds run every method once each, the order rotated by one each round
(round 2 starts with the second method): the table gives the median of the rounds' wall
times, tokens/s and ratios, each round's beside it (a ratio is of two methods of the same
round). The bass and transformers methods run a short warm-up generation (one prompt, two
tokens) first, timed and reported, not counted. Reported per method: new tokens, wall seconds,
tokens/s, peak RSS, load (and setup: bass's CPU calibration) seconds, the answer lengths
(min/median/max, rows cut at the cap) and tokens/s against generate_batch and against
bass's static chunks with the same drafting. Greedy bass output does not depend on the
batching: every bass method's rows (the CLI's: text and token counts) are checked against
``bass-static-off`` token for token and any difference is printed loudly;
generate_batch's rows are compared too (its attention kernels may round differently).

Writes ``bench/results/cpu_continuous.{md,json}``. ``--smoke``: a tiny random Llama saved
with a word-level tokenizer (so the CLI can load it too), a few prompts and tokens, the
other methods in one process and the CLI in its own beside it (their imports are most of
the run's time); writes ``smoke_continuous.*`` under ``--out`` (the tests run it).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _continuous_report import GB, REFERENCE, compare, spread, to_markdown
from _machine import run_meta
from _prompts import CHAT_MIXED, tiny_llama

RESULTS = Path(__file__).parent / "results"
ROOT = Path(__file__).resolve().parents[1]
METHODS = (GB, "bass-static-off", "bass-static", "bass-continuous-off", "bass-continuous", "cli")
# the static-chunk method each method is compared with: the same drafting
STATIC_OF = {
    "bass-static-off": "bass-static-off",
    "bass-continuous-off": "bass-static-off",
    "bass-static": "bass-static",
    "bass-continuous": "bass-static",
    "cli": "bass-static",
    "cli (its summary)": "bass-static",
}
SUMMARY = re.compile(r"tokens generated\s+(\d+) in ([\d.]+) s \(([\d.]+) tokens/s")


# ----------------------------------------------------------------------------- models


def smoke_model_dir(path: Path, n_prompts: int, max_new: int) -> None:
    """A tiny random Llama and a word-level tokenizer over its 64 ids saved in ``path``;
    its eos is the id whose first appearance in the model's greedy answers to the smoke
    prompts (:func:`smoke_token_prompts`) falls at the most different lengths (so rows end
    at different times, as the real job's do)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from bass.testing import greedy_reference

    model = tiny_llama(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2)
    answers = [greedy_reference(model, p, max_new) for p in smoke_token_prompts(n_prompts)]

    def spread(t: int) -> tuple[int, int]:  # distinct answer lengths with eos t, rows it ends
        ends = [a.index(t) + 1 for a in answers if t in a]
        return len(set(ends) | ({max_new} if len(ends) < len(answers) else set())), len(ends)

    eos = max(range(2, 64), key=spread)  # not <unk> or <s>
    words = ["<unk>", "<s>"] + [f"w{i}" for i in range(2, 64)]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token=words[eos]
    )
    model.generation_config.eos_token_id = eos
    model.config.eos_token_id = eos
    model.save_pretrained(path)
    tok.save_pretrained(path)


def smoke_token_prompts(n: int) -> list[list[int]]:
    import torch

    g = torch.Generator().manual_seed(0)
    return [
        torch.randint(2, 64, (int(k),), generator=g).tolist()
        for k in torch.randint(3, 12, (n,), generator=g)
    ]


def smoke_texts(n: int) -> list[str]:
    return [" ".join(f"w{i}" for i in p) for p in smoke_token_prompts(n)]


def load(model: str):
    """``(main, tokenizer)``: the embedded default model, or a saved model directory."""
    if model == "default":
        from bass import load_default_pair

        return load_default_pair()
    from bass.models import load_causal_lm, load_tokenizer

    return load_causal_lm(model), load_tokenizer(model)


# ----------------------------------------------------------------------------- worker


def hf_settings(job: dict, prompts: list[list[int]]) -> dict:
    """The settings given to generate_batch: greedy with the job's max_new_tokens and eos;
    ``max_requests_per_batch`` = rows; ``num_blocks``: room for ``rows`` requests of the
    longest prompt plus the cap (+1 page each), unless ``hf_num_blocks`` says otherwise
    (0: transformers' default)."""
    from transformers import ContinuousBatchingConfig

    page = ContinuousBatchingConfig().page_size
    longest = max(map(len, prompts)) + job["max_new"]
    blocks = job["hf_num_blocks"]
    if blocks is None:
        blocks = job["rows"] * (math.ceil(longest / page) + 1)
    cb = {"max_requests_per_batch": job["rows"], **({"num_blocks": blocks} if blocks else {})}
    gen = {
        "max_new_tokens": job["max_new"],
        "do_sample": False,
        "eos_token_id": job["eos"],
        "pad_token_id": job["eos"],
    }
    return {"generation_config": gen, "continuous_batching_config": cb, "page_size": page}


def run_generate_batch(main, prompts, job, warmup: bool) -> dict:
    from transformers import ContinuousBatchingConfig, GenerationConfig

    settings = hf_settings(job, prompts)
    gc = GenerationConfig(**settings["generation_config"])
    cb = ContinuousBatchingConfig(**settings["continuous_batching_config"])
    warm = None
    if warmup:
        t0 = time.perf_counter()
        short = GenerationConfig(**{**settings["generation_config"], "max_new_tokens": 2})
        main.generate_batch(prompts[:1], generation_config=short, continuous_batching_config=cb)
        warm = time.perf_counter() - t0
    t0 = time.perf_counter()
    out = main.generate_batch(prompts, generation_config=gc, continuous_batching_config=cb)
    wall = time.perf_counter() - t0
    results = list(out.values())  # in the order of the inputs
    errors = [r.error for r in results if r.error is not None]
    if len(results) != len(prompts) or errors:
        raise RuntimeError(f"generate_batch: {len(results)} of {len(prompts)} rows, {errors[:3]}")
    seqs = [list(r.generated_tokens) for r in results]
    return {
        "wall_s": wall,
        "warmup_s": warm,
        "sequences": seqs,
        "settings": {k: v for k, v in settings.items() if k != "page_size"}
        | {
            "other": "otherwise transformers' defaults (page_size "
            f"{settings['page_size']}, FIFO scheduler, no compile, no CUDA graphs or async "
            f"batching on a CPU, paged attention over the model's "
            f"{main.config._attn_implementation})"
        },
    }


def run_bass(main, prompts, job, method: str, warmup: bool) -> dict:
    from bass import Generator
    from bass.stats import GenerationStats

    t0 = time.perf_counter()
    gen = Generator(
        main, None if method.endswith("-off") else "ngram", cpu_linear=job["cpu_linear"]
    )
    setup = time.perf_counter() - t0
    kw = {"max_new_tokens": job["max_new"], "eos_token_id": job["eos"]}
    warm = None
    if warmup:
        t0 = time.perf_counter()
        gen.generate(prompts[:1], **{**kw, "max_new_tokens": 2})
        warm = time.perf_counter() - t0
    rows = job["rows"]
    t0 = time.perf_counter()
    if method.startswith("bass-static"):
        parts = [
            gen.generate(prompts[i : i + rows], max_rows=len(prompts[i : i + rows]), **kw)
            for i in range(0, len(prompts), rows)
        ]
    else:
        parts = [gen.generate(prompts, max_rows=rows, **kw)]
    wall = time.perf_counter() - t0
    st = GenerationStats.merge([p.stats for p in parts])
    return {
        "wall_s": wall,
        "setup_s": setup,
        "warmup_s": warm,
        "sequences": [s for p in parts for s in p.sequences],
        "finish_reasons": [f for p in parts for f in p.finish_reasons],
        "calls": len(parts),
        "stats": {
            "tokens_generated": st.tokens_generated,
            "mean_accepted": st.mean_accepted,
            "main_passes_per_token": st.main_passes_per_token,
            "steps": len(st.steps),
            "max_rows": st.max_rows,
            "kv_budget_gib": st.kv_budget_bytes / 2**30,
            "admissions": st.admissions,
            "riding_admissions": getattr(st, "riding_admissions", 0),  # older commits: none
        },
    }


def worker(methods: list[str], job_path: Path, result_path: Path) -> int:
    """Run ``methods`` (in this process) on the job; write what each measured."""
    try:  # the text the CLI writes: the new tokens decoded after their prompt
        from bass.stopping import decode_after
    except ImportError:  # an older bass (compare_commits.py): they were decoded alone
        from bass.stopping import decode

        def decode_after(tok, prompt, ids):
            return decode(tok, ids)

    job = json.loads(job_path.read_text())
    t0 = time.perf_counter()
    main, tok = load(job["model"])
    load_s = time.perf_counter() - t0
    chat = job["chat"]
    from bass.models import encode_prompt

    prompts = [encode_prompt(tok, t, chat) for t in job["texts"]]
    out = {}
    for m in methods:  # each runs under its own inference or no-grad mode
        if m == GB:
            try:
                r = run_generate_batch(main, prompts, job, job["warmup"])
            except Exception as exc:  # the smoke run says why and goes on
                if not job["smoke"]:
                    raise
                out[m] = {"skipped": f"generate_batch failed on the tiny model: {exc!r:.300}"}
                continue
        else:
            r = run_bass(main, prompts, job, m, job["warmup"])
        r["load_s"], load_s = load_s, None  # loaded once per process: the first method's
        r["texts"] = [decode_after(tok, p, s) for p, s in zip(prompts, r["sequences"])]
        r["prompt_tokens"] = [len(p) for p in prompts]
        r["rss_self_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        out[m] = r
    result_path.write_text(json.dumps(out))
    return 0


# ----------------------------------------------------------------------------- parent


def start_child(argv: list[str], log: Path, threads: int | None = None):
    """Start ``argv``, its output to ``log`` (``threads``: its torch threads, else the
    default); :func:`finish_child` waits for it."""
    env = dict(os.environ, **({"OMP_NUM_THREADS": str(threads)} if threads else {}))
    with open(log, "w") as f:
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
        return proc, t0


def finish_child(started) -> tuple[int, float, float]:
    """The exit status, wall seconds and peak RSS (MiB, its own: ``wait4``'s rusage of that
    one child) of a :func:`start_child` process, once it ends."""
    proc, t0 = started
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = rc = os.waitstatus_to_exitcode(status)
    return rc, wall, usage.ru_maxrss / 1024  # Linux: KiB


def start_cli(job: dict, tmp: Path):
    """Start the job's ``python -m bass generate``; :func:`finish_cli` collects it."""
    prompts_file, output = tmp / "prompts.txt", tmp / "cli_out.jsonl"
    prompts_file.write_text("".join(t + "\n" for t in job["texts"]))
    flags = ["--batch-size", str(job["rows"]), "--max-new-tokens", str(job["max_new"])]
    flags += ["--no-progress"] + (["--main", "MODEL"] if job["model"] != "default" else [])
    if job["cpu_linear"] is not None:  # the smoke run's: no calibration
        flags += ["--cpu-linear", job["cpu_linear"]]
    shown = [
        "generate",
        "--prompts-file",
        "PROMPTS.txt",
        *flags[:4],
        "--output",
        "OUT.jsonl",
        *flags[4:],
    ]
    subst = {"PROMPTS.txt": str(prompts_file), "OUT.jsonl": str(output), "MODEL": job["model"]}
    args = [subst.get(a, a) for a in shown]
    threads = 1 if job["smoke"] else None  # the smoke run's two processes side by side
    cmd = [sys.executable, "-m", "bass", *args]
    return start_child(cmd, tmp / "cli.log", threads), shown, output


def finish_cli(tmp: Path, started) -> dict:
    child, shown, output = started
    rc, wall, rss = finish_child(child)
    text = (tmp / "cli.log").read_text()
    if rc:
        raise RuntimeError(f"bass generate exited with {rc}:\n{text[-3000:]}")
    m = SUMMARY.search(text)
    rows = sorted(
        (json.loads(line) for line in output.read_text().splitlines()),
        key=lambda r: r["prompt_index"],
    )
    return {
        "wall_s": wall,  # the whole command: model load included
        "rss_mib": rss,
        "command": "python -m bass " + " ".join(shown),
        "printed": {"tokens": int(m[1]), "seconds": float(m[2]), "tokens_per_s": float(m[3])}
        if m
        else None,
        "texts": [r["completion"] for r in rows],
        "lengths": [r["completion_tokens"] for r in rows],
        "finish_reasons": [r["finish_reason"] for r in rows],
    }


def run_round(k: int, methods, job: dict, tmp: Path, smoke: bool, skipped: list) -> dict:
    """Round ``k`` of every method, each API method in a process of its own (the smoke
    run's share one, the CLI beside it), the CLI too; the order rotated by ``k`` (round
    ``k`` starts with the ``k``-th method), so a shared machine's drift does not favour the
    same method every round. Returns what each method measured."""
    here = tmp / f"round{k}"
    here.mkdir()
    api = [m for m in methods if m != "cli"]
    units = [api] if smoke and api else [[m] for m in api]
    if "cli" in methods and not smoke:
        units.append(["cli"])
    if units:
        units = units[k % len(units) :] + units[: k % len(units)]
    results: dict = {}
    cli = None
    if smoke and "cli" in methods:  # beside the other process: the smoke run's time
        print("continuous: running cli (beside the others: smoke) ...", flush=True)
        cli = start_cli(job, here)
    for group in units:
        print(f"continuous: round {k + 1}: running {', '.join(group)} ...", flush=True)
        if group == ["cli"]:
            results["cli"] = {**finish_cli(here, start_cli(job, here)), "load_s": None}
            continue
        res = here / "result.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", ",".join(group)]
        cmd += ["--job", str(tmp / "job.json"), "--result", str(res)]
        threads = 1 if smoke else None  # side by side with the CLI: one each
        rc, _, rss = finish_child(start_child(cmd, here / "worker.log", threads))
        if rc:
            log = (here / "worker.log").read_text()
            raise RuntimeError(f"{', '.join(group)} exited with {rc}:\n{log[-3000:]}")
        for m, r in json.loads(res.read_text()).items():
            if "skipped" in r:  # the smoke run: generate_batch failed on the tiny model
                skipped.append(f"{m}: {r['skipped']}")
                print(f"continuous: skipped {skipped[-1]}", flush=True)
                continue
            r.update(rss_mib=rss, shared_process=len(group) > 1)
            results[m] = r
    if cli is not None:
        results["cli"] = {**finish_cli(here, cli), "load_s": None}
    return results


def _median(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def rows_of(m: str, runs: list[dict], cap: int, extra: dict) -> list[dict]:
    """Method ``m``'s row of the table from its runs (one a round): the median of the
    rounds' tokens/s and wall times, each round's beside them; the CLI's two rows (the
    whole command, and the generation its summary printed)."""
    lengths = [r["lengths"] if m == "cli" else [len(s) for s in r["sequences"]] for r in runs]
    walls = [r["wall_s"] for r in runs]
    rates = [sum(n) / w for n, w in zip(lengths, walls)]
    row = {
        "method": m,
        "tokens": sum(lengths[0]),
        "wall_s": statistics.median(walls),
        "tokens_per_s": statistics.median(rates),
        "round_wall_s": walls,
        "round_tokens_per_s": rates,
        "rss_mib": max(r["rss_mib"] for r in runs),
        "shared_process": runs[0].get("shared_process", False),
        "load_s": _median(r["load_s"] for r in runs),
        "setup_s": _median(r.get("setup_s") for r in runs),
        "warmup_s": _median(r.get("warmup_s") for r in runs),
        "lengths": lengths[0],
        "lengths_spread": spread(lengths[0], cap),
    }
    row.update(runs[0].get("stats", {}))
    if m == GB:
        extra[GB] = row["settings"] = runs[0]["settings"]
    if m != "cli":
        return [row]
    printed = [r["printed"] for r in runs]
    row["printed"] = printed[0]
    extra["cli"] = {"command": runs[0]["command"], "wall_s": walls, "printed": printed}
    if not all(printed):
        return [row]
    rates = [p["tokens_per_s"] for p in printed]  # as printed (its seconds are rounded)
    seconds = [p["seconds"] for p in printed]
    summary = {
        "method": "cli (its summary)",
        "tokens": printed[0]["tokens"],
        "wall_s": statistics.median(seconds),
        "tokens_per_s": statistics.median(rates),
        "round_wall_s": seconds,
        "round_tokens_per_s": rates,
    }
    return [row, {**row, **summary}]


def per_round(row: dict, base: dict) -> list[float]:
    """``row``'s tokens/s over ``base``'s, round by round (the two ran in the same round)."""
    return [a / b for a, b in zip(row["round_tokens_per_s"], base["round_tokens_per_s"])]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-new-tokens", type=int, default=None, help="the cap (default 192)")
    ap.add_argument("--rows", type=int, default=None, help="rows at once (default 16)")
    ap.add_argument("--prompts", type=int, default=None, help="the first N prompts (default all)")
    ap.add_argument(
        "--methods", default=",".join(METHODS), help="comma-separated, of: " + ", ".join(METHODS)
    )
    ap.add_argument(
        "--hf-num-blocks",
        type=int,
        default=None,
        help="generate_batch's num_blocks "
        "(default: room for --rows requests; 0: transformers' default, 60%% of the "
        "free RAM on a CPU)",
    )
    ap.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="rounds of every method, each round in an order rotated by one (default 2; "
        "the smoke run 1)",
    )
    ap.add_argument(
        "--order",
        choices=("shuffled", "given"),
        default="shuffled",
        help="the prompts' order: shuffled (a fixed seed-0 permutation, the default) or as "
        "given (CHAT_MIXED lists them by answer length: static chunks then hold rows of like "
        "lengths, static batching's best case)",
    )
    ap.add_argument("--smoke", action="store_true", help="a tiny random model (the tests)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--job", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args.worker.split(","), args.job, args.result)
    methods = [m for m in args.methods.split(",") if m]
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        ap.error(f"unknown methods {unknown}; choose from {', '.join(METHODS)}")
    methods = [m for m in METHODS if m in methods]  # in the table's order
    max_new = args.max_new_tokens or (8 if args.smoke else 192)
    rows = args.rows or (3 if args.smoke else 16)
    n_rounds = args.rounds or (1 if args.smoke else 2)
    if n_rounds < 1:
        ap.error(f"--rounds {n_rounds}: expected at least 1")
    meta = run_meta(
        "continuous.py",
        sys.argv[1:] if argv is None else argv,
        setup="tiny random Llama, word-level tokenizer (smoke)"
        if args.smoke
        else "SmolLM2-135M-Instruct (embedded), CHAT_MIXED prompts in the chat template",
        max_new_tokens=max_new,
        rows=rows,
        rounds=n_rounds,
    )
    tag = "smoke" if args.smoke else "cpu"
    args.out.mkdir(parents=True, exist_ok=True)
    extra: dict = {}
    skipped: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bass_continuous_") as tmpdir:
        tmp = Path(tmpdir)
        if args.smoke:
            smoke_model_dir(tmp / "model", args.prompts or 7, max_new)
            texts = smoke_texts(args.prompts or 7)
            model = str(tmp / "model")
        else:
            texts = CHAT_MIXED[: args.prompts] if args.prompts else list(CHAT_MIXED)
            model = "default"
        if args.order == "shuffled":  # a job's order knows nothing of its answers' lengths
            texts = random.Random(0).sample(texts, len(texts))
        from bass.models import default_model_file, load_tokenizer

        tok = load_tokenizer(model if args.smoke else default_model_file())
        job = {
            "model": model,
            "texts": texts,
            "chat": getattr(tok, "chat_template", None) is not None,  # as bass generate
            "eos": tok.eos_token_id,
            "max_new": max_new,
            "rows": rows,
            "hf_num_blocks": args.hf_num_blocks,
            "warmup": True,
            "cpu_linear": "torch" if args.smoke else None,  # smoke: skip the calibration
            "smoke": args.smoke,
        }
        meta.update(
            prompts=len(texts),
            order=args.order,
            eos_token_id=job["eos"],
            chat=job["chat"],
            cpu_linear=job["cpu_linear"] or "auto",
        )
        (tmp / "job.json").write_text(json.dumps(job))
        rounds = [run_round(k, methods, job, tmp, args.smoke, skipped) for k in range(n_rounds)]

    report = []
    for m in methods:
        runs = [r[m] for r in rounds if m in r]
        if runs:
            report += rows_of(m, runs, max_new, extra)
    by = {r["method"]: r for r in report}
    for r in report:
        if GB in by:
            r["vs_generate_batch"] = r["tokens_per_s"] / by[GB]["tokens_per_s"]
            r["vs_generate_batch_rounds"] = per_round(r, by[GB])
        base = by.get(STATIC_OF.get(r["method"], ""))
        if base is not None:
            r["vs_static"] = r["tokens_per_s"] / base["tokens_per_s"]
            r["vs_static_rounds"] = per_round(r, base)
    mismatches: dict[str, list[int]] = {}
    for results in rounds:  # every round's rows against that round's reference
        for m, bad in compare(results).items():
            mismatches[m] = sorted(set(mismatches.get(m, [])) | set(bad))
    if skipped:
        extra["skipped"] = skipped
    data = {
        "meta": meta,
        "methods": report,
        "mismatches": mismatches,
        "skipped": skipped,
        "prompts": texts,
    }
    text = to_markdown(meta, report, mismatches, extra)
    (args.out / f"{tag}_continuous.json").write_text(json.dumps(data, indent=1))
    (args.out / f"{tag}_continuous.md").write_text(text)
    print(text)
    for m, bad in mismatches.items():
        if bad and m != GB:
            print(
                f"continuous: MISMATCH: {m} differs from {REFERENCE} in {len(bad)} rows: {bad}",
                file=sys.stderr,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
