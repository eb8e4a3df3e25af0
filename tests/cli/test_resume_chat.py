"""``--resume`` and the chat template: ``chat`` left out means "the template where the
tokenizer has one", so a run that left it out and one that says ``--chat`` (or
``--no-chat``) agree or not according to the tokenizer, which is known only once it loads."""

from __future__ import annotations

import json

import pytest
from cli_support import WORDS, one_error_line, read_jsonl, run, word_tokenizer
from models import tiny_lm

FAST = "--cpu-linear torch --dtype float64 --max-new-tokens 2 --batch-size 1"


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    """A tiny random Llama whose tokenizer has a chat template."""
    path = tmp_path_factory.mktemp("chat")
    tiny_lm().save_pretrained(path)
    tok = word_tokenizer(WORDS)
    tok.chat_template = "{% for m in messages %}hello {{ m['content'] }}{% endfor %}"
    tok.save_pretrained(path)
    return str(path)


def _keep_first_row(out, chat) -> None:
    """The output as a stopped run left it: its first row, recording ``chat``."""
    row = read_jsonl(out)[0]
    row["settings"]["chat"] = chat
    out.write_text(json.dumps(row) + "\n")


def test_resume_compares_the_chat_template_as_applied(chat_model, tmp_path, capsys):
    out = tmp_path / "out.jsonl"
    base = f"generate --main {chat_model} {FAST} -o {out}"
    rc, _, err = run(capsys, base, "the sea", "hello")
    assert rc == 0, err
    assert [r["settings"]["chat"] for r in read_jsonl(out)] == [True, True]  # as applied
    # chat left out there (null, as an older bass wrote it) or here: the tokenizer decides
    for there, now in [(None, "--chat"), (True, ""), (None, "")]:
        _keep_first_row(out, there)
        rc, _, err = run(capsys, f"{base} --resume {now}", "the sea", "hello")
        assert rc == 0 and "1 of 2 rows are already in" in err, (there, now, err)
        assert len(read_jsonl(out)) == 2
    # the template applied there, not now (or the reverse): refused, the file as it was
    for there, now, said in [
        (
            None,
            "--no-chat",
            "a row generated with the chat template, but this run's prompts "
            "go without it (chat: null there, false now)",
        ),
        (True, "--no-chat", "chat: true there, false now"),
        (
            False,
            "",
            "a row generated without the chat template, but this run's prompts go "
            "through it (chat: false there, true now); --resume continues a run with the same "
            "generation settings: rerun with --no-chat",
        ),
    ]:
        _keep_first_row(out, there)
        kept = out.read_text()
        rc, _, err = run(capsys, f"{base} --resume {now}", "the sea", "hello")
        assert rc == 2 and f"--output {out}:1: " in err and said in one_error_line(err), err
        assert out.read_text() == kept
    # chat left out there, something else differs: only that is named
    _keep_first_row(out, None)
    rc, _, err = run(capsys, f"{base} --resume --chat --max-new-tokens 3", "the sea", "hello")
    line = one_error_line(err)
    assert rc == 2 and "(max_new_tokens: 2 there, 3 now)" in line, err
