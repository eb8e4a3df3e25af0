"""Text stop strings (``generate(stop_strings=..., tokenizer=...)``) on tiny models.

The tokenizers are built offline: 64 pieces of 1-3 characters over a small alphabet, so
the tiny random models' output decodes to text in which short strings recur, span several
tokens and end in the middle of a token. The oracle for where a row must end is the first
token whose prefix of the row decodes to text that contains a stop string.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from models import perturbed, reference_greedy, tiny_lm
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from bass import Generator
from bass.errors import OptionError
from bass.stats import GenerationResult, GenerationStats
from bass.stopping import StopStrings, cut_at_stop, decode_after, decode_rows

PROMPTS = [[1, 2, 3, 4, 5], [7, 8], [9, 10, 11, 12, 13, 14, 15, 16, 3], [5], [6, 6, 6, 2]]
ALPHABET = "ab\n #("


def _pieces(n: int = 61, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    pieces = list(ALPHABET)
    while len(pieces) < n:
        p = "".join(rng.choice(ALPHABET) for _ in range(rng.randint(2, 3)))
        if p not in pieces:
            pieces.append(p)
    return pieces


def _wrap(backend: Tokenizer) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )


def fuse_tokenizer() -> PreTrainedTokenizerFast:
    """Ids 0-2 special, 3-63 pieces of text; decode concatenates the pieces. Text encodes
    one character per token (every character of ALPHABET is a piece)."""
    vocab = {w: i for i, w in enumerate(["<unk>", "<s>", "</s>", *_pieces()])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), "isolated")
    backend.decoder = decoders.Fuse()
    return _wrap(backend)


def _byte_alphabet() -> dict[int, str]:  # GPT-2's bytes -> printable characters
    keep = [*range(33, 127), *range(161, 173), *range(174, 256)]
    extra = [b for b in range(256) if b not in keep]
    return {**{b: chr(b) for b in keep}, **{b: chr(256 + i) for i, b in enumerate(extra)}}


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level pieces: multi-byte characters split across tokens decode to U+FFFD
    until their last byte arrives."""
    m = _byte_alphabet()
    chunks = [p.encode() for p in _pieces(45)]
    for ch in ("é", "你", "€"):
        b = ch.encode()
        chunks += [b[:1], b[1:], b, b + b"a"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for c in chunks:
        vocab.setdefault("".join(m[x] for x in c), len(vocab))
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.decoder = decoders.ByteLevel()
    return _wrap(backend)


def metaspace_tokenizer() -> PreTrainedTokenizerFast:
    """SentencePiece-like: ``_`` is a space, and decoding drops the text's leading space
    (so a window of a row does not decode to a slice of the row's text)."""
    pieces = [p.replace(" ", "\u2581") for p in _pieces()]
    pieces = [p if i % 3 else "\u2581" + p for i, p in enumerate(pieces)]
    vocab = {w: i for i, w in enumerate(dict.fromkeys(["<unk>", "<s>", "</s>", *pieces]))}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.decoder = decoders.Metaspace()
    return _wrap(backend)


TOKENIZERS = {"fuse": fuse_tokenizer, "bytes": byte_tokenizer, "metaspace": metaspace_tokenizer}


@pytest.fixture(scope="module")
def tok():
    return fuse_tokenizer()


@pytest.fixture(scope="module")
def llama():
    return tiny_lm("llama")


def text(tokenizer, ids) -> str:
    return tokenizer.decode(ids, skip_special_tokens=True)


def first_stop(tokenizer, ids, stops, prompt=()) -> int | None:
    """How many tokens of ``ids`` a row keeps: up to the first that completes a stop in
    the row's text (decoded after ``prompt``, as the row's text is given)."""
    for j in range(1, len(ids) + 1):
        t = decode_after(tokenizer, prompt, ids[:j])
        if any(s in t for s in stops):
            return j
    return None


def cut(tokenizer, ids, stops) -> list[int]:
    j = first_stop(tokenizer, ids, stops)
    return ids if j is None else ids[:j]


def spans_tokens_ending_mid_token(tokenizer, ids, stop) -> bool:
    """``stop`` first completes at a token that ends after it, and starts in an earlier
    token (so it spans two or more tokens and ends mid-token)."""
    j = first_stop(tokenizer, ids, [stop])
    if j is None:
        return False
    before, upto = text(tokenizer, ids[: j - 1]), text(tokenizer, ids[:j])
    end = upto.find(stop) + len(stop)
    return upto.find(stop) < len(before) and end < len(upto)


def cut_mid_step(res, row: int, max_new: int) -> bool:
    """Did ``row`` end before the last token its final step accepted?"""
    steps = [s for s in res.stats.steps if row in s.prompts]
    taken = 1 + sum(s.accepted[s.prompts.index(row)] + 1 for s in steps)
    return len(res.sequences[row]) < min(taken, max_new)


# ----------------------------------------------------------------------------- matcher


def simulate(matcher, ids, chunks, prompt=()) -> int | None:
    """Feed ``ids`` to ``matcher`` in steps of ``chunks`` tokens, as the engine appends
    a step's accepted tokens; the kept length where a stop string ended it."""
    out, c = [], 0
    while len(out) < len(ids):
        before = len(out)
        n = min(chunks[c % len(chunks)], len(ids) - before)
        c += 1
        out.extend(ids[before : before + n])
        keep = matcher.check(0, out, n, prompt)
        if keep is not None:
            return before + keep
    return None


@settings(max_examples=150)
@given(
    kind=st.sampled_from(sorted(TOKENIZERS)),
    data=st.data(),
    chunks=st.lists(st.integers(1, 7), min_size=1, max_size=6),
)
def test_matcher_agrees_with_decoding_every_prefix(kind, data, chunks):
    tokenizer = _TOK.setdefault(kind, TOKENIZERS[kind]())
    vocab = len(tokenizer.get_vocab())
    ids = data.draw(st.lists(st.integers(1, vocab - 1), min_size=1, max_size=90))
    prompt = data.draw(st.lists(st.integers(1, vocab - 1), max_size=12))
    full = decode_after(tokenizer, prompt, ids)
    stops = data.draw(
        st.lists(
            st.one_of(
                st.text(alphabet=ALPHABET + "é你€a", min_size=1, max_size=4),
                st.integers(0, max(0, len(full) - 1)).flatmap(
                    lambda i: st.integers(1, 30).map(lambda n: full[i : i + n] or "zz")
                ),
            ),
            min_size=1,
            max_size=3,
        )
    )
    got = simulate(StopStrings(stops, tokenizer), ids, chunks, prompt)
    assert got == first_stop(tokenizer, ids, stops, prompt)


_TOK: dict = {}


def _row(tokenizer, kind: str, n: int, seed: int) -> list[int]:
    """``n`` or so random token ids; for the byte tokenizer, multi-byte characters come
    split across two tokens half the time."""
    rng = random.Random(seed)
    vocab = tokenizer.get_vocab()
    plain = sorted(i for i in vocab.values() if i > 2 and "\ufffd" not in text(tokenizer, [i]))
    m = _byte_alphabet()
    ids: list[int] = []
    while len(ids) < n:
        if kind == "bytes" and rng.random() < 0.3:
            b = rng.choice(("é", "你", "€")).encode()
            ids += [vocab["".join(m[x] for x in b[:1])], vocab["".join(m[x] for x in b[1:])]]
        else:
            ids.append(rng.choice(plain))
    return ids


@pytest.mark.parametrize("kind", sorted(TOKENIZERS))
def test_matcher_finds_every_stop_string_of_a_long_row(kind):
    """Every substring of a long row's text (lengths 1, 2, 5, 13), as the stop string,
    ends the row at the oracle's token, whatever the step sizes: stop strings that start
    at a window's first character, or on a character completed by a later byte token."""
    tokenizer = _TOK.setdefault(kind, TOKENIZERS[kind]())
    ids = _row(tokenizer, kind, 120, seed=1)
    prefixes = [text(tokenizer, ids[:j]) for j in range(len(ids) + 1)]
    full = prefixes[-1]
    for n in (1, 2, 5, 13):
        for i in range(0, len(full) - n + 1):
            stop = full[i : i + n]
            want = next(j for j, t in enumerate(prefixes) if stop in t)
            for chunks in ([1], [4, 1, 3]):
                got = simulate(StopStrings([stop], tokenizer), ids, chunks)
                assert got == want, (stop, chunks)


def test_matcher_decodes_a_bounded_tail(tok):
    calls = []

    class Counting:
        def decode(self, ids, skip_special_tokens=True):
            calls.append(len(ids))
            return tok.decode(ids, skip_special_tokens=skip_special_tokens)

    ids = [3 + (i * 7) % 61 for i in range(400)]
    stop = "\x00never"
    m = StopStrings([stop], Counting())
    assert simulate(m, ids, [3]) is None
    assert max(calls) <= 2 * m.context + 3  # never the whole row
    assert len(calls) < 1.2 * len(ids) / 3  # about one decode per step


def test_cut_at_stop():
    assert cut_at_stop("ab\n#cd", ["#", "\n#"]) == "ab"
    assert cut_at_stop("abc", ["x"]) == "abc"
    assert cut_at_stop("abcb", "b") == "a"


# ----------------------------------------------------------------------------- engine


def test_greedy_stop_mid_step_equals_the_models_own_output_cut(llama, tok):
    """The draft is the main model (every drafted token accepted, 5 tokens a step), so a
    stop string completes in the middle of a step; the row ends at its token and the
    other rows are exactly the main model's greedy output."""
    max_new = 16
    solo = [reference_greedy(llama, p, max_new) for p in PROMPTS]
    # a stop string from row 2's text that spans tokens and ends mid-token and mid-step
    stop = next(
        s
        for j in range(2, max_new)
        if (j - 1) % 5
        for n in (4, 3, 2)
        if spans_tokens_ending_mid_token(
            tok, solo[2], s := text(tok, solo[2][: j + 1])[-n - 1 : -1]
        )
        and first_stop(tok, solo[2], [s]) == j + 1
    )
    gen = Generator(llama, llama, policy="constant", policy_options={"k": 4})
    res = gen.generate(PROMPTS, max_new_tokens=max_new, stop_strings=[stop], tokenizer=tok)
    for row, full in enumerate(solo):
        assert res.sequences[row] == cut(tok, full, [stop]), row
        j = first_stop(tok, full, [stop])
        assert res.finish_reasons[row] == ("stop" if j is not None else "length")
    assert cut_mid_step(res, 2, max_new)
    assert "length" in res.finish_reasons  # rows that never hit a stop ran to the end
    assert all(
        len(s) == max_new for s, r in zip(res.sequences, res.finish_reasons) if r == "length"
    )


@pytest.mark.parametrize("draft", ["perturbed", "ngram", None])
def test_greedy_stops_match_with_every_drafter(llama, tok, draft):
    max_new = 24
    solo = [reference_greedy(llama, p, max_new) for p in PROMPTS]
    texts = [text(tok, s) for s in solo]
    stops = [texts[0][5:8], texts[3][9:11], "\n(\n(\n"]  # multi-token, one never hit
    d = {"perturbed": perturbed(llama), "ngram": "ngram", None: None}[draft]
    gen = Generator(llama, d, policy="constant", policy_options={"k": 3})
    res = gen.generate(PROMPTS, max_new_tokens=max_new, stop_strings=stops, tokenizer=tok)
    assert res.sequences == [cut(tok, s, stops) for s in solo]
    assert res.finish_reasons[0] == res.finish_reasons[3] == "stop"


def test_sampled_rows_end_at_the_token_completing_a_stop(llama, tok):
    max_new = 20
    gen = Generator(llama, perturbed(llama), policy="constant", policy_options={"k": 4})
    kw = dict(max_new_tokens=max_new, do_sample=True, temperature=1.5, seed=0)
    free = gen.generate(PROMPTS * 3, **kw).sequences
    stops = [text(tok, free[0])[4:7], text(tok, free[6])[10:13]]
    res = gen.generate(PROMPTS * 3, stop_strings=stops, tokenizer=tok, **kw)
    stopped = 0
    for seq, why in zip(res.sequences, res.finish_reasons, strict=True):
        if why == "stop":
            stopped += 1
            assert first_stop(tok, seq, stops) == len(seq)  # completed by its last token
        else:
            assert why == "length" and len(seq) == max_new
            assert first_stop(tok, seq, stops) is None
    assert stopped >= 2
    assert any(cut_mid_step(res, row, max_new) for row in range(len(res.sequences)))


def test_long_outputs_and_long_stop_strings(llama, tok):
    """The window slides over long rows; a stop string longer than many tokens."""
    max_new = 80
    solo = reference_greedy(llama, PROMPTS[1], max_new)
    t = text(tok, solo)
    stops = [t[len(t) - 40 : len(t) - 5]]  # ~35 characters near the end
    gen = Generator(llama, "ngram", policy="constant", policy_options={"k": 3})
    res = gen.generate([PROMPTS[1]], max_new_tokens=max_new, stop_strings=stops, tokenizer=tok)
    assert res.sequences[0] == cut(tok, solo, stops) and res.finish_reasons == ["stop"]


def test_finish_reasons(llama, tok):
    solo = [reference_greedy(llama, p, 12) for p in PROMPTS]
    eos = solo[0][4]
    gen = Generator(llama, "ngram")
    res = gen.generate(PROMPTS, max_new_tokens=12, eos_token_id=eos, stop_sequences=[solo[1][2:4]])
    assert res.finish_reasons[0] == "eos" and res.finish_reasons[1] == "stop"
    assert set(res.finish_reasons) <= {"eos", "stop", "length"}
    res = gen.generate(PROMPTS, max_new_tokens=40, time_budget=0.0)
    assert res.finish_reasons == ["time"] * len(PROMPTS)


def test_generate_text_cuts_before_the_stop_string(llama, tok):
    prompts = ["ab(", "#  a\nb"]
    ids = [tok(p)["input_ids"] for p in prompts]
    assert all(0 not in i for i in ids)  # every character is a piece
    solo = [reference_greedy(llama, i, 12) for i in ids]
    stop = text(tok, solo[0])[3:6]
    gen = Generator(llama, "ngram")
    got = gen.generate_text(prompts, tok, chat=False, max_new_tokens=12, stop_strings=[stop])
    for full, out in zip(solo, got):
        kept = text(tok, cut(tok, full, [stop]))
        assert out == cut_at_stop(kept, [stop]) and stop not in out
    assert got[0] == text(tok, solo[0])[: text(tok, solo[0]).find(stop)]


def test_generate_text_ends_rows_at_the_generation_configs_eos_too(llama, tok):
    """As transformers' generate: the model's generation_config eos ids (Gemma's
    <end_of_turn>) end rows besides the tokenizer's (bass.models.default_eos)."""
    from bass.models import default_eos

    prompts = ["ab(", "#  a\nb"]
    solo = [reference_greedy(llama, tok(p)["input_ids"], 12) for p in prompts]
    eos = solo[0][4]  # a token the first row reaches
    config, saved = llama.generation_config, llama.generation_config.eos_token_id
    config.eos_token_id = [eos, tok.eos_token_id, 10**6]  # one past the vocabulary: left out
    try:
        assert default_eos(tok, llama) == [tok.eos_token_id, eos]
        got = Generator(llama, "ngram").generate_text(prompts, tok, chat=False, max_new_tokens=12)
    finally:
        config.eos_token_id = saved
    for row, out in zip(solo, got):
        end = row.index(eos) + 1 if eos in row else len(row)
        assert out == text(tok, row[:end])
    config.eos_token_id = None
    try:
        assert default_eos(tok, llama) == tok.eos_token_id
    finally:
        config.eos_token_id = saved


def test_stop_string_errors(llama, tok):
    gen = Generator(llama, "ngram")
    with pytest.raises(ValueError, match=r"need a tokenizer.*tokenizer="):
        gen.generate(PROMPTS, max_new_tokens=2, stop_strings=["a"])
    with pytest.raises(ValueError, match="empty string"):
        gen.generate(PROMPTS, max_new_tokens=2, stop_strings=["a", ""], tokenizer=tok)
    with pytest.raises(ValueError, match="empty string"):
        gen.generate(PROMPTS, max_new_tokens=2, stop_strings="")
    # a lone surrogate (a command line's byte that is not UTF-8): no text holds it
    with pytest.raises(ValueError, match="not valid Unicode text"):
        gen.generate(PROMPTS, max_new_tokens=2, stop_strings=["a", "\udcff"], tokenizer=tok)
    with pytest.raises(TypeError, match="stop_sequences"):
        gen.generate(PROMPTS, max_new_tokens=2, stop_strings=[[3, 4]], tokenizer=tok)
    # no stop strings: no tokenizer needed; a single string is one stop string
    assert gen.generate(PROMPTS, max_new_tokens=2, stop_strings=[]).finish_reasons
    one = gen.generate(PROMPTS, max_new_tokens=2, stop_strings="ab", tokenizer=tok)
    assert len(one.sequences) == len(PROMPTS)


def test_humaneval_rows_stop_at_the_stop_sequences(llama, tok):
    """HumanEval passes its stop sequences to the engine: rows stop generating there
    (fewer tokens), and the samples are what cutting the full output would give."""
    from bass import humaneval

    gen = Generator(llama, "ngram", policy="constant", policy_options={"k": 3})
    sample = humaneval.make_sampler(gen, tok, max_new_tokens=40)
    prompts = ["a(", "a a", "ab"]  # "\n#" after 13 and 4 tokens; never
    done = []
    problems = [{"prompt": p, "task_id": f"T/{i}"} for i, p in enumerate(prompts)]
    got, stats = sample(problems, 2, lambda i, samples: done.append(i))
    stopped = tokens = 0
    for prompt, samples in zip(prompts, got):  # one call, three problems
        full = reference_greedy(llama, tok(prompt)["input_ids"], 40)
        j = first_stop(tok, full, humaneval.STOP_SEQUENCES)
        completion, _ = humaneval.truncate(text(tok, full))
        assert samples == [humaneval.Sample(completion, j or 40, j is not None)] * 2
        tokens += 2 * (j or 40)
        stopped += j is not None
    assert stopped == 2 and stats.tokens_generated == tokens
    assert sorted(done) == [0, 1, 2] and done[-1] == 2  # the longest finishes last
    with pytest.raises(humaneval.HumanEvalError, match="'T/0' is given twice"):
        sample(problems[:1] * 2, 1)


@pytest.mark.parametrize("name", sorted(TOKENIZERS))
def test_new_tokens_are_decoded_after_their_prompt(name):
    """A row's text is what its tokens add to its prompt's text (as transformers'
    pipelines and vLLM give it): decoded alone, a SentencePiece-like tokenizer drops the
    first token's leading space (a code body's first indent)."""
    tok = TOKENIZERS[name]()
    rng = random.Random(0)
    compared = 0
    for _ in range(300):
        prompt = [rng.randrange(3, len(tok)) for _ in range(rng.randint(1, 12))]
        ids = [rng.randrange(3, len(tok)) for _ in range(rng.randint(0, 8))]
        whole, before = text(tok, prompt + ids), text(tok, prompt)
        if whole.startswith(before):  # else: a character cut between the two
            assert decode_after(tok, prompt, ids) == whole[len(before) :]
            compared += 1
    assert compared > 200
    if name == "metaspace":
        spaced = next(i for i in range(3, len(tok)) if tok.convert_ids_to_tokens(i)[0] == "\u2581")
        assert decode_after(tok, [spaced], [spaced]).startswith(" ")
        assert not text(tok, [spaced]).startswith(" ")  # what decoding it alone gave
        res = GenerationResult([[spaced]], GenerationStats(), ["length"])
        assert decode_rows(tok, res, None, [[spaced]])[0].startswith(" ")


def test_a_stop_string_holding_a_special_token_is_refused(llama, tok):
    """Text is decoded with special tokens skipped, so ``</s>`` (or ``<|im_end|>``) in a
    stop string could never match: refused, naming the token and its id to stop on."""
    gen = Generator(llama, "ngram")
    for stop in ("</s>", "x</s>"):
        with pytest.raises(OptionError, match=r"stop_strings '.*</s>' holds the special token "
                           r"'</s>'.*stop on its id \(2\)"):  # fmt: skip
            gen.generate([[5, 6]], max_new_tokens=2, stop_strings=[stop], tokenizer=tok)
    gen.generate([[5, 6]], max_new_tokens=2, stop_strings=["s>"], tokenizer=tok)  # plain text


def test_a_stop_string_at_a_rows_first_token_sees_its_prompt(llama):
    """A SentencePiece-like tokenizer drops a text's leading space when it decodes alone:
    a stop string starting with the space a row's first new token brings (after the
    prompt) ends the row at that token, as in the row's text."""
    tok = _TOK.setdefault("metaspace", metaspace_tokenizer())
    prompts = [[i, 3 + (7 * i) % 60] for i in range(3, 40)]
    solo = {tuple(p): reference_greedy(llama, p, 6) for p in prompts}
    hits = [
        (p, first[:2])
        for p in prompts
        if (first := decode_after(tok, p, solo[tuple(p)][:1])).startswith(" ") and len(first) > 1
    ][:4]
    assert hits, "no prompt whose first new token brings a space"
    gen = Generator(llama, "ngram")
    for prompt, stop in hits:
        assert not text(tok, solo[tuple(prompt)]).startswith(stop)  # decoded alone: no space
        res = gen.generate([prompt], max_new_tokens=6, stop_strings=[stop], tokenizer=tok)
        assert res.sequences[0] == solo[tuple(prompt)][:1] and res.finish_reasons == ["stop"]


def test_the_matcher_keeps_no_finished_rows_text(llama, tok):
    """A row's stop-string window is dropped when it ends (eos, length, a stop): a long
    stream keeps one per running row, not one per row handed over."""
    kept = []

    def on_step(gen, state):
        kept.append(len(state.texts.rows))

    prompts = [[3 + i % 50, 4] for i in range(40)]
    rows = Generator(llama, "ngram").stream(
        prompts, max_new_tokens=8, max_rows=3, stop_strings=["\x00never"], tokenizer=tok,
        on_step=on_step,
    )  # fmt: skip
    assert len(list(rows)) == 40 and max(kept) <= 3
