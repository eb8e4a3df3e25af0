"""``generate(logprobs=...)``: each new token's log-probability under the main model, equal
to what one forward pass over the whole sequence gives (the model's own attention, no bass
in it), whatever drafted the token, how many tokens a step accepted, where the row ended
(eos, a stop sequence, a stop string cut mid-step, the length) and who shared the batch.
"``processed``" is the distribution sampled from, warped by transformers' own warpers
(temperature, top-k, top-p, min-p): a token sampled outside the warped set would have a
log-probability of -inf there."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from bass import Generator
from bass.config import load_config
from bass.errors import ConfigError, OptionError

PROMPTS = [[1, 2, 3, 4, 1, 2, 3], [5, 6, 7], [9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9], [8, 3]]
MAX_NEW = 12


class CharTokenizer:
    """Token ``t`` decodes to one character: stop strings over tiny random models."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(0x100 + t) for t in ids)


def forward_logprobs(model, prompt, out, mode="raw", temperature=1.0, top_k=None, top_p=None,
                     min_p=None):  # fmt: skip
    """The log-probabilities of ``out`` after ``prompt`` from one forward pass over both
    (float64), warped by transformers' warpers for ``"processed"``."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + out])).logits[0].double()
    logits = logits[len(prompt) - 1 : len(prompt) - 1 + len(out)]
    if mode == "processed":
        warpers = [TemperatureLogitsWarper(temperature)]
        warpers += [TopKLogitsWarper(top_k)] if top_k else []
        warpers += [TopPLogitsWarper(top_p)] if top_p else []
        warpers += [MinPLogitsWarper(min_p)] if min_p else []
        for w in warpers:
            logits = w(None, logits)
    lp = torch.log_softmax(logits, dim=-1)
    return lp[torch.arange(len(out)), torch.tensor(out, dtype=torch.long)].tolist()


def check_rows(model, res, prompts=PROMPTS, **how):
    assert res.logprobs is not None and len(res.logprobs) == len(prompts)
    for p, out, lps in zip(prompts, res.sequences, res.logprobs, strict=True):
        assert len(lps) == len(out)
        assert lps == pytest.approx(forward_logprobs(model, p, out, **how), abs=1e-9)


SAMPLED = dict(do_sample=True, temperature=0.7, top_k=20, top_p=0.9, min_p=0.05, seed=3)
WARPS = ("temperature", "top_k", "top_p", "min_p")


@pytest.mark.parametrize("draft", ["none", "ngram", "same", "perturbed"])
@pytest.mark.parametrize(
    "mode, kw",
    [
        ("raw", {}),
        ("processed", {}),  # greedy: the raw distribution
        ("processed", SAMPLED),
        ("raw", SAMPLED),
    ],
    ids=["greedy-raw", "greedy-processed", "sampled-processed", "sampled-raw"],
)
def test_logprobs_equal_one_forward_pass(llama, drafts, draft, mode, kw):
    """Every drafter, greedy and sampled (coupled), two rows at once for four prompts (the
    others admitted as rows finish, their prefill riding in a verify pass)."""
    gen = Generator(llama, drafts[draft], policy="constant", policy_options={"k": 3})
    res = gen.generate(PROMPTS, max_new_tokens=MAX_NEW, logprobs=mode, max_rows=2, **kw)
    assert res.stats.mean_accepted > 0 or draft in ("none", "ngram")
    how = {k: kw[k] for k in WARPS if k in kw}
    check_rows(llama, res, mode=mode if kw else "raw", **how)


def test_rejection_sampling_logprobs(llama, drafts):
    """Rejection sampling: accepted drafts and the residual's draws alike."""
    gen = Generator(llama, drafts["perturbed"], policy="constant", policy_options={"k": 3},
                    draft_sampling="rejection")  # fmt: skip
    res = gen.generate(PROMPTS, max_new_tokens=MAX_NEW, logprobs="processed", **SAMPLED)
    how = {k: SAMPLED[k] for k in WARPS}
    check_rows(llama, res, mode="processed", **how)


def test_rows_cut_mid_step_keep_their_tokens_logprobs(llama, drafts):
    """eos, a stop sequence and a stop string ending rows inside an accepted block: the
    log-probabilities are cut with the tokens."""
    plain = Generator(llama, None).generate(PROMPTS, max_new_tokens=MAX_NEW).sequences
    eos = plain[0][4]
    stop_seq = plain[1][3:5]
    stop_text = CharTokenizer().decode(plain[2][5:7])
    gen = Generator(llama, drafts["same"], policy="constant", policy_options={"k": 4})
    res = gen.generate(PROMPTS, max_new_tokens=MAX_NEW, eos_token_id=eos, logprobs=True,
                       stop_sequences=[stop_seq], stop_strings=[stop_text],
                       tokenizer=CharTokenizer())  # fmt: skip
    assert {"eos", "stop"} <= set(res.finish_reasons)
    assert any(len(s) < MAX_NEW for s in res.sequences)
    check_rows(llama, res)


def test_stream_and_callback_hand_over_each_rows_logprobs(llama):
    gen = Generator(llama, "ngram")
    whole = gen.generate(PROMPTS, max_new_tokens=MAX_NEW, logprobs=True, max_rows=2)
    streamed = {r.prompt: r for r in gen.stream(PROMPTS, max_new_tokens=MAX_NEW, logprobs=True)}
    called = []
    gen.generate(PROMPTS, max_new_tokens=MAX_NEW, logprobs=True, on_finish=called.append)
    for i in range(len(PROMPTS)):
        assert streamed[i].tokens == whole.sequences[i]
        assert streamed[i].logprobs == pytest.approx(whole.logprobs[i], abs=1e-9)
    assert sorted(r.prompt for r in called) == list(range(len(PROMPTS)))
    for r in called:
        assert r.logprobs == pytest.approx(whole.logprobs[r.prompt], abs=1e-9)


def test_a_rows_logprobs_do_not_depend_on_the_batch(llama, drafts):
    gen = Generator(llama, drafts["perturbed"], policy="constant", policy_options={"k": 3})
    together = gen.generate(PROMPTS, max_new_tokens=MAX_NEW, logprobs=True, **SAMPLED)
    alone = gen.generate(PROMPTS[2:3], max_new_tokens=MAX_NEW, logprobs=True,
                         row_ids=[2], **SAMPLED)  # fmt: skip
    assert alone.sequences[0] == together.sequences[2]
    assert alone.logprobs[0] == pytest.approx(together.logprobs[2], abs=1e-9)


def test_without_logprobs_none_are_computed(llama, monkeypatch):
    def computed(*args, **kwargs):
        raise AssertionError("log-probabilities computed, not asked for")

    for module in ("verify", "scheduler"):
        monkeypatch.setattr(f"bass.{module}.token_logprobs", computed)
    gen = Generator(llama, "ngram")
    res = gen.generate(PROMPTS[:2], max_new_tokens=4, logprobs=False)
    assert res.logprobs is None
    assert all(r.logprobs is None for r in gen.stream(PROMPTS[:2], max_new_tokens=4))


@pytest.mark.parametrize("bad", ["bogus", 1, "RAW", ["raw"], np.array(["raw"])])
def test_a_bad_logprobs_value_is_refused_naming_it(llama, bad):
    gen = Generator(llama, None)
    with pytest.raises(
        OptionError, match=r"logprobs.*expected raw, processed, true \(raw\) or false"
    ):
        gen.generate(PROMPTS[:1], max_new_tokens=2, logprobs=bad)


def test_logprobs_from_a_config_file(llama, tmp_path):
    path = tmp_path / "bass.toml"
    path.write_text('[generation]\nmax_new_tokens = 5\nlogprobs = "processed"\n')
    res = Generator(llama, "ngram", config=str(path)).generate(PROMPTS[:2])
    check_rows(llama, res, PROMPTS[:2])
    path.write_text('[generation]\nlogprobs = "all"\n')
    with pytest.raises(ConfigError, match=r"\[generation\]\.logprobs.*expected raw, processed"):
        load_config(path)
