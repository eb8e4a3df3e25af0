"""Why FlexAttention fails to compile for a head dim on CUDA, and which kernel options work.

    python bench/gpu_flex_probe.py --out DIR      # DIR/flex_probe.json, one row per variant

The first GPU run (bench/results/gpu/2026-11-26-h100) saw flex's main Triton kernel fail to
lower for head dim 128 (``NoValidChoicesError``: every config's template was rejected)
while head dims 32 and 64, and the decode kernel at 128, compiled. Each variant here
compiles the verify pass of bench/gpu_smoke.py (8 rows of 1-33 tokens, 32/8 heads, bf16)
through bass's block mask, with Inductor's reasons for rejecting each template config
captured from its log, and checks the output against the reference.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from gpu_smoke import compare, verify_pass

VARIANTS = {  # name: (head dim, flex_attention kernel_options, dynamic)
    "d64 default": (64, None, True),
    "d128 default": (128, None, True),
    "d128 static shapes": (128, None, False),
    "d128 M64 N64 s2 w4": (
        128,
        {"BLOCK_M": 64, "BLOCK_N": 64, "num_stages": 2, "num_warps": 4},
        True,
    ),
    "d128 M128 N64 s3 w8": (
        128,
        {"BLOCK_M": 128, "BLOCK_N": 64, "num_stages": 3, "num_warps": 8},
        True,
    ),
    "d128 M32 N32 s1 w4": (
        128,
        {"BLOCK_M": 32, "BLOCK_N": 32, "num_stages": 1, "num_warps": 4},
        True,
    ),
    "d128 BACKEND=TRITON": (128, {"BACKEND": "TRITON"}, True),
}


class Reasons(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record):
        text = record.getMessage()
        if "Cannot Append Choice" in text or "choice" in text.lower():
            self.lines.append(text[:1500])


def probe(D: int, options, dynamic: bool, device: str) -> dict:
    from torch.nn.attention.flex_attention import flex_attention

    from bass.ops import reference
    from bass.ops.flex import _block_mask

    plan, (q, k, v, scale) = verify_pass("eager", device, head_dim=D)
    p = plan("flex")
    want = plan("reference").attend(q, k, v, scale)
    st = p.state
    qr = reference.to_rows(q, st.src)
    bm = _block_mask(st, k.shape[2])

    def call(qr, k, v, bm):
        return flex_attention(qr, k, v, block_mask=bm, scale=scale, enable_gqa=True,
                              kernel_options=options)  # fmt: skip

    torch._dynamo.reset()
    fn = torch.compile(call, fullgraph=True, dynamic=dynamic)
    o = fn(qr, k, v, bm)
    out = reference.from_rows(o, st.back)
    return compare(out, want)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--only", default=None, help="comma-separated variant names")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    handler = Reasons()
    log = logging.getLogger("torch._inductor.select_algorithm")
    log.setLevel(logging.INFO)
    log.addHandler(handler)
    results, path = {}, args.out / "flex_probe.json"
    results["versions"] = {"torch": torch.__version__, "cuda": torch.version.cuda}
    with torch.inference_mode():
        for name, (D, options, dynamic) in VARIANTS.items():
            if args.only and name not in args.only.split(","):
                continue
            handler.lines.clear()
            t0 = time.perf_counter()
            try:
                r = probe(D, options, dynamic, args.device)
            except Exception as e:
                r = {"ok": False, "error": f"{type(e).__name__}: {e}"[:1500]}
                traceback.print_exc(limit=3)
            r["seconds"] = round(time.perf_counter() - t0, 1)
            r["rejected"] = sorted(set(handler.lines))[:6]
            results[name] = r
            path.write_text(json.dumps(results, indent=1))
            print(f"{name}: {'ok' if r['ok'] else 'FAILED'} {r}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
