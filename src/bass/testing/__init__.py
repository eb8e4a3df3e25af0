"""``bass.testing``: the proofs that output stays exact, for your own drafters, policies
and attention kernels too.

* :func:`naive_ragged_attention`, :func:`naive_ragged_attention_packed`,
  :func:`naive_kv_append`, :func:`naive_kv_append_packed`: float64 loop oracles of the op
  contracts.
* :func:`assert_greedy_equivalent`: every row of a generation equals the main model's own
  greedy decoding of that prompt alone (eos, stop sequences and stop strings included).
* :func:`assert_sampled_equivalent`: with deterministic drafts (n-grams), seeded sampled
  output equals plain sampled decoding with the same seed, token for token.
* :func:`exact_distribution` and :func:`assert_distribution_equivalent`: sampled output
  follows the main model's exact distribution (chi-square goodness of fit over every
  continuation of a tiny vocabulary), with :func:`chi_square_power` for its power.
* :mod:`bass.testing.strategies` (needs ``hypothesis``): ragged prompt batches by length
  pattern and random op inputs.

Example: prove a drafter-policy pair exact, greedy and sampled::

    import bass, bass.testing
    main = ...                                   # a transformers causal LM
    gen = bass.Generator(main, "ngram", policy=MyPolicy())
    bass.testing.assert_greedy_equivalent(gen, [[1, 2, 3], [4, 5, 6, 7]], 16)
    bass.testing.assert_sampled_equivalent(gen, [[1, 2, 3], [4, 5, 6, 7]], 16, seed=0)

    tiny = ...                                   # a model with a vocabulary of ~5 tokens
    gen = bass.Generator(tiny, my_draft, policy=MyPolicy())
    bass.testing.assert_distribution_equivalent(gen, tiny, [1, 2], 3, rows=4000, seed=0)
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
