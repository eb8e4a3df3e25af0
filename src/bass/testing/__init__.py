"""``bass.testing``: the proofs that output stays exact, for your own drafters, policies
and attention kernels too: float64 loop oracles of the op contracts, greedy and
seeded-sampling equivalence, chi-square tests against the exact distribution and
hypothesis strategies (:mod:`bass.testing.strategies`, needs ``hypothesis``). What each
check proves: ``docs/concepts/exactness.md``; a drafter proved exact, greedy, sampled and
in distribution: ``docs/guides/drafters.md`` ("Prove it exact").
"""

from __future__ import annotations

from .distribution import (
    ChiSquare,
    assert_distribution_equivalent,
    chi_square_power,
    chi_square_test,
    exact_distribution,
)
from .equivalence import assert_greedy_equivalent, assert_sampled_equivalent, greedy_reference
from .oracles import (
    naive_kv_append,
    naive_kv_append_packed,
    naive_ragged_attention,
    naive_ragged_attention_packed,
)

__all__ = [
    "ChiSquare",
    "assert_distribution_equivalent",
    "assert_greedy_equivalent",
    "assert_sampled_equivalent",
    "chi_square_power",
    "chi_square_test",
    "exact_distribution",
    "greedy_reference",
    "naive_kv_append",
    "naive_kv_append_packed",
    "naive_ragged_attention",
    "naive_ragged_attention_packed",
]
