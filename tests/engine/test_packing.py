"""bass.packing: the flat layout of a pass, built on the host in one copy."""

import pytest
import torch

from bass.backends import CPUBackend, GenericBackend
from bass.packing import Extra, bucket_tokens, pack

CPU = torch.device("cpu")


def test_worked_example():
    # cache lengths [7, 4, 9], rows feeding 3, 0 and 2 tokens
    b = pack([3, 0, 2], [7, 4, 9], CPU, ids=[11, 12, 13, 21, 22], logits_at=[2])
    assert b.cu_q_lens.tolist() == [0, 3, 3, 5]
    assert b.positions.tolist() == [[7, 8, 9, 9, 10]]
    assert b.kv_lens.tolist() == [10, 4, 11]
    assert b.input_ids.tolist() == [[11, 12, 13, 21, 22]]
    assert b.real == b.tokens == 5


@pytest.mark.parametrize("kept, computed", [(1, 1), (2, 4), (3, 4), (4, 4), (5, 8), (11, 12)])
def test_logits_rows_padded_to_the_backends_multiple(kept, computed):
    """The CPU backend asks an lm head in torch's layout for a multiple of 4 rows (MKL is
    slower for 2 or 3 rows than for 4); the first ``kept`` are the ones asked for, the
    rest repeat the first. Packing itself pads nothing unless asked."""
    model = torch.nn.Linear(2, 2)  # nothing routed: torch's layout
    m = CPUBackend(mode="torch").logits_multiple(model)
    assert m == 4 and GenericBackend().logits_multiple(model) == 1
    at = list(range(kept))
    b = pack([kept], [0], CPU, ids=list(range(kept)), logits_at=at, logits_multiple=m)
    assert b.logits_index.tolist() == at + [0] * (computed - kept)
    assert pack([kept], [0], CPU, ids=list(range(kept)), logits_at=at).logits_index.tolist() == at
    # logits of every token (a verify pass): the same, from an explicit index
    b = pack([kept], [0], CPU, ids=list(range(kept)), logits_multiple=m)
    if kept == 1:
        assert b.logits_index is None
    else:
        assert b.logits_index.tolist() == at + [0] * (computed - kept)


def test_static_shapes_keep_their_logits_slots_and_buckets():
    b = pack(
        [2, 1], [5, 5], CPU, ids=[1, 2, 3], logits_at=[1, 2], logits_slots=2, bucket=(1, 2, 4, 8)
    )
    assert b.logits_index.tolist() == [1, 2] and b.tokens == bucket_tokens(3) == 4


def test_extra_values_come_back_as_named_views_of_the_one_copy():
    extra = {"index": Extra([0, 1, 2, 3, 3, 3], (2, 3)), "drafted": Extra([2, 0], (2,))}
    for separate in (False, True):
        b = pack([3, 1], [4, 0], CPU, ids=[1, 2, 3, 4], extra=extra, separate=separate)
        assert b.extra["index"].tolist() == [[0, 1, 2], [3, 3, 3]]
        assert b.extra["drafted"].tolist() == [2, 0]
        assert b.kv_lens.tolist() == [7, 1]
