"""``repetition_penalty``: transformers' ``RepetitionPenaltyLogitsProcessor`` over ragged
rows (:mod:`bass.repetition`). Greedy rows equal ``model.generate(repetition_penalty=)``
token for token with every drafter, rows admitted as others finish; sampled rows follow
the penalised distribution; a draft model proposes as penalised; processed
log-probabilities read the penalty, raw ones do not; the option is checked as every other
(API, config, CLI)."""

from __future__ import annotations

import copy

import pytest
import torch
from cli_support import WORDS, one_error_line, read_jsonl, run, save_model_dir, word_tokenizer
from hypothesis import given, settings
from hypothesis import strategies as st
from models import perturbed, tiny_lm
from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

from bass import Generator, repetition, testing
from bass.options import OptionError
from bass.repetition import penalize

# repeats inside prompts, one token, different lengths: the penalty has much to read
PROMPTS = [[1, 2, 3, 4, 5, 6], [7, 8, 9], [3, 3, 3, 3, 3, 3, 3, 3, 10], [11, 12], [5]]


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    penalty=st.floats(0.05, 20.0),
    dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16]),
)
def test_penalize_is_transformers_processor(seed, penalty, dtype):
    """The same values as transformers' processor (its gather/scatter over a row's ids,
    repeats included) on logits of both signs, zero among them."""
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(3, 17, generator=g) * 4).to(dtype)
    logits[0, 0] = 0.0
    ids = torch.randint(0, 17, (3, 9), generator=g)
    seen = torch.zeros(3, 17, dtype=torch.bool).scatter_(1, ids, True)
    dt = torch.float64 if dtype == torch.float64 else torch.float32
    theirs = RepetitionPenaltyLogitsProcessor(penalty)(ids, logits.to(dt))
    torch.testing.assert_close(penalize(logits, seen, penalty), theirs, rtol=0, atol=0)


def _theirs(model, prompts, max_new, penalty):
    ref = copy.deepcopy(model)
    ref.config._attn_implementation = "sdpa"
    return [
        ref.generate(
            torch.tensor([p]), max_new_tokens=max_new, do_sample=False, pad_token_id=0,
            repetition_penalty=penalty, eos_token_id=None,
        )[0, len(p) :].tolist()
        for p in prompts
    ]  # fmt: skip


@pytest.fixture(scope="module")
def soft():
    """A tiny Llama with softer logits than the suites' (a penalty changes its choices)."""
    return tiny_lm("llama", sharpen=4.0)


@pytest.mark.parametrize("penalty", [1.3, 0.7])
@pytest.mark.parametrize("drafter", ["ngram", "same", "perturbed", "none"])
def test_greedy_rows_equal_transformers_generate(soft, drafter, penalty):
    """Every drafter, two rows at once (the others admitted into finished rows' slots,
    compacted at the end); the penalty changes the rows. The main model drafting for
    itself: each draft position reads the drafts before it, as the verify pass does, so
    every draft is accepted."""
    draft = {"ngram": "ngram", "same": soft, "perturbed": perturbed(soft), "none": None}[drafter]
    policy = dict(policy="constant", policy_options={"k": 4})  # deep drafts, every step
    want = _theirs(soft, PROMPTS, 20, penalty)
    assert want != _theirs(soft, PROMPTS, 20, 1.0)
    res = Generator(soft, draft, **(policy if draft is not None else {})).generate(
        PROMPTS, max_new_tokens=20, repetition_penalty=penalty, max_rows=2
    )
    assert res.sequences == want
    if drafter == "same":
        assert res.stats.accepted_tokens == res.stats.drafted_tokens > 0


@pytest.mark.parametrize("chunk", [1, 3])
def test_verify_tokens_penalised_in_chunks(soft, monkeypatch, chunk):
    """Verify tokens are penalised a chunk of rows at a time: chunks that split a row's
    positions (and its drafts) give the same rows."""
    monkeypatch.setattr(repetition, "CHUNK", chunk)
    policy = dict(policy="constant", policy_options={"k": 4})
    res = Generator(soft, soft, **policy).generate(
        PROMPTS, max_new_tokens=20, repetition_penalty=1.3, max_rows=3
    )
    assert res.sequences == _theirs(soft, PROMPTS, 20, 1.3)
    assert res.stats.accepted_tokens == res.stats.drafted_tokens > 0


def test_sampled_drafts_of_the_main_model_itself_are_all_accepted(soft):
    """Sampled drafts from the main model itself, penalised as the main model is: the
    same distribution at every position, so rejection sampling keeps every draft."""
    gen = Generator(soft, soft, draft_sampling="rejection", policy="constant",
                    policy_options={"k": 3})  # fmt: skip
    res = gen.generate(PROMPTS, max_new_tokens=16, do_sample=True, seed=1, repetition_penalty=2.0)
    assert res.stats.accepted_tokens == res.stats.drafted_tokens > 0


@pytest.mark.parametrize("mode", ["coupled", "rejection"])
def test_sampled_rows_follow_the_penalised_distribution(mode):
    """A draft that disagrees, a penalty large enough to move much mass, one-token prompt
    (the drafts make most of what the penalty reads); 16 rows at once, the rest admitted."""
    main = tiny_lm("llama", vocab=4, sharpen=3.0)
    # a fixed draft length: the default policy's, from timings, would change the draws
    policy = dict(policy="constant", policy_options={"k": 3})
    gen = Generator(main, perturbed(main, 0.1), draft_sampling=mode, **policy)
    testing.assert_distribution_equivalent(
        gen, main, [1], 5, rows=4000, seed=3, repetition_penalty=3.0, max_rows=64
    )


def test_exact_distribution_reads_the_penalty():
    main = tiny_lm("llama", vocab=4, sharpen=3.0)
    plain = testing.exact_distribution(main, [1], 2)
    pen = testing.exact_distribution(main, [1], 2, repetition_penalty=3.0)
    assert sum(pen.values()) == pytest.approx(1.0)
    assert pen[(1, 1)] < plain[(1, 1)] and pen[(0, 0)] < plain[(0, 0)]


def test_logprobs_processed_read_the_penalty_raw_do_not(soft):
    """``processed``: under the penalised distribution (each token's context: its row
    before it); ``raw``: the model's own, as without a penalty."""
    gen = Generator(soft, "ngram")
    kw = dict(max_new_tokens=12, repetition_penalty=1.5)
    raw = gen.generate(PROMPTS[:3], logprobs="raw", **kw)
    proc = gen.generate(PROMPTS[:3], logprobs="processed", **kw)
    assert raw.sequences == proc.sequences
    for p, new, lr, lq in zip(PROMPTS, raw.sequences, raw.logprobs, proc.logprobs):
        seq = torch.tensor([p + new])
        logits = soft(seq).logits[0, len(p) - 1 : -1].double()  # [new, V]
        seen = torch.zeros_like(logits, dtype=torch.bool)
        for t in range(len(new)):
            seen[t, seq[0, : len(p) + t]] = True
        own = torch.log_softmax(logits, -1).gather(1, torch.tensor(new)[:, None])[:, 0]
        pen = torch.log_softmax(penalize(logits, seen, 1.5), -1)
        pen = pen.gather(1, torch.tensor(new)[:, None])[:, 0]
        assert lr == pytest.approx(own.tolist(), abs=1e-9)
        assert lq == pytest.approx(pen.tolist(), abs=1e-9)
        assert lq != pytest.approx(lr, abs=1e-6)


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), "1.2", True, 1e-40, 1e4])
def test_bad_penalties_are_refused_by_name(soft, bad):
    """(Past [0.001, 1000] a penalised logit may overflow to inf: NaN probabilities.)"""
    with pytest.raises(OptionError, match=r"repetition_penalty.*a number in \[0\.001, 1000\]"):
        Generator(soft, "ngram").generate([[1, 2]], max_new_tokens=2, repetition_penalty=bad)


def test_generation_config_penalty_warns_how_to_apply_it():
    model = tiny_lm()
    model.generation_config.repetition_penalty = 1.05
    with pytest.warns(UserWarning, match="pass repetition_penalty to generate"):
        Generator(model, "ngram")


def test_cli_flag_config_and_resume(tmp_path, capsys):
    """``--repetition-penalty`` and ``[generation] repetition_penalty`` give the API's rows;
    each row stores the setting, so ``--resume`` refuses a file made without it; a bad
    value is refused naming the flag or the key."""
    model_dir = save_model_dir(tmp_path / "tiny")
    out = tmp_path / "o.jsonl"
    base = f"generate --main {model_dir} --draft ngram --max-new-tokens 8"
    prompts = ("hello world hello world", "the sea is blue")
    rc, _, err = run(capsys, f"{base} --repetition-penalty 1.5 -o {out}", *prompts)
    assert rc == 0, err
    rows = read_jsonl(out)
    from bass import load_causal_lm

    tok, main = word_tokenizer(WORDS), load_causal_lm(model_dir)
    ids = [tok(p)["input_ids"] for p in prompts]
    res = Generator(main, "ngram").generate(ids, max_new_tokens=8, repetition_penalty=1.5)
    for r in rows:
        assert r["settings"]["repetition_penalty"] == 1.5
        assert tok(r["completion"])["input_ids"] == res.sequences[r["prompt_index"]]
    rc, _, err = run(capsys, f"{base} --resume -o {out}", *prompts)
    assert rc == 2 and "repetition_penalty: 1.5 there, null now" in one_error_line(err)
    rc, _, err = run(capsys, f"{base} --repetition-penalty 0", "hello")
    assert rc == 2 and "--repetition-penalty = 0" in one_error_line(err)
    config = tmp_path / "c.toml"
    config.write_text("[generation]\nrepetition_penalty = -2\n")
    rc, _, err = run(capsys, f"{base} --config {config}", "hello")
    assert rc == 2 and "repetition_penalty = -2" in one_error_line(err)


@settings(max_examples=40, deadline=None)
@given(
    rows=st.lists(st.lists(st.integers(0, 12), max_size=9), min_size=1, max_size=4),
    width=st.integers(1, 10),
)
def test_occurrences_count_each_token_below_the_width(rows, width):
    """bass.repetition.occurrences, which the penalties' references (exact_distribution,
    greedy_reference's processor) count with, against a plain count; an id at or past the
    width (no logit) counts nowhere."""
    n = max(map(len, rows))
    ids = torch.tensor([r + [width] * (n - len(r)) for r in rows], dtype=torch.long)
    got = repetition.occurrences(ids, width)
    assert got.shape == (len(rows), width) and got.dtype == torch.int64
    for r, row in enumerate(rows):
        assert got[r].tolist() == [row.count(t) for t in range(width)]
