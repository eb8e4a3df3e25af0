"""The GPU suite's first stages: the environment, then the default attention on CUDA against
the reference in each pass kind, in seconds.

    python bench/gpu_smoke.py --env --out DIR     # DIR/env.json: device, versions, auto's picks
    python bench/gpu_smoke.py --out DIR           # DIR/smoke.json: one verdict per check

The checks, in order (each one's verdict is written as soon as it is known, so a stage
killed by its time cap keeps what it found):

1. ``op eager``: one packed verify pass of a 7B Llama's attention shape (32/8/128, bf16,
   8 rows of 1-33 new tokens over 300-1000 cached), planned as the engine plans it, through
   ``impl="auto"`` against ``reference``;
2. ``op compiled``: the same traced into ``torch.compile(fullgraph=True)``;
3. ``op graphs``: the same planned for static shapes, compiled with
   ``mode="reduce-overhead"`` (CUDA graphs) and replayed;
4. ``engine eager``: a tiny float32 Llama (head dim 32, so ``auto`` runs ``flex``) with
   the n-gram drafter, greedy rows against the model decoding alone.

Exit status 0 when every check passed.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))  # models.tiny_lm

Q_LENS = [1, 5, 9, 33, 2, 1, 17, 4]  # a verify pass of spread draft lengths
CACHE = [300 + 97 * b % 700 for b in range(len(Q_LENS))]


def environment() -> dict:
    from bass.ops import PASS_KINDS, resolve

    info = {"python": platform.python_version(), "torch": torch.__version__}
    info["cuda"] = torch.version.cuda
    for name in ("triton", "transformers", "hypothesis"):
        try:
            info[name] = __import__(name).__version__
        except ImportError:
            info[name] = None
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info["device"], info["sms"] = props.name, props.multi_processor_count
        info["capability"] = list(torch.cuda.get_device_capability())
        info["memory_gib"] = round(props.total_memory / 2**30, 1)
    try:
        nvcc = subprocess.run(["nvcc", "--version"], capture_output=True, text=True, timeout=10)
        info["nvcc"] = nvcc.stdout.strip().splitlines()[-1]
    except (OSError, subprocess.SubprocessError, IndexError):
        info["nvcc"] = None
    cuda = torch.device("cuda")
    info["auto_on_cuda"] = {k: resolve("auto", cuda, k)[0].name for k in PASS_KINDS}
    return info


def verify_pass(kind: str, device: str, head_dim: int = 128):
    """The plan of one verify pass on ``device`` (``impl`` given later), and its inputs."""
    from bass.ops import Plan

    g = torch.Generator().manual_seed(0)
    B, N, S = len(Q_LENS), sum(Q_LENS), 2048
    q = torch.randn(1, N, 32, head_dim, generator=g).to(device, torch.bfloat16).transpose(1, 2)
    k, v = (torch.randn(B, 8, S, head_dim, generator=g).to(device, torch.bfloat16) for _ in "kv")
    cu = torch.tensor([0, *torch.tensor(Q_LENS).cumsum(0).tolist()], dtype=torch.int32)
    lens = torch.tensor(CACHE, dtype=torch.int32)
    cu, lens, kv = cu.to(device), lens.to(device), (lens + cu.diff()).to(device)

    def plan(impl: str) -> Plan:
        return Plan.for_pass(impl, Q_LENS, CACHE, N, cu, lens, kv, S, kind)

    return plan, (q, k, v, head_dim**-0.5)


def compare(out: torch.Tensor, want: torch.Tensor) -> dict:
    err = (out.float() - want.float()).abs().max().item()
    return {"max_abs_err": err, "ok": bool(err < 2e-2 and torch.isfinite(out).all())}


def check_op(kind: str, device: str) -> dict:
    plan, (q, k, v, scale) = verify_pass(kind, device)
    auto, ref = plan("auto"), plan("reference")
    want = ref.attend(q, k, v, scale)
    if kind == "eager":
        out = auto.attend(q, k, v, scale)
    else:
        mode = "reduce-overhead" if kind == "graphs" else None
        step = torch.compile(lambda p, q: p.attend(q, k, v, scale), fullgraph=True, mode=mode,
                             dynamic=kind == "compiled")  # fmt: skip
        for _ in range(3):  # graphs: warm-up, capture, replay
            out = step(auto, q).clone()
    return {"impl": auto.impl.name, "reason": auto.reason, **compare(out, want)}


def check_engine(device: str) -> dict:
    # tests/models.py's tiny_lm sharpens the output head, so greedy choices are decisive
    from models import tiny_lm

    from bass import Generator
    from bass.testing import greedy_reference

    model = tiny_lm("llama", hidden=128, heads=4, kv_heads=2, dtype=torch.float32, seed=5)
    model = model.to(device)
    prompts = [[3, 7, 3, 7, 3, 7, 1], [5], [9, 2, 9, 2, 9, 2, 9, 2, 4, 4], [1, 2, 3]]
    gen = Generator(model, "ngram", policy="constant", policy_options={"k": 4})
    res = gen.generate(prompts, max_new_tokens=12)
    want = [greedy_reference(model, p, 12) for p in prompts]
    return {"impl": res.stats.attention, "ok": res.sequences == want}


CHECKS = {
    "op eager": lambda d: check_op("eager", d),
    "op compiled": lambda d: check_op("compiled", d),
    "op graphs": lambda d: check_op("graphs", d),
    "engine eager": check_engine,
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--env", action="store_true", help="write env.json only")
    ap.add_argument("--device", default="cuda", help="cpu: the same checks on the CPU")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.env:
        info = environment()
        (args.out / "env.json").write_text(json.dumps(info, indent=1))
        print(json.dumps(info, indent=1))
        return 0 if info.get("device") else 1
    results, path, failed = {}, args.out / "smoke.json", False
    with torch.inference_mode():
        for name, check in CHECKS.items():
            t0 = time.perf_counter()
            try:
                result = check(args.device)
            except Exception as e:  # a verdict per check; the next one still runs
                result = {"ok": False, "error": f"{type(e).__name__}: {e}"[:2000]}
                traceback.print_exc()
            result["seconds"] = round(time.perf_counter() - t0, 2)
            results[name] = result
            failed |= not result["ok"]
            path.write_text(json.dumps(results, indent=1))
            print(f"{name}: {'ok' if result['ok'] else 'FAILED'} {result}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
