"""``generate(n=)``: ``n`` rows per prompt, one after another, each sample keyed by
``row_key(prompt, sample)`` as ``bass generate --n`` keys it: the same samples however
the job is split (calls, row ids, ranks), in ``generate``, ``stream`` and
``generate_text``; a bad ``n`` is refused by name."""

from __future__ import annotations

import pytest
from cli_support import WORDS, word_tokenizer
from models import perturbed, tiny_lm

from bass import Generator, distributed
from bass.options import OptionError
from bass.sampling import row_key

PROMPTS = [[1, 2, 3, 4, 5, 6], [7, 8, 9], [3, 3, 3, 10]]
KW = dict(max_new_tokens=10, do_sample=True, seed=4)


@pytest.fixture(scope="module")
def gen():
    main = tiny_lm("llama", sharpen=4.0)
    return Generator(main, perturbed(main))


def test_n_rows_per_prompt_keyed_by_prompt_and_sample(gen):
    """The rows of ``n=3`` equal the repeated prompts keyed by ``row_key``; samples of one
    prompt differ; a later share of the job (its prompts' row ids given) draws the same
    samples, through ``bass.distributed.generate`` too; rows admitted as others finish."""
    res = gen.generate(PROMPTS, n=3, max_rows=4, **KW)
    rows = [p for p in PROMPTS for _ in range(3)]
    ids = [row_key(i, j) for i in range(3) for j in range(3)]
    assert res.sequences == gen.generate(rows, row_ids=ids, **KW).sequences
    assert len({tuple(s) for s in res.sequences[:3]}) > 1
    assert gen.generate(PROMPTS[1:], n=3, row_ids=[1, 2], **KW).sequences == res.sequences[3:]
    assert distributed.generate(gen, PROMPTS, n=3, **KW).sequences == res.sequences
    streamed = {r.prompt: r.tokens for r in gen.stream(PROMPTS, n=3, **KW)}
    assert [streamed[i] for i in range(9)] == res.sequences


def test_generate_text_gives_n_completions_per_text(gen):
    tok = word_tokenizer(WORDS)
    texts = ["hello world", "the sea is blue"]
    out = gen.generate_text(texts, tok, n=2, **KW)
    ids = [row_key(i, j) for i in range(2) for j in range(2)]
    assert out == gen.generate_text([t for t in texts for _ in range(2)], tok, row_ids=ids, **KW)
    assert len(out) == 4 and out[0] != out[1]


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, 2**24 + 1, "2"])
def test_bad_n_is_refused_by_name(gen, bad):
    with pytest.raises(OptionError, match=r"n=.* is not allowed; expected an integer in \[1"):
        gen.generate(PROMPTS, n=bad, max_new_tokens=2)


def test_row_ids_too_large_to_key_samples_are_refused(gen):
    with pytest.raises(OptionError, match=r"row_ids=.*ints < 2\*\*39 with n "):
        gen.generate(PROMPTS, n=2, row_ids=[0, 1, 2**50], max_new_tokens=2)


def test_n_keys_rows_as_the_command_line_does(gen, tmp_path, capsys):
    """``n`` given (1 too) keys sample ``j`` of prompt ``i`` by ``row_key(i, j)``, as ``bass
    generate`` does with or without ``--n``: the same samples, and a larger ``n`` keeps the
    first ones."""
    from cli_support import read_jsonl, run, save_model_dir

    from bass import load_causal_lm

    model_dir = save_model_dir(tmp_path / "tiny")
    texts = ["hello world", "the sea is blue"]
    out = tmp_path / "o.jsonl"
    cmd = f"generate --main {model_dir} --sample --seed 11 --max-new-tokens 8 --logprobs raw"
    tok, main = word_tokenizer(WORDS), load_causal_lm(model_dir)
    ids = [tok(t)["input_ids"] for t in texts]
    g = Generator(main, "ngram")
    kw = dict(max_new_tokens=8, do_sample=True, seed=11, eos_token_id=tok.eos_token_id)
    one = g.generate(ids, n=1, **kw).sequences
    three = g.generate(ids, n=3, **kw).sequences
    assert three[::3] == one
    for n, want in ((1, one), (3, three)):
        assert run(capsys, f"{cmd} --n {n} -o {out} --overwrite", *texts)[0] == 0
        rows = sorted(read_jsonl(out), key=lambda r: (r["prompt_index"], r["sample"]))
        assert [r["token_ids"] for r in rows] == want


def test_a_rows_error_names_the_callers_prompt(gen):
    """Non-finite logits in a row of prompt 2 (of 3, n=3: row 6) name prompt 2."""
    import torch

    from bass import NonFiniteLogitsError

    bad = tiny_lm("llama", sharpen=4.0)
    with torch.no_grad():
        bad.get_input_embeddings().weight[50] = float("nan")
    with pytest.raises(NonFiniteLogitsError, match="for prompt 2 ") as info:
        Generator(bad, None).generate([[1, 2, 3], [4, 5, 6], [7, 50, 8]], n=3, max_new_tokens=3)
    assert info.value.prompt == 2


def test_too_many_rows_and_the_checks_refuse_n(gen, monkeypatch):
    from bass import scheduler, testing

    monkeypatch.setattr(scheduler, "MAX_ROWS_N", 5)
    with pytest.raises(OptionError, match=r"n=2 .*at most 5 rows a call: 3 prompts x n=2 is 6"):
        gen.generate(PROMPTS, n=2, max_new_tokens=2)
    with pytest.raises(ValueError, match=r"checks one row per prompt: drop n=2"):
        testing.assert_greedy_equivalent(gen, PROMPTS, 4, n=2)
    with pytest.raises(ValueError, match=r"checks one row per prompt: drop n=2"):
        testing.assert_sampled_equivalent(gen, PROMPTS, 4, n=2)
