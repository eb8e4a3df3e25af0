"""Where a decoding step's time goes: torch.profiler over one generation.

``python bench/profile_step.py`` runs bass on the embedded default model (SmolLM2-135M,
CPU) with n-gram drafting, after a discarded warm-up run, under ``torch.profiler``, and
writes ``bench/results/cpu_step_profile.md``: per step, the time inside the model's
forward passes and the rest (bass's own host work), and the operators with the most self
time. ``--drafting off`` profiles regular decoding, ``--tiny`` a tiny random model (where
bass's own overhead is most of the step), ``--label`` names the run in the file (to put a
before and an after side by side, e.g. from two checkouts).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).parent))
from _machine import header, run_meta

RESULTS = Path(__file__).parent / "results"


def setup(tiny: bool, batch: int):
    if tiny:
        from _prompts import tiny_llama

        main = tiny_llama(
            vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4
        )
        g = torch.Generator().manual_seed(0)
        prompts = [torch.randint(0, 256, (20 + 3 * b,), generator=g).tolist() for b in range(batch)]
        return main, prompts, "tiny random Llama (4 layers, hidden 64)"
    from _prompts import humaneval_prompts

    from bass import load_default_pair

    main, tok = load_default_pair()
    return main, (humaneval_prompts(tok, 16) * batch)[:batch], "SmolLM2-135M-Instruct"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--max-new", type=int, default=32)
    ap.add_argument("--drafting", choices=("ngram", "off"), default="ngram")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--label", default="")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    from bass import Generator

    model, prompts, name = setup(args.tiny, args.batch)
    draft = "ngram" if args.drafting == "ngram" else None
    gen = Generator(model, draft)
    gen.generate(prompts, max_new_tokens=args.max_new)  # warm-up, discarded
    # one cycle: acc_events only keeps torch 2.11 from warning that cycles clear events
    with profile(activities=[ProfilerActivity.CPU], acc_events=True) as prof:
        t0 = time.perf_counter()
        res = gen.generate(prompts, max_new_tokens=args.max_new)
        wall = time.perf_counter() - t0
    st = res.stats
    steps = len(st.steps)
    step_s = sum(s.step_seconds for s in st.steps)
    fwd_s = sum(s.forward_seconds for s in st.steps)
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20)
    meta = run_meta("profile_step.py", sys.argv[1:] if argv is None else argv)
    label = f": {args.label}" if args.label else ""
    lines = [
        *header(f"One generation under torch.profiler{label}", meta),
        f"Workload: {name}, batch {args.batch}, {args.max_new} new tokens, drafting "
        f"{args.drafting}, default policy, greedy.",
        "",
        f"- wall {wall:.2f} s (profiler on), {steps} steps after the prefill",
        f"- per step: {1000 * step_s / max(steps, 1):.1f} ms, of which "
        f"{1000 * fwd_s / max(steps, 1):.1f} ms inside the model's forward passes and "
        f"{1000 * (step_s - fwd_s) / max(steps, 1):.2f} ms outside them (bass's host share "
        f"{st.host_share:.1%})",
        f"- tokens per verify pass: {st.verify_tokens / max(steps, 1):.1f} (padding share "
        f"{st.padding_share:.0%})",
        "",
        "Operators by self CPU time (the whole generation, prefill included):",
        "",
        "```text",
        table,
        "```",
    ]
    text = "\n".join(lines) + "\n"
    out = args.out or RESULTS / f"cpu_step_profile{'_tiny' if args.tiny else ''}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
