"""The built-in draft-length policies side by side on tiny random models (CPU).

``python bench/bench_policies.py`` writes ``bench/results/cpu_policies_tiny.md`` and
``.json``; ``pytest bench --benchmark-enable`` (``nox -s bench``) times one generation per
policy. Same prompts, same main/draft pair, greedy, in one run: mean accepted draft tokens
per step per row, main-model forward passes per generated token (lower is better; 1.0 is
regular decoding), draft passes per token, and wall time on this machine.

The pair is a tiny random Llama (2 layers, hidden 64) and a noisy copy of it as the
draft, so acceptance is partial, as with real pairs; absolute speeds mean little on
models this small, the pass counts are the point.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import platform
import sys
import time
from pathlib import Path

import pytest
import torch

from bass import Generator

POLICIES = {
    "constant(k=4)": ("constant", {"k": 4}),
    "bass": ("bass", {}),
    "hf-heuristic": ("hf-heuristic", {}),
    "confidence": ("confidence", {}),
    "goodput": ("goodput", {}),
    "regular (k=0)": ("constant", {"k": 0}),
}


def tiny_pair(vocab: int = 128, noise: float = 0.25):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    main = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        main.lm_head.weight.mul_(25.0)  # decisive logits (random init is near-uniform)
    draft = copy.deepcopy(main)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=g) * noise * p.std().nan_to_num())
    return main, draft


def prompts(batch: int, vocab: int = 128, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(4, 24, (batch,), generator=g).tolist()
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lens]


def run_policy(main, draft, name, opts, batch: int, max_new: int) -> dict:
    gen = Generator(main, draft, policy=name, policy_options=opts)
    t0 = time.perf_counter()
    res = gen.generate(prompts(batch), max_new_tokens=max_new)
    wall = time.perf_counter() - t0
    st = res.stats
    return {
        "mean_accepted": st.mean_accepted,
        "main_passes_per_token": st.main_passes_per_token,  # per row; regular decoding = 1
        "main_passes": st.main_passes,  # batched forward passes
        "draft_passes": st.draft_passes,
        "tokens": st.tokens_generated,
        "steps": len(st.steps),
        "wall_s": wall,
        "draft_length_trace": st.draft_length_trace(),
    }


def measure(batch: int = 8, max_new: int = 48) -> dict:
    main, draft = tiny_pair()
    return {
        label: run_policy(main, draft, n, o, batch, max_new) for label, (n, o) in POLICIES.items()
    }


def to_markdown(results: dict, batch: int, max_new: int, command: str) -> str:
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    lines = [
        "# Draft-length policies on a tiny random pair (CPU)",
        "",
        f"Command: `{command}`  ",
        f"Date: {now}  ",
        f"Machine: {platform.machine()}, {torch.get_num_threads()} torch threads, "
        f"torch {torch.__version__}  ",
        f"Workload: batch {batch}, ragged random prompts (4-23 tokens), {max_new} new tokens, "
        "greedy; main = tiny random Llama, draft = the same with weight noise "
        "(partial agreement).",
        "",
        "| policy | mean accepted / step / row | main passes / token / row | main passes "
        "| draft passes | wall s |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for label, r in results.items():
        lines.append(
            f"| {label} | {r['mean_accepted']:.2f} | {r['main_passes_per_token']:.3f} | "
            f"{r['main_passes']} | {r['draft_passes']} | {r['wall_s']:.2f} |"
        )
    lines += ["", "Draft-length traces (first 20 steps):", ""]
    lines += [f"- {label}: {r['draft_length_trace'][:20]}" for label, r in results.items()]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("label", list(POLICIES))
def test_policy_generation(benchmark, label):
    main, draft = tiny_pair()
    name, opts = POLICIES[label]
    out = benchmark.pedantic(run_policy, args=(main, draft, name, opts, 8, 32), rounds=1)
    benchmark.extra_info.update({k: v for k, v in out.items() if k != "draft_length_trace"})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--max-new", type=int, default=48)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = ap.parse_args(argv)
    results = measure(args.batch, args.max_new)
    command = "python bench/bench_policies.py " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "cpu_policies_tiny.md").write_text(
        to_markdown(results, args.batch, args.max_new, command.strip())
    )
    (args.out / "cpu_policies_tiny.json").write_text(
        json.dumps(
            {
                "command": command.strip(),
                "torch": torch.__version__,
                "batch": args.batch,
                "max_new_tokens": args.max_new,
                "results": results,
            },
            indent=1,
        )
    )
    print(to_markdown(results, args.batch, args.max_new, command.strip()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
