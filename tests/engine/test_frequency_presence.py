"""``frequency_penalty`` and ``presence_penalty`` (OpenAI's and vLLM's, :mod:`bass.repetition`):
a token's logit lowered by ``frequency`` times its count among the row's new tokens, and by
``presence`` if it occurs there (the prompt does not count), after a repetition penalty.
Greedy rows equal a plain decoding loop that applies them, with every drafter and rows
admitted as others finish; sampled rows follow the penalised distribution; a draft model
proposes penalised alike; the options are checked as every other."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from cli_support import one_error_line, read_jsonl, run, save_model_dir
from models import perturbed, tiny_lm

from bass import Generator, repetition, testing
from bass.options import OptionError
from bass.repetition import SeenTokens, occurrences, penalize
from bass.sampling import SamplingParams

PROMPTS = [[1, 2, 3, 4, 5, 6], [7, 8, 9], [3, 3, 3, 3, 3, 3, 3, 3, 10], [11, 12], [5]]
CASES = [
    dict(frequency_penalty=0.8),
    dict(presence_penalty=1.5),
    dict(frequency_penalty=-0.5, presence_penalty=0.7, repetition_penalty=1.2),
]


def _plain(model, prompt, max_new, repetition_penalty=None, frequency_penalty=0.0,
           presence_penalty=0.0):  # fmt: skip
    """Greedy decoding one token at a time, the penalties applied to each position's
    logits from the tokens before it (the reference)."""
    seq = list(prompt)
    V = model.get_output_embeddings().weight.shape[0]
    with torch.no_grad():
        for _ in range(max_new):
            logits = model(torch.tensor([seq])).logits[0, -1]
            seen = occurrences(torch.tensor(seq), V) > 0  # (an id past V: no logit, not seen)
            counts = occurrences(torch.tensor(seq[len(prompt) :], dtype=torch.long), V)
            scores = penalize(logits, seen, repetition_penalty, counts, frequency_penalty,
                              presence_penalty)  # fmt: skip
            seq.append(int(scores.argmax()))
    return seq[len(prompt) :]


@pytest.fixture(scope="module")
def soft():
    return tiny_lm("llama", sharpen=4.0)


@pytest.mark.parametrize("case", CASES, ids=["frequency", "presence", "all-three"])
@pytest.mark.parametrize("drafter", ["ngram", "same", "perturbed", "none"])
def test_greedy_rows_equal_a_plain_penalised_loop(soft, drafter, case):
    """Every drafter (deep drafts every step), two rows at once; the main model drafting
    for itself has every draft accepted (its drafts read the drafts before them)."""
    draft = {"ngram": "ngram", "same": soft, "perturbed": perturbed(soft), "none": None}[drafter]
    policy = dict(policy="constant", policy_options={"k": 4}) if draft is not None else {}
    want = [_plain(soft, p, 16, **case) for p in PROMPTS]
    assert want != [_plain(soft, p, 16) for p in PROMPTS]
    res = Generator(soft, draft, **policy).generate(PROMPTS, max_new_tokens=16, max_rows=2, **case)
    assert res.sequences == want
    if drafter == "same":
        assert res.stats.accepted_tokens == res.stats.drafted_tokens > 0


@pytest.mark.parametrize("chunk", [256, 1, 2])
def test_each_verify_position_reads_its_row_and_the_drafts_before_it(monkeypatch, chunk):
    """A verify grid by hand: rows that drafted 1 and 3 tokens (the first row's positions
    past its draft repeat its last logits row: its draft counted once there), a prompt
    token that counts for the repetition penalty only; any chunking of the rows."""
    monkeypatch.setattr(repetition, "CHUNK", chunk)
    params = SamplingParams(repetition_penalty=1.5, frequency_penalty=0.5, presence_penalty=0.25)
    V = 6
    seen = SeenTokens(params, 2, V, "cpu")
    # prompts [1, 2] and [3]; new tokens [5] and [4, 4]
    state = SimpleNamespace(prompt_of=[0, 1], seqs=[[1, 2, 5], [3, 4, 4]], outputs=[[5], [4, 4]])
    v = SimpleNamespace(
        index=torch.tensor([[0, 1, 1, 1], [2, 3, 4, 5]]),
        drafted=torch.tensor([1, 3]),
        drafts=torch.tensor([[5, 0, 0], [4, 0, 4]]),
    )
    logits = torch.randn(6, V, generator=torch.Generator().manual_seed(chunk))
    got = seen.verify_scores(logits, v, state, [0, 1])
    # each logits row: the tokens before it (prompt + new), its prompt's length
    before = [[1, 2, 5], [1, 2, 5, 5], [3, 4, 4], [3, 4, 4, 4], [3, 4, 4, 4, 0], [3, 4, 4, 4, 0, 4]]
    prompt_len = [2, 2, 1, 1, 1, 1]
    for row, (toks, n) in enumerate(zip(before, prompt_len, strict=True)):
        mask = torch.zeros(V, dtype=torch.bool)
        mask[toks] = True
        counts = torch.bincount(torch.tensor(toks[n:]), minlength=V)
        want = penalize(logits[row], mask, 1.5, counts, 0.5, 0.25)
        torch.testing.assert_close(got[row], want, rtol=0, atol=0)


def test_sampled_rows_follow_the_penalised_distribution():
    """Rejection sampling with a draft that disagrees, drafts 3 deep, penalties that move
    much mass (a negative frequency penalty: repeats favoured)."""
    main = tiny_lm("llama", vocab=4, sharpen=3.0)
    policy = dict(policy="constant", policy_options={"k": 3})
    gen = Generator(main, perturbed(main, 0.1), draft_sampling="rejection", **policy)
    testing.assert_distribution_equivalent(
        gen, main, [1], 5, rows=4000, seed=3, max_rows=64, frequency_penalty=-1.0,
        presence_penalty=2.0,
    )  # fmt: skip


def test_exact_distribution_counts_new_tokens_only():
    """The prompt does not count: a prompt of token 1 leaves its first draw alone."""
    main = tiny_lm("llama", vocab=4, sharpen=3.0)
    plain = testing.exact_distribution(main, [1, 1], 2)
    pen = testing.exact_distribution(main, [1, 1], 2, presence_penalty=2.0)
    first = lambda d, t: sum(p for s, p in d.items() if s[0] == t)  # noqa: E731
    assert all(first(pen, t) == pytest.approx(first(plain, t)) for t in range(4))
    assert pen[(1, 1)] < plain[(1, 1)]


@pytest.mark.parametrize("name", ["frequency_penalty", "presence_penalty"])
@pytest.mark.parametrize("bad", [2.5, -3, float("nan"), "1", True])
def test_bad_values_are_refused_by_name(soft, name, bad):
    with pytest.raises(OptionError, match=rf"{name}=.*a number in \[-2, 2\]"):
        Generator(soft, "ngram").generate([[1, 2]], max_new_tokens=2, **{name: bad})


def test_cli_flags_are_recorded_and_resume_compares_them(tmp_path, capsys):
    model_dir = save_model_dir(tmp_path / "tiny")
    out = tmp_path / "o.jsonl"
    base = f"generate --main {model_dir} --max-new-tokens 6 -o {out}"
    rc, _, err = run(capsys, f"{base} --frequency-penalty 0.5 --presence-penalty 1", "hello")
    assert rc == 0, err
    (row,) = read_jsonl(out)
    assert row["settings"]["frequency_penalty"] == 0.5
    assert row["settings"]["presence_penalty"] == 1.0
    rc, _, err = run(capsys, f"{base} --resume --frequency-penalty 0.5", "hello")
    assert rc == 2 and "presence_penalty: 1.0 there, null now" in one_error_line(err)
    rc, _, err = run(capsys, f"{base} --presence-penalty 3", "hello")
    assert rc == 2 and "--presence-penalty = 3" in one_error_line(err)


@pytest.mark.parametrize(
    "case", [dict(repetition_penalty=1.3), dict(frequency_penalty=0.8, presence_penalty=-0.5)]
)
def test_the_greedy_check_applies_the_penalties_to_its_reference(soft, case):
    """``bass.testing.assert_greedy_equivalent`` with penalties: transformers' own decoding
    penalised alike is the reference (it passes a generator that applies them, fails one
    that drops them)."""

    class Unpenalised(Generator):
        def generate(self, prompts, **kw):
            return super().generate(prompts, **{k: v for k, v in kw.items() if k not in case})

    testing.assert_greedy_equivalent(Generator(soft, perturbed(soft)), PROMPTS, 12, **case)
    with pytest.raises(AssertionError, match="differs from the main model's own greedy"):
        testing.assert_greedy_equivalent(Unpenalised(soft, "ngram"), PROMPTS, 12, **case)


def test_prompt_ids_past_the_logits_are_not_penalised(soft):
    """Input embeddings wider than the logits (a prompt id with no logit): nothing to
    penalise there, the rest penalised as without it."""
    import copy

    model = copy.deepcopy(soft)
    emb = torch.nn.Embedding(80, 32).to(torch.float64)
    with torch.no_grad():
        emb.weight[:64] = model.get_input_embeddings().weight
    model.set_input_embeddings(emb)
    res = Generator(model, "ngram").generate([[1, 2, 70, 3]], max_new_tokens=6, **CASES[2])
    assert res.sequences == [_plain(model, [1, 2, 70, 3], 6, **CASES[2])]


def test_the_checks_read_a_penalty_passed_as_none_from_the_config(soft):
    """``None`` counts as not given, in the checks as in ``generate``: the config's
    penalty shapes the reference."""
    config = {"generation": {"frequency_penalty": 1.0}}
    gen = Generator(soft, soft, policy="constant", policy_options={"k": 3}, config=config)
    testing.assert_greedy_equivalent(gen, PROMPTS, 12, frequency_penalty=None)
    with pytest.raises(OptionError, match="frequency_penalty=5"):
        testing.greedy_reference(soft, [1, 2], 4, frequency_penalty=5)
