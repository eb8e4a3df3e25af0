"""What the ops show a caller besides their contract: their docstrings as torch.ops
sees them, and the query-length buckets (split from test_ops_contract.py)."""

from __future__ import annotations

import pytest
import torch

import bass
from bass.ops import QUERY_BUCKETS, bucket_query_len

# --------------------------------------------------------------------------- docs and buckets


def test_docstrings_reach_torch_ops():
    for name in ("ragged_attention", "kv_append"):
        packet = getattr(torch.ops.bass, name)
        wrapper = getattr(bass.ops, name)
        assert packet.__doc__ == wrapper.__doc__
        assert packet.default.__doc__ == wrapper.__doc__
    doc = torch.ops.bass.ragged_attention.__doc__
    assert doc.startswith("Causal attention of ragged new queries over per-row KV caches.")
    for phrase in (
        "kv_lens[b] - q_lens[b] + i",
        "(output 0)",
        "h // (Hq // Hkv)",
        "Inference only",
    ):
        assert phrase in doc
    assert "cache_lens[b] + i" in torch.ops.bass.kv_append.__doc__


@pytest.mark.parametrize(
    ("t", "bucket"),
    [
        (0, 1),
        (1, 1),
        (2, 2),
        (3, 4),
        (4, 4),
        (5, 8),
        (7, 8),
        (8, 8),
        (9, 16),
        (16, 16),
        (17, 32),
        (33, 64),
        (64, 64),
        (65, 128),
        (128, 128),
        (129, 192),
        (1000, 1024),
    ],
)
def test_bucket_query_len_values(t, bucket):
    assert bucket_query_len(t) == bucket


def test_bucket_query_len_is_the_smallest_bucket_that_fits():
    top = QUERY_BUCKETS[-1]
    buckets = [bucket_query_len(t) for t in range(1, 4 * top + 1)]
    for t, b in enumerate(buckets, start=1):
        assert b >= t
        assert b in QUERY_BUCKETS or b % top == 0
        smaller = [c for c in (*QUERY_BUCKETS, *range(top, 5 * top, top)) if c < b]
        assert all(c < t for c in smaller)
    assert buckets == sorted(buckets)
    assert {bucket_query_len(t) for t in range(1, 9)} == {1, 2, 4, 8}
