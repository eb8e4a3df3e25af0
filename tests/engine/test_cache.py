"""RaggedKVCache: in-place compaction, packed and padded pass framing, prefill chunks."""

from __future__ import annotations

import pytest
import torch
from models import tiny_lm

from bass import hf, passes
from bass.cache import RaggedKVCache


def filled(B=5, S=6, layers=2):
    cache = RaggedKVCache(B, S, layers, torch.device("cpu"))
    for i in range(layers):  # row b holds value b everywhere
        cache.keys[i] = torch.arange(B, dtype=torch.float32).view(B, 1, 1, 1).expand(B, 2, S, 3)
        cache.keys[i] = cache.keys[i].contiguous()
        cache.values[i] = cache.keys[i].clone() + 100
    cache.lens = torch.arange(B, dtype=torch.int32) + 1
    return cache


@pytest.mark.parametrize("keep", [[1, 3, 4], [0, 1], [2], [0, 1, 2, 3, 4]])
def test_compact_moves_rows_in_place(keep):
    cache = filled()
    ptrs = [t.data_ptr() for t in cache.buffers()]
    cache.compact(keep)
    assert [t.data_ptr() for t in cache.buffers()] == ptrs  # no reallocation
    assert cache.batch_size == len(keep)
    assert cache.lens.tolist() == [b + 1 for b in keep]
    for t in cache.keys:
        assert t[:, 0, 0, 0].tolist() == [float(b) for b in keep]
    for t in cache.values:
        assert t[:, 0, 0, 0].tolist() == [b + 100.0 for b in keep]


def test_compact_before_any_layer_is_allocated():
    cache = RaggedKVCache(4, 8, 2, torch.device("cpu"))
    cache.compact([1, 2])
    assert cache.batch_size == 2 and cache.buffers() == []


def test_compact_refuses_unordered_rows():
    with pytest.raises(ValueError, match="ascending row indices"):
        filled().compact([3, 1])
    with pytest.raises(ValueError, match="ascending row indices"):
        filled().compact([1, 1])


def test_packed_pass_framing():
    cache = RaggedKVCache(3, 8, 1, torch.device("cpu"))
    cu = torch.tensor([0, 2, 2, 3], dtype=torch.int32)
    kv = cache.begin_packed(cu, torch.tensor([1, 4, 0], dtype=torch.int32))
    assert kv.tolist() == [3, 4, 1] and cache.q_lens.tolist() == [2, 0, 1]
    cache.commit(cache.q_lens)
    assert cache.lens.tolist() == [3, 4, 1] and cache.cu_q_lens is None


def test_prefill_refuses_an_empty_chunk_budget():
    model = tiny_lm("llama")
    hf.prepare(model, 16)
    cache = RaggedKVCache(1, 16, 2, torch.device("cpu"))
    with pytest.raises(ValueError, match="chunk_tokens must be >= 1"):
        passes.prefill(model, cache, [[1, 2]], chunk_tokens=0)


@pytest.mark.parametrize("slots", [[0], [1, 0], [2, 2], [0, 1, 2]])
def test_prefill_refuses_slots_that_are_not_one_ascending_slot_per_prompt(slots):
    model = tiny_lm("llama")
    hf.prepare(model, 16)
    cache = RaggedKVCache(3, 16, 2, torch.device("cpu"))
    with pytest.raises(ValueError, match="one ascending slot per prompt"):
        passes.prefill(model, cache, [[1, 2], [3]], slots=slots)


def test_values_may_be_narrower_than_keys():
    """Multi-head latent attention (DeepSeek V2/V3) caches values of another width: each
    layer's value buffer takes the values' own."""
    cache = RaggedKVCache(2, 8, 1, torch.device("cpu"))
    cache.begin(torch.tensor([3, 1], dtype=torch.int32))
    k, v = torch.randn(2, 1, 3, 16), torch.randn(2, 1, 3, 4)
    kc, vc = cache.update(k, v, 0)
    assert kc.shape == (2, 1, 8, 16) and vc.shape == (2, 1, 8, 4)
    torch.testing.assert_close(vc[0, :, :3], v[0]) and torch.testing.assert_close(
        vc[1, :, :1], v[1, :, :1]
    )
    assert vc[1, :, 1:].abs().sum() == 0


def test_a_layer_asking_the_cache_for_its_length_is_refused():
    """A model's forward may ask the cache's length (its default positions, which bass
    overrides): the buffer size. A layer asking for its own (``get_seq_length(layer_idx)``,
    Llama 4's temperature tuning) got the same buffer size, one length for rows of many,
    and computed positions of its own from it: silently other tokens. Refused."""
    from bass.cache import LayerReadsLength

    cache = RaggedKVCache(2, 16, 2, torch.device("cpu"))
    assert cache.get_seq_length() == 16
    with pytest.raises(LayerReadsLength, match="layer 1 of this model asks the cache"):
        cache.get_seq_length(1)


def test_rows_of_equal_prompts_share_one_prefill():
    """Equal prompts (a prompt's samples) are prefilled once: the others' cache rows,
    last logits and prompt scores are copies of the first's, equal to a prefill of each
    prompt alone; the passes feed the distinct prompts only."""
    model = tiny_lm("llama")
    hf.prepare(model, 16)
    prompts = [[1, 2, 3], [4, 5], [1, 2, 3], [4, 5], [6]]
    cache = RaggedKVCache(6, 16, model.config.num_hidden_layers, torch.device("cpu"))
    fed = []
    model.register_forward_pre_hook(lambda m, a, kw: fed.append(kw["input_ids"].shape[1]),
                                    with_kwargs=True)  # fmt: skip
    scores = []
    out, n = passes.prefill(model, cache, prompts, slots=[0, 1, 2, 3, 5], scores=scores)
    assert n == 1 and fed == [6]  # 3 + 2 + 1 tokens
    assert cache.lens.tolist() == [3, 2, 3, 2, 0, 1]
    for j, p in enumerate(prompts):
        alone = RaggedKVCache(1, 16, model.config.num_hidden_layers, torch.device("cpu"))
        want_scores = []
        want, _ = passes.prefill(model, alone, [p], scores=want_scores)
        s = [0, 1, 2, 3, 5][j]
        torch.testing.assert_close(out[j], want[0], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(scores[j], want_scores[0], rtol=1e-5, atol=1e-6)
        for mine, theirs in zip(cache.buffers(), alone.buffers(), strict=True):
            torch.testing.assert_close(mine[s, :, : len(p)], theirs[0, :, : len(p)])


def test_a_scored_prefill_takes_no_starts():
    model = tiny_lm("llama")
    hf.prepare(model, 16)
    cache = RaggedKVCache(1, 16, 2, torch.device("cpu"))
    with pytest.raises(ValueError, match="scores every prompt token"):
        passes.prefill(model, cache, [[1, 2, 3]], scores=[], starts=[2])


def test_copy_prefix_copies_positions_of_written_layers():
    """Rows ``dst`` get rows ``src``'s first positions in every layer that wrote (a layer
    that never did stays unallocated); other rows and the lengths are untouched."""
    cache = RaggedKVCache(3, 8, 2, torch.device("cpu"))
    cache.begin(torch.tensor([4, 2, 0], dtype=torch.int32))
    k, v = torch.randn(3, 2, 4, 5), torch.randn(3, 2, 4, 5)
    cache.update(k, v, 0)
    cache.commit(cache.q_lens)
    before = [t.clone() for t in cache.buffers()]
    cache.copy_prefix([0], [2], 3)
    assert cache.keys[1] is None and cache.values[1] is None
    for now, was in zip(cache.buffers(), before, strict=True):
        torch.testing.assert_close(now[2, :, :3], was[0, :, :3])
        torch.testing.assert_close(now[:2], was[:2])
        torch.testing.assert_close(now[2, :, 3:], was[2, :, 3:])
    assert cache.lens.tolist() == [4, 2, 0]
