"""A small run of every CUDA implementation of ragged_attention and kv_append, for
``compute-sanitizer`` (bench/gpu_suite.sh): ragged lengths with zero-length rows, GQA,
fp16 and bf16, each result compared with the reference."""

import torch

import bass
from bass import ops


def main() -> None:
    dev = "cuda"
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float16, torch.bfloat16):
        B, Hq, Hkv, T, S, D = 5, 8, 2, 5, 300, 128
        q = torch.randn(B, Hq, T, D, generator=g).to(dev, dtype)
        k = torch.randn(B, Hkv, S, D, generator=g).to(dev, dtype)
        v = torch.randn(B, Hkv, S, D, generator=g).to(dev, dtype)
        kv = torch.tensor([300, 0, 17, 5, 260], dtype=torch.int32, device=dev)
        ql = torch.minimum(torch.tensor([5, 0, 3, 5, 1], dtype=torch.int32, device=dev), kv)
        ref = torch.ops.bass.ragged_attention(q, k, v, ql, kv, D**-0.5, "reference")
        for impl in ops.available_implementations(dev):
            out = torch.ops.bass.ragged_attention(q, k, v, ql, kv, D**-0.5, impl)
            torch.testing.assert_close(out, ref, atol=2e-2, rtol=2e-2)
            print(f"{impl} {dtype}: ok")
        kc, vc = torch.zeros_like(k), torch.zeros_like(v)
        bass.ops.kv_append(kc, vc, k[:, :, :T], v[:, :, :T], kv - ql, ql)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
