"""A small run of every CUDA implementation of the ragged attention family and the KV
appends, padded and packed (the form the engine runs), for ``compute-sanitizer``
(bench/gpu_suite.sh's second call; run it with PYTORCH_NO_CUDA_MEMORY_CACHING=1 so
an access past a tensor is not hidden inside one of the caching allocator's large
blocks): ragged lengths with zero-length rows, GQA, fp16 and bf16, and a long single-row
decode (which sends ``fused`` down its split-KV path and combine kernel), each result
compared with the reference. ``python bench/gpu_sanitize.py --device cpu`` runs the same
checks on the CPU's implementations (the script's own test)."""

import argparse

import torch

import bass
from bass import ops


def main(dev: str = "cuda") -> None:
    g = torch.Generator().manual_seed(0)
    cases = {  # name: (B, Hq, Hkv, T, S, D, kv_lens, q_lens)
        "ragged": (5, 8, 2, 5, 300, 128, [300, 0, 17, 5, 260], [5, 0, 3, 5, 1]),
        "long-decode": (1, 8, 2, 1, 4096, 128, [4000], [1]),
    }
    for dtype in (torch.float16, torch.bfloat16):
        for name, (B, Hq, Hkv, T, S, D, kv_lens, q_lens) in cases.items():
            q = torch.randn(B, Hq, T, D, generator=g).to(dev, dtype)
            k = torch.randn(B, Hkv, S, D, generator=g).to(dev, dtype)
            v = torch.randn(B, Hkv, S, D, generator=g).to(dev, dtype)
            kv = torch.tensor(kv_lens, dtype=torch.int32, device=dev)
            ql = torch.minimum(torch.tensor(q_lens, dtype=torch.int32, device=dev), kv)
            ref = torch.ops.bass.ragged_attention(q, k, v, ql, kv, D**-0.5, "reference")
            for impl in ops.implementations(dev):
                out = torch.ops.bass.ragged_attention(q, k, v, ql, kv, D**-0.5, impl)
                torch.testing.assert_close(out, ref, atol=2e-2, rtol=2e-2)
                print(f"{impl} {dtype} {name}: ok")
            kc, vc = torch.zeros_like(k), torch.zeros_like(v)
            bass.ops.kv_append(kc, vc, k[:, :, :T], v[:, :, :T], kv - ql, ql)
            # the packed form: row b's q_lens[b] queries one after another, no padding
            n = int(ql.sum())
            cu = torch.zeros(B + 1, dtype=torch.int32, device=dev)
            cu[1:] = torch.cumsum(ql, 0)
            qp = torch.randn(1, Hq, n, D, generator=g).to(dev, dtype)
            args = (qp, k, v, cu, kv, D**-0.5)
            ref = torch.ops.bass.ragged_attention_packed(*args, "reference")
            for impl in ops.implementations(dev):
                out = torch.ops.bass.ragged_attention_packed(*args, impl)
                torch.testing.assert_close(out, ref, atol=2e-2, rtol=2e-2)
                print(f"packed {impl} {dtype} {name}: ok")
            kn = torch.randn(1, Hkv, n, D, generator=g).to(dev, dtype)
            bass.ops.kv_append_packed(kc, vc, kn, kn, cu, kv - ql)
    if dev == "cuda":
        torch.cuda.synchronize()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", help="cpu: the same checks on the CPU")
    main(ap.parse_args().device)
