"""``bass`` under hostile input: usage errors are one ``bass: error:`` line (exit status 2)
in the words of the config file and the API, refused before any model loads; prompts
files by suffix in any case; invalid Unicode; bounds on rows and timeouts; drafter
plugins by name; ``bass eval humaneval``'s flags, output and problem names."""

from __future__ import annotations

import importlib.metadata
import os
import re

import pytest
from cli_support import one_error_line, read_jsonl, run, save_model_dir

import bass.cli.generate
import bass.cli.humaneval
import bass.drafters
from bass import cli, humaneval
from bass.drafters import Drafter, Proposal

FAST = "--cpu-linear torch --dtype float64"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_model_dir(tmp_path_factory.mktemp("tiny"))


# ------------------------------------------------------------------ argparse, one line


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ("generate --seed 1.5 hi", "argument --seed: invalid int value: '1.5'"),
        ("generate --max-new-tokens abc hi", "argument --max-new-tokens: invalid int value"),
        ("generate --temperature abc hi", "argument --temperature: invalid float value"),
        ("generate --dtype int8 hi", "argument --dtype: invalid choice: 'int8'"),
        ("generate --cpu-linear x hi", "argument --cpu-linear: invalid choice: 'x'"),
        ("generate hi --bogus", "unrecognized arguments: --bogus"),
        ("eval humaneval --timeout x", "argument --timeout: invalid float value: 'x'"),
        ("frobnicate", "argument COMMAND: invalid choice: 'frobnicate'"),
        ("policies extra", "unrecognized arguments: extra"),
    ],
)
def test_parser_errors_are_one_line(capsys, command, expected):
    rc, out, err = run(capsys, command)
    line = one_error_line(err)
    assert rc == 2 and out == "" and err == line + "\n"
    assert line.startswith(f"bass: error: {expected}")
    prog = "bass " + " ".join(command.split()[: 2 if command.startswith("eval") else 1])
    if command != "frobnicate":
        assert line.endswith(f"(see {prog} --help)"), line
    else:
        assert line.endswith("(see bass --help)")


# ---------------------------------------------------- command-line-only flags, one wording


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ("--n 0", "command line: --n = 0 is not allowed; expected an integer >= 1"),
        ("--batch-size 0", "command line: --batch-size = 0 is not allowed; expected an integer"),
        ("--tp 0", "command line: --tp = 0 is not allowed; expected an integer >= 1"),
        ("--tp -1", "command line: --tp = -1 is not allowed; expected an integer >= 1"),
        ("--n 99999999999999", "at most 10,000,000 rows (prompts x --n) per run"),
        ("--n 5000001", "2 prompts x --n 5000001 = 10000002 rows"),
        ("--samples 5000001", "2 prompts x --samples 5000001 = 10000002 rows"),
        ("--samples 0", "command line: --samples = 0 is not allowed; expected an integer >= 1"),
        ("--draft none --compare", "--compare compares drafting on with drafting off, but"),
    ],
)
def test_flags_are_refused_before_any_model_loads(capsys, no_model_load, flags, expected):
    rc, _, err = run(capsys, f"generate {flags} hello world")
    assert rc == 2 and expected in one_error_line(err)


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ("--batch-size 0", "command line: --batch-size = 0 is not allowed; expected an integer"),
        ("--kv-budget-gib 0", "--kv-budget-gib = 0.0 is not allowed; expected a finite number"),
    ],
)
def test_humaneval_batch_flags_are_refused_before_any_model_loads(
    capsys, no_model_load, flags, expected
):
    rc, _, err = run(capsys, f"eval humaneval {flags}")
    assert rc == 2 and expected in one_error_line(err)


def _row_gib(model_dir, positions: int, models: int = 1) -> float:
    """GiB of KV cache that ``positions`` of the float64 model in ``model_dir`` (and, with
    ``models=2``, its copy as the draft) take."""
    from transformers import AutoConfig

    from bass.cache import kv_bytes_per_token

    per_token = kv_bytes_per_token(AutoConfig.from_pretrained(model_dir), 8)
    return models * positions * per_token / 2**30


def test_a_kv_budget_too_small_for_one_row_is_named_as_its_flag(model_dir, capsys):
    """Between the shortest row's need (one-token prompt) and this prompt's: found once
    the prompt is read, after the model loads."""
    gib = _row_gib(model_dir, 9.5)  # 1 + 8 new tokens fit; 3 + 8 (rounded up to 16) do not
    flags = f"{FAST} --max-new-tokens 8 --kv-budget-gib {gib}"
    rc, _, err = run(capsys, f"generate --main {model_dir} {flags} hello world again")
    line = one_error_line(err)
    assert rc == 2 and line.startswith(f"bass: error: command line: --kv-budget-gib = {gib} is ")
    assert "one row of 16 positions (the longest prompt plus max_new_tokens" in line
    assert "expected at least" in line and "needs that much KV cache" in line


@pytest.mark.parametrize("command", ["generate {} hello", "eval humaneval --problems 1 {}"])
@pytest.mark.parametrize("draft", ["none", "model"])
def test_a_kv_budget_too_small_for_any_row_is_refused_before_the_models_load(
    model_dir, capsys, no_model_load, command, draft
):
    """Not even a one-token prompt's row fits: refused from the models' configs (a 7B's
    load takes minutes); the draft model's cache counts."""
    models = 1 if draft == "none" else 2
    gib = _row_gib(model_dir, 8.5, models)  # 1 + 8 new tokens do not fit
    drafting = f"--draft {model_dir}" if draft == "model" else "--draft none"
    flags = f"--main {model_dir} {drafting} {FAST} --max-new-tokens 8 --kv-budget-gib {gib}"
    rc, _, err = run(capsys, command.format(flags))
    line = one_error_line(err)
    assert rc == 2 and f"--kv-budget-gib = {gib} is not allowed; expected at least" in line
    assert "even a one-token prompt's row (9 positions: 1 + max_new_tokens; each" in line
    least = float(re.search(r"at least (\S+) GiB", line).group(1))  # main (and draft) counted
    assert _row_gib(model_dir, 9, models) <= least < 1.01 * _row_gib(model_dir, 9, models)


@pytest.mark.parametrize(
    ("draft", "said"),
    [("ngrm", "did you mean 'ngram'?"), ("./no-such-model", "does not exist; check the path")],
)
def test_a_draft_that_is_no_drafter_and_no_model_is_named_as_it_was_set(
    tmp_path, capsys, no_model_load, draft, said
):
    """By the file and key, or by its flag (before: the same words, named by neither); a
    flag that overrides the file's draft is what counts (the file alone is not checked)."""
    config = tmp_path / "c.toml"
    config.write_text(f'[model]\ndraft = "{draft}"\n')
    rc, _, err = run(capsys, f"generate --config {config} hello")
    line = one_error_line(err)
    assert rc == 2 and f"{config}: [model].draft = {draft!r}: " in line and said in line
    rc, _, err = run(capsys, f"generate --draft {draft} hello")
    line = one_error_line(err)
    assert rc == 2 and f"command line: --draft = {draft!r}: " in line and said in line
    flag_error = one_error_line(run(capsys, f"generate --config {config} --draft none -o '' hi")[2])
    assert "--output '': pass a file path" in flag_error  # the override passed the draft check


def test_output_flags_that_say_nothing_or_contradict_are_refused(tmp_path, capsys, no_model_load):
    out = tmp_path / "out.jsonl"
    cases = {
        "-o ''": "--output '': pass a file path",
        "-o -": "--output '-': pass a file path",
        "--overwrite": "--overwrite needs --output FILE",
        "--resume": "--resume needs --output FILE",
        f"-o {out} --resume --overwrite": "pass one of them",
    }
    for flags, expected in cases.items():
        rc, _, err = run(capsys, f"generate {flags} hello")
        assert rc == 2 and expected in one_error_line(err), (flags, err)


def test_an_output_that_is_another_file_is_not_called_results(tmp_path, capsys, no_model_load):
    notes = tmp_path / "README.md"
    notes.write_text("# notes\n\nkeep me\n")
    rc, _, err = run(capsys, f"generate -o {notes} hello")
    line = one_error_line(err)
    assert rc == 2 and f"{notes} holds 2 line(s) that are no bass results" in line, err
    assert "--resume" not in line and notes.read_text() == "# notes\n\nkeep me\n"


def test_an_output_with_a_directory_for_a_shard_is_refused(tmp_path, capsys, no_model_load):
    out = tmp_path / "out.jsonl"
    (tmp_path / "out.jsonl.rank0").mkdir()
    for extra in ("", "--overwrite", "--resume"):
        rc, _, err = run(capsys, f"generate -o {out} {extra} hello")
        line = one_error_line(err)
        assert rc == 2 and f"{out}.rank0 is not a regular file" in line, (extra, err)


def test_compare_with_draft_none_from_the_config(tmp_path, capsys, no_model_load):
    cfg = tmp_path / "c.toml"
    cfg.write_text('[model]\ndraft = "none"\n')
    rc, _, err = run(capsys, f"generate --config {cfg} --compare hello")
    assert rc == 2 and "but the draft is 'none'" in one_error_line(err)


# ------------------------------------------------------------------------------ prompts


def test_a_prompts_file_without_a_prompt_is_named(tmp_path, capsys, no_model_load):
    for text in ("", "\n  \n\n"):
        empty = tmp_path / "empty.txt"
        empty.write_text(text)
        rc, _, err = run(capsys, f"generate --prompts-file {empty}")
        assert rc == 2 and f"{empty} holds no prompt (no line with text)" in one_error_line(err)


def test_prompts_file_suffixes(model_dir, tmp_path, capsys, no_model_load):
    upper = tmp_path / "p.JSONL"
    upper.write_text('{"prompt": "hello"}\n{"text": 1}\n')
    rc, _, err = run(capsys, f"generate --prompts-file {upper}")
    # read as JSON lines (line 1 taken, line 2 refused), not as text
    assert rc == 2 and f'{upper}:2: expected a JSON object with a "prompt"' in one_error_line(err)
    for name in ("p.json", "p.JSON"):
        path = tmp_path / name
        path.write_text('[{"prompt": "hello"}]\n')
        rc, _, err = run(capsys, f"generate --prompts-file {path}")
        line = one_error_line(err)
        assert rc == 2 and f"--prompts-file {path}: a .json file is not read" in line
        assert "takes a .jsonl file" in line and "rename it to .jsonl" in line


def test_prompts_file_upper_case_jsonl_generates(model_dir, tmp_path, capsys):
    upper = tmp_path / "p.JSONL"
    upper.write_text('{"prompt": "hello"}\n')
    out = tmp_path / "o.jsonl"
    rc, stdout, err = run(
        capsys, f"generate --main {model_dir} {FAST} --max-new-tokens 2 --prompts-file {upper} "
        f"-o {out}"
    )  # fmt: skip
    assert rc == 0 and stdout.startswith(">>> hello\n"), err
    assert read_jsonl(out)[0]["prompt"] == "hello"


def test_invalid_unicode_prompts_are_refused_while_reading(tmp_path, capsys, no_model_load):
    # a byte the shell's locale cannot decode arrives as a surrogate escape
    rc = cli.main(["generate", "fine", "hello \udcff"])
    _, err = capsys.readouterr()
    line = one_error_line(err)
    assert rc == 2 and "PROMPT argument 2: not valid Unicode text (U+DCFF at character 7" in line
    assert "the byte 0xff, which is not UTF-8" in line
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text('{"prompt": "ok"}\n{"prompt": "a \\ud800 b"}\n')
    rc, _, err = run(capsys, f"generate --prompts-file {jsonl}")
    line = one_error_line(err)
    assert rc == 2 and f"{jsonl}:2: not valid Unicode text (U+D800 at character 3" in line
    assert "a lone surrogate" in line


# --------------------------------------------------------------------- drafter plugins


class RepeatLast(Drafter):
    """Proposes the row's last token again (a drafter plugin for the tests)."""

    name = "repeat-last"
    calls = built = 0

    def __init__(self):
        type(self).built += 1

    def start(self, state, passes, max_len, device):
        self.state = state
        return 0

    def propose(self, view, lengths):
        type(self).calls += 1
        last = [self.state.seqs[s][-1] for s in view.slots]
        return Proposal(drafted=list(lengths), host_tokens=[[t] * k for t, k in zip(last, lengths)])


@pytest.fixture
def plugin(monkeypatch):
    eps = [
        importlib.metadata.EntryPoint("repeat-last", "test_cli_inputs:RepeatLast", "bass.drafters"),
        importlib.metadata.EntryPoint("ngram", "bass.drafters:NGramDrafter", "bass.drafters"),
    ]
    monkeypatch.setattr(bass.drafters, "entry_points", lambda: eps)
    RepeatLast.calls = RepeatLast.built = 0


def test_a_drafter_plugin_by_name(model_dir, tmp_path, capsys, monkeypatch, plugin):
    command = f"generate --main {model_dir} {FAST} --max-new-tokens 6 --policy constant"
    rc, _, err = run(capsys, f"{command} --draft repeat-last hello world")
    assert rc == 0, err
    assert RepeatLast.calls > 0 and "bass: loading draft model" not in err
    cfg = tmp_path / "c.toml"
    cfg.write_text('[model]\ndraft = "repeat-last"\n')
    RepeatLast.calls = 0
    rc, _, err = run(capsys, f"{command} --config {cfg} hello world")
    assert rc == 0 and RepeatLast.calls > 0, err
    # the name wins over a directory of that name; ./NAME is the directory
    monkeypatch.chdir(tmp_path)
    (tmp_path / "repeat-last").mkdir()
    RepeatLast.calls = 0
    rc, _, err = run(capsys, f"{command} --draft repeat-last hello world")
    assert rc == 0 and RepeatLast.calls > 0, err
    rc, _, err = run(capsys, f"{command} --draft ./repeat-last hello world")
    line = one_error_line(err)
    assert rc == 2 and "cannot load the draft model from ./repeat-last" in line
    assert "an installed drafter (ngram, repeat-last) or 'none'" in line


def test_a_config_files_drafter_plugin_is_built_once_to_check_it(
    model_dir, tmp_path, capsys, plugin
):
    """Built once to check it before any model loads, once for the generation; never
    when --draft chooses another (it was built for the file alone, then again)."""
    cfg = tmp_path / "c.toml"
    cfg.write_text('[model]\ndraft = "repeat-last"\n')
    command = f"generate --main {model_dir} {FAST} --max-new-tokens 4 --config {cfg}"
    rc, _, err = run(capsys, f"{command} --draft ngram hello world")
    assert rc == 0 and RepeatLast.built == 0, err
    rc, _, err = run(capsys, f"{command} hello world")
    assert rc == 0 and RepeatLast.built == 2 and RepeatLast.calls > 0, err


def test_a_broken_drafter_plugin_is_one_error_line(model_dir, capsys, monkeypatch):
    eps = [importlib.metadata.EntryPoint("broken", "no_such_module_for_bass:X", "bass.drafters")]
    monkeypatch.setattr(bass.drafters, "entry_points", lambda: eps)
    rc, _, err = run(capsys, f"generate --main {model_dir} {FAST} --draft broken hello")
    assert rc == 2 and "drafter 'broken' (entry point 'no_such_module_for_bass:X') failed" in err
    assert "internal error" not in err


# ------------------------------------------------------------------------ eval humaneval

PROBLEMS = [
    {"task_id": "Toy/0", "prompt": "def add(a, b):\n", "test": "", "entry_point": "add"},
    {"task_id": "Toy/1", "prompt": " ".join(["w20"] * 300), "test": "", "entry_point": "f"},
]


@pytest.fixture
def toy_problems(monkeypatch):
    monkeypatch.setattr(humaneval, "load_problems", lambda: {p["task_id"]: p for p in PROBLEMS})


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ("--timeout inf", "command line: --timeout = inf is not allowed; expected a finite"),
        ("--timeout nan", "command line: --timeout = nan is not allowed"),
        ("--timeout 0", "command line: --timeout = 0.0 is not allowed"),
        ("--timeout 1e300", "> 0 and <= 86400"),
        ("--n 0", "command line: --n = 0 is not allowed; expected an integer >= 1"),
        ("--n 99999999999", "command line: --n = 99999999999 is not allowed"),
        ("--samples 0", "command line: --samples = 0 is not allowed; expected an integer >= 1"),
        ("--problems 0:10:0", "command line: --problems = '0:10:0' is not allowed"),
        ("--problems ''", "command line: --problems = '' is not allowed"),
        ("--problems ' '", "command line: --problems = ' ' is not allowed"),
    ],
)
def test_humaneval_flags_are_refused_before_any_model_loads(
    capsys, no_model_load, toy_problems, flags, expected
):
    rc, _, err = run(capsys, f"eval humaneval {flags}")
    assert rc == 2 and expected in one_error_line(err)


def test_humaneval_output_is_not_an_input(tmp_path, capsys, no_model_load, toy_problems):
    cfg = tmp_path / "c.toml"
    cfg.write_text("[generation]\nmax_new_tokens = 2\n")
    rc, _, err = run(capsys, f"eval humaneval --config {cfg} -o {cfg}")
    assert rc == 2 and f"--output {cfg} is the --config file" in one_error_line(err)
    assert cfg.read_text() == "[generation]\nmax_new_tokens = 2\n"


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_humaneval_a_failed_write_is_one_error_line(model_dir, capsys, monkeypatch, toy_problems):
    def fake_sampler(problems, n, on_problem=None):
        return [[humaneval.Sample("    return a + b\n", 3, True)] * n for _ in problems], None

    monkeypatch.setattr(humaneval, "make_sampler", lambda *a, **kw: fake_sampler)
    rc, _, err = run(capsys, f"eval humaneval --main {model_dir} {FAST} --problems 0 -o /dev/full")
    line = one_error_line(err)
    assert (
        rc == 2
        and line == "bass: error: --output /dev/full: cannot write it: No space left on device"
    )
    assert err.rstrip().endswith("bass: 0 of 1 problems' results are in /dev/full")


def test_humaneval_names_a_too_long_problem_by_its_task_id(
    model_dir, tmp_path, capsys, toy_problems
):
    out = tmp_path / "he.jsonl"
    rc, _, err = run(
        capsys, f"eval humaneval --main {model_dir} {FAST} --max-new-tokens 4 -o {out} --draft none"
    )
    line = one_error_line(err)
    assert rc == 2 and "the prompt of Toy/1 (300 tokens) + max_new_tokens (4)" in line
    # every prompt checked before any is generated, before --output is opened
    assert err.rstrip().splitlines()[-1] == line and not out.exists()


@pytest.mark.parametrize("command", ["generate", "eval humaneval"])
def test_a_config_eos_outside_the_vocabulary_names_the_file_and_key(
    model_dir, tmp_path, capsys, toy_problems, command
):
    cfg = tmp_path / "eos.toml"
    cfg.write_text("[generation]\neos_token_id = 1000\n")
    args = f"{command} --main {model_dir} --config {cfg} --max-new-tokens 2 --draft none"
    rc, _, err = run(capsys, args, *(["hi"] if command == "generate" else []))
    assert rc == 2
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"bass: error: {cfg}: [generation].eos_token_id = 1000 is not allowed")


@pytest.mark.parametrize("device", ["foo", "mps", "meta"])
def test_ops_names_a_device_it_cannot_tell_about(capsys, no_model_load, device):
    rc, out, err = run(capsys, f"ops --device {device}")
    assert rc == 2 and one_error_line(err) == (
        f"bass: error: command line: --device = '{device}' is not allowed; expected a device "
        "type bass runs on: cpu, cuda"
    )
    assert out == ""


def test_a_model_bass_refuses_is_a_user_error(tmp_path, capsys):
    """A refused model (here: a config's sliding window that no layer passes to its
    attention, found in the first pass past the window) is one ``bass: error:`` line with
    status 2: not reported as a bug of bass, and without advice to ``--resume`` (no rerun
    would generate)."""
    from cli_support import WORDS, word_tokenizer
    from models import tiny_lm

    model = tiny_lm("llama")
    model.config.sliding_window = 8
    model.save_pretrained(tmp_path / "m")
    word_tokenizer(WORDS).save_pretrained(tmp_path / "m")
    out = tmp_path / "out.jsonl"
    cmd = f"generate --main {tmp_path / 'm'} {FAST} --no-chat --max-new-tokens 20 -o {out}"
    rc, _, err = run(capsys, cmd, "hello world")
    assert rc == 2
    line = one_error_line(err)
    assert "config sets a sliding window of 8 tokens, shorter than this generation" in line
    assert "bug" not in err and "--resume" not in err


@pytest.mark.parametrize("command", ["ops", "generate --max-new-tokens 2 hello"])
def test_a_bad_auto_attention_setting_is_the_users_to_fix_not_a_bug(
    monkeypatch, capsys, model_dir, command
):
    """Before: "internal error: ValueError ... (a bug in bass: please report it)", status 1."""
    monkeypatch.setenv("BASS_AUTO_ATTENTION", "nope")
    command = command.replace("generate", f"generate --main {model_dir} {FAST}")
    rc, _, err = run(capsys, command)
    line = one_error_line(err)
    assert rc == 2 and "$BASS_AUTO_ATTENTION='nope' names no ragged attention" in line
    assert "internal error" not in err


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_a_full_disk_under_standard_output_is_the_machines_error_not_a_bug_in_bass():
    """``bass policies > /dev/full``: "internal error: OSError ... (a bug in bass: please
    report it)", status 1. Said as what it is, status 2."""
    import subprocess
    import sys

    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "bass", "policies"], stdout=full,
                              stderr=subprocess.PIPE, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 2 and "internal error" not in proc.stderr
    assert "bass: error: No space left on device (writing standard output or an open" in proc.stderr


@pytest.mark.parametrize("filename", [None, "/data/shard.jsonl"])
def test_a_failing_device_elsewhere_does_not_blame_standard_output(capsys, monkeypatch, filename):
    """An EIO or a full disk on another file (a shard merge's write, which names no file):
    the machine's error, status 2, naming the file where the error does."""
    import errno

    def failing(args):
        raise OSError(errno.EIO, os.strerror(errno.EIO), *([filename] if filename else []))

    monkeypatch.setattr(cli, "cmd_policies", failing)
    monkeypatch.setattr(cli, "stdout_to_devnull", lambda: None)  # pytest's own stdout
    rc, _, err = run(capsys, "policies")
    assert rc == 2 and "internal error" not in err
    said = f"{filename}: {os.strerror(errno.EIO)}" if filename else os.strerror(errno.EIO)
    assert f"bass: error: {said}" in err

    def missing(args):  # any other OSError stays what it is: unforeseen
        raise FileNotFoundError(2, "No such file or directory", "/nonexistent/x")

    monkeypatch.setattr(cli, "cmd_policies", missing)
    rc, _, err = run(capsys, "policies")
    assert rc == 1 and "internal error: FileNotFoundError" in err
