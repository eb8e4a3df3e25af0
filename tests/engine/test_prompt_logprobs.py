"""``generate(prompt_logprobs=True)``: each prompt token's log-probability under the main
model given the tokens before it, equal to what one forward pass over the prompt gives
(float64 models: to rounding), whatever the prefill's chunking, the drafter, the rows
sharing a pass and when a row was admitted; the rows generated unchanged."""

from __future__ import annotations

import pytest
import torch

import bass.passes
from bass import Generator
from bass.config import load_config
from bass.errors import ConfigError, OptionError

PROMPTS = [[1, 2, 3, 4, 1, 2, 3], [5, 6, 7], [9] * 11, [7], [8, 3]]


def forward_logprobs(model, prompt) -> list:
    """``[None, lp(p[1] | p[:1]), ...]`` from one forward pass over ``prompt`` (float64)."""
    with torch.no_grad():
        lp = torch.log_softmax(model(torch.tensor([prompt])).logits[0].double(), dim=-1)
    return [None] + [lp[i, prompt[i + 1]].item() for i in range(len(prompt) - 1)]


def check_rows(model, rows, prompts=PROMPTS) -> None:
    assert rows is not None and len(rows) == len(prompts)
    for prompt, got in zip(prompts, rows, strict=True):
        want = forward_logprobs(model, prompt)
        assert len(got) == len(prompt) and got[0] is None
        assert got[1:] == pytest.approx(want[1:], abs=1e-9)


@pytest.mark.parametrize("draft", ["none", "ngram", "perturbed"])
@pytest.mark.parametrize("chunk", [3, 8192])
def test_prompt_logprobs_equal_one_forward_pass(llama, drafts, draft, chunk):
    """Two rows at once for five prompts (the others admitted as rows finish), prompts
    spanning prefill passes (``chunk`` 3), one of a single token (``[None]``), sampled; the
    rows equal the same call's without prompt log-probabilities."""
    gen = Generator(llama, drafts[draft], policy="constant", policy_options={"k": 3},
                    prefill_chunk_tokens=chunk)  # fmt: skip
    kw = dict(max_new_tokens=6, max_rows=2, do_sample=True, seed=5, logprobs=True)
    res = gen.generate(PROMPTS, prompt_logprobs=True, **kw)
    check_rows(llama, res.prompt_logprobs)
    plain = gen.generate(PROMPTS, **kw)
    assert plain.prompt_logprobs is None
    assert res.sequences == plain.sequences
    for got, want in zip(res.logprobs, plain.logprobs, strict=True):
        assert got == pytest.approx(want, abs=1e-9)


def test_a_bounded_number_of_logits_per_pass_and_rows_ended_by_the_prefill(llama, monkeypatch):
    """The scored prefill feeds at most ``SCORED_LOGITS`` logits' worth of tokens a pass
    (here 2 tokens of a 64-token vocabulary: more passes, the same figures); a row that
    ends at its prefill (``time_budget=0``) has its prompt's; ``n`` samples each have
    their prompt's; a stream and ``on_finish`` hand them over with each row."""
    gen = Generator(llama, "ngram")
    wide = gen.generate(PROMPTS, max_new_tokens=4, prompt_logprobs=True)
    monkeypatch.setattr(bass.passes, "SCORED_LOGITS", 2 * 64)
    narrow = gen.generate(PROMPTS, max_new_tokens=4, prompt_logprobs=True)
    assert narrow.stats.prefill_passes > wide.stats.prefill_passes
    check_rows(llama, narrow.prompt_logprobs)
    assert narrow.sequences == wide.sequences
    res = gen.generate(PROMPTS, max_new_tokens=4, prompt_logprobs=True, time_budget=0)
    assert set(res.finish_reasons) == {"time"}
    check_rows(llama, res.prompt_logprobs)
    res = gen.generate(PROMPTS[:2], max_new_tokens=3, prompt_logprobs=True, n=2, do_sample=True)
    check_rows(llama, res.prompt_logprobs, [p for p in PROMPTS[:2] for _ in range(2)])
    streamed = {r.prompt: r.prompt_logprobs for r in gen.stream(PROMPTS, max_new_tokens=3,
                                                                prompt_logprobs=True)}  # fmt: skip
    check_rows(llama, [streamed[i] for i in range(len(PROMPTS))])
    called = []
    gen.generate(PROMPTS, max_new_tokens=3, prompt_logprobs=True, on_finish=called.append)
    check_rows(llama, [r.prompt_logprobs for r in sorted(called, key=lambda r: r.prompt)])


def test_without_prompt_logprobs_none_are_computed(llama, monkeypatch):
    def computed(*args, **kwargs):
        raise AssertionError("prompt log-probabilities computed, not asked for")

    monkeypatch.setattr(bass.passes, "score_next", computed)
    gen = Generator(llama, "ngram")
    res = gen.generate(PROMPTS, max_new_tokens=3, prompt_logprobs=False, max_rows=2)
    assert res.prompt_logprobs is None
    assert all(r.prompt_logprobs is None for r in gen.stream(PROMPTS, max_new_tokens=3))


class _Tokenizer:
    chat_template, eos_token_id = None, 2

    def __call__(self, text, **kw):
        return {"input_ids": [1 + ord(c) % 60 for c in text]}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(0x100 + t) for t in ids)


@pytest.mark.parametrize("bad", ["yes", 1, None])
def test_bad_values_and_generate_text_are_refused_and_a_config_sets_them(llama, bad, tmp_path):
    """A value that is no bool is refused naming the option (``None``: not given); the
    texts of ``generate_text`` carry none: refused unless ``on_finish`` takes the rows; a
    config file's ``[generation] prompt_logprobs`` is the default."""
    gen = Generator(llama, None)
    if bad is not None:
        with pytest.raises(OptionError, match=r"prompt_logprobs"):
            gen.generate(PROMPTS[:1], max_new_tokens=2, prompt_logprobs=bad)
    else:
        res = gen.generate(PROMPTS[:1], max_new_tokens=2, prompt_logprobs=bad)
        assert res.prompt_logprobs is None
    with pytest.raises(OptionError, match=r"prompt_logprobs.*generate_text\(\) returns text only"):
        gen.generate_text(["ab"], _Tokenizer(), max_new_tokens=2, prompt_logprobs=True)
    rows = []
    gen.generate_text(["ab"], _Tokenizer(), max_new_tokens=2, prompt_logprobs=True,
                      on_finish=rows.append)  # fmt: skip
    assert len(rows[0].prompt_logprobs) == 2
    path = tmp_path / "bass.toml"
    path.write_text("[generation]\nmax_new_tokens = 2\nprompt_logprobs = true\n")
    check_rows(llama, Generator(llama, None, config=path).generate(PROMPTS).prompt_logprobs)
    path.write_text('[generation]\nprompt_logprobs = "raw"\n')
    with pytest.raises(ConfigError, match=r"\[generation\]\.prompt_logprobs"):
        load_config(path)


def head_hooked(model, change):
    """A copy of ``model`` whose output head's logits ``[1, N, V]`` pass through ``change``
    in passes that compute more than two tokens' (here: a scored prefill only)."""
    import copy

    out = copy.deepcopy(model)

    def hook(module, args, logits):
        if logits.shape[-2] > 2:
            logits = logits.clone()
            change(logits)
            return logits
        return None

    out.get_output_embeddings().register_forward_hook(hook)
    return out


def test_nan_logits_at_a_prompt_token_raise_naming_its_prompt(llama):
    """NaN logits at a prompt token (not its last: the first-token check does not see
    them) raise as any non-finite logits do, naming the prompt, instead of a NaN figure."""
    from bass import NonFiniteLogitsError

    prompts = [[4, 5], [1, 2, 3, 4, 5]]
    model = head_hooked(llama, lambda logits: logits[..., 2, :].fill_(float("nan")))
    gen = Generator(model)
    assert gen.generate(prompts, max_new_tokens=3).sequences  # last logits only: fine
    with pytest.raises(NonFiniteLogitsError, match=r"main model .* prompt 1 at a prompt token"):
        gen.generate(prompts, max_new_tokens=3, prompt_logprobs=True)


def test_a_masked_prompt_token_scores_minus_inf(llama):
    """A prompt token whose logit the model masks (-inf: a probability of 0) scores -inf;
    the other tokens and the rows are unchanged."""
    prompt = [1, 2, 3, 4, 5]
    model = head_hooked(llama, lambda logits: logits[..., 1, prompt[2]].fill_(float("-inf")))
    res = Generator(model).generate([prompt], max_new_tokens=3, prompt_logprobs=True)
    want = forward_logprobs(llama, prompt)
    got = res.prompt_logprobs[0]
    assert got[2] == float("-inf")
    assert got[:2] == [None, pytest.approx(want[1], abs=1e-9)]
    assert got[3:] == pytest.approx(want[3:], abs=1e-9)
    assert res.sequences == Generator(llama).generate([prompt], max_new_tokens=3).sequences
