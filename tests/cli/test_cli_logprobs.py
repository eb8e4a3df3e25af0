"""``bass generate --logprobs``: each row's token ids and log-probabilities in ``--output``,
as the API gives them (the API's own suite: tests/engine/test_logprobs.py)."""

from __future__ import annotations

import pytest
from cli_support import WORDS, one_error_line, read_jsonl, run, save_model_dir, word_tokenizer


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_model_dir(tmp_path_factory.mktemp("tiny"))


def test_logprobs_are_written_with_each_rows_token_ids(model_dir, tmp_path, capsys):
    """``--logprobs raw``: each row's token ids and their
    log-probabilities, those of the same generation through the API; ``--resume`` refuses
    a file whose rows hold other ones; a bad mode is refused naming the flag; without
    ``--output`` a note says they go nowhere; an evaluation has no such flag."""
    from bass import Generator, load_causal_lm

    base = f"generate --main {model_dir} --draft ngram --max-new-tokens 8 -o {tmp_path}/o.jsonl"
    prompts = ("hello world hello world", "the sea is blue")
    rc, _, err = run(capsys, f"{base} --sample --seed 4 --temperature 0.8 --logprobs raw", *prompts)
    assert rc == 0, err
    rows = read_jsonl(tmp_path / "o.jsonl")
    assert all(r["settings"]["logprobs"] == "raw" for r in rows)
    tok = word_tokenizer(WORDS)
    main = load_causal_lm(model_dir)
    ids = [tok(p)["input_ids"] for p in prompts]
    from bass.sampling import row_key

    res = Generator(main, "ngram").generate(
        ids, max_new_tokens=8, do_sample=True, seed=4, temperature=0.8, logprobs="raw",
        row_ids=[row_key(i, 0) for i in range(2)],
    )  # fmt: skip
    for r in rows:
        assert r["token_ids"] == res.sequences[r["prompt_index"]]
        assert r["logprobs"] == pytest.approx(res.logprobs[r["prompt_index"]], abs=1e-5)
        assert len(r["logprobs"]) == r["completion_tokens"]
    rc, _, err = run(capsys, f"{base} --resume --sample --seed 4 --temperature 0.8", *prompts)
    assert rc == 2 and 'logprobs: "raw" there, null now' in one_error_line(err)
    rc, _, err = run(capsys, f"generate --main {model_dir} --logprobs all", "hello")
    assert rc == 2 and "--logprobs = 'all' is not allowed; expected raw, processed" in err
    rc, _, err = run(capsys, f"generate --main {model_dir} --max-new-tokens 2 --logprobs raw", "hi")
    assert rc == 0 and "note: logprobs are written to --output only" in err
    rc, _, err = run(capsys, f"eval humaneval --main {model_dir} --logprobs raw")
    assert rc == 2 and "unrecognized arguments: --logprobs raw" in err  # it keeps none


def test_prompt_logprobs_are_written_with_each_rows_prompt_token_ids(model_dir, tmp_path, capsys):
    """``--prompt-logprobs``: each row's prompt token ids and their log-probabilities (the
    first: null), those of the API; ``--resume`` without it refuses the file; without
    ``--output`` a note says they go nowhere; an evaluation has no such flag."""
    from bass import Generator, load_causal_lm

    base = f"generate --main {model_dir} --max-new-tokens 3 -o {tmp_path}/o.jsonl"
    prompts = ("hello world hello world", "the sea is blue")
    rc, _, err = run(capsys, f"{base} --prompt-logprobs", *prompts)
    assert rc == 0, err
    rows = read_jsonl(tmp_path / "o.jsonl")
    assert all(r["settings"]["prompt_logprobs"] is True for r in rows)
    tok = word_tokenizer(WORDS)
    ids = [tok(p)["input_ids"] for p in prompts]
    res = Generator(load_causal_lm(model_dir), "ngram").generate(
        ids, max_new_tokens=3, prompt_logprobs=True
    )
    for r in rows:
        i = r["prompt_index"]
        assert r["prompt_token_ids"] == ids[i] and r["prompt_logprobs"][0] is None
        assert r["prompt_logprobs"][1:] == pytest.approx(res.prompt_logprobs[i][1:], abs=1e-5)
    rc, _, err = run(capsys, f"{base} --resume", *prompts)
    assert rc == 2 and "prompt_logprobs: true there, null now" in one_error_line(err)
    rc, _, err = run(capsys, f"generate --main {model_dir} --max-new-tokens 2 --prompt-logprobs",
                     "hi")  # fmt: skip
    assert rc == 0 and "note: prompt_logprobs are written to --output only" in err
    rc, _, err = run(capsys, f"eval humaneval --main {model_dir} --prompt-logprobs")
    assert rc == 2 and "unrecognized arguments: --prompt-logprobs" in err


def test_an_evaluation_says_it_computes_no_logprobs_a_shared_config_asks_for(
    model_dir, tmp_path, capsys, monkeypatch
):
    """A config file shared with ``bass generate`` that asks for log-probabilities: the
    evaluation says, for each, that it keeps none (and computes none), then runs."""
    import bass.humaneval as he

    toy = {"task_id": "Toy/0", "prompt": "def f():\n", "test": "", "entry_point": "f"}
    monkeypatch.setattr(he, "load_problems", lambda: {"Toy/0": toy})
    seen = []

    def sampler(problems, n, on_problem=None):
        return [[he.Sample("    return 1\n", 3, True)] * n for _ in problems], None

    def make_sampler(*args, **kwargs):
        seen.append(kwargs)
        return sampler

    monkeypatch.setattr(he, "make_sampler", make_sampler)
    cfg = tmp_path / "c.toml"
    cfg.write_text('[generation]\nmax_new_tokens = 2\nlogprobs = "raw"\nprompt_logprobs = true\n')
    rc, _, err = run(capsys, f"eval humaneval --main {model_dir} --config {cfg} --draft none")
    assert rc == 0, err
    for key in ("logprobs", "prompt_logprobs"):
        flag = "--" + key.replace("_", "-")
        assert (
            f"note: {key}: an evaluation scores completions and keeps no log-probabilities: "
            f"not computed (bass generate {flag} writes them)" in " ".join(err.split())
        )
        assert seen and all(not kw.get(key) for kw in seen)  # not asked of generate
