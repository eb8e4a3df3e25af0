"""Machine measurements the benchmark scripts share."""

from __future__ import annotations

import time

import torch


def copy_bandwidth_gbs(device="cuda", nbytes: int = 1 << 30) -> float:
    """Measured device copy bandwidth (read + write bytes / time), GB/s: the memory
    bandwidth a bandwidth-bound kernel can hope for on this device."""
    x = torch.empty(nbytes, dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    for _ in range(3):
        y.copy_(x)
    sync()
    t0 = time.perf_counter()
    for _ in range(10):
        y.copy_(x)
    sync()
    return 2 * x.numel() * 10 / (time.perf_counter() - t0) / 1e9
