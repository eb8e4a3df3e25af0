"""Text stop strings: end a row once the decoded text of its new tokens contains one
(:meth:`bass.Generator.generate`'s ``stop_strings``; how: docs/concepts/exactness.md).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["StopStrings", "cut_at_stop", "decode", "decode_after", "decode_rows"]


def _as_list(stop_strings: str | Sequence[str]) -> list[str]:
    stops = [stop_strings] if isinstance(stop_strings, str) else list(stop_strings)
    for s in stops:
        if not isinstance(s, str):
            raise TypeError(
                f"stop_strings must be strings (token ids go in stop_sequences), got {s!r}"
            )
        if not s:
            raise ValueError("stop_strings must not contain an empty string")
    return stops


def cut_at_stop(text: str, stop_strings: str | Sequence[str]) -> str:
    """``text`` up to (not including) the first occurrence of any of ``stop_strings``;
    all of ``text`` when none occurs.

    >>> cut_at_stop("x = 1\\n\\ndef g():", ["\\ndef", "\\n#"])
    'x = 1\\n'
    """
    hits = [i for s in _as_list(stop_strings) if (i := text.find(s)) >= 0]
    return text[: min(hits)] if hits else text


class StopStrings:
    """Stop-string matching for the rows of one generation (state per row).

    Args:
        stop_strings: a string or a list of non-empty strings.
        tokenizer: anything with ``decode(ids, skip_special_tokens=True) -> str`` (a
            transformers tokenizer); the text is decoded as :meth:`bass.Generator.
            generate_text` decodes it, special tokens skipped.
    """

    def __init__(self, stop_strings: str | Sequence[str], tokenizer):
        self.stops = tuple(dict.fromkeys(_as_list(stop_strings)))
        if self.stops and tokenizer is None:
            raise ValueError(
                "stop_strings need a tokenizer to decode the generated tokens: pass "
                "tokenizer=... to generate() (generate_text passes its own), or give token "
                "ids as stop_sequences"
            )
        self.tokenizer = tokenizer
        longest = max((len(s) for s in self.stops), default=0)
        # Characters of old text kept before the new tokens: a stop string ending in the
        # new text starts at most longest - 1 characters back; the margin covers a
        # window that begins with a dropped leading space or the stray bytes of a
        # character split across tokens (decoded as up to 3 U+FFFD).
        self.min_chars = longest + 4
        self.context = longest + 8  # tokens kept when the window slides (grown if short)
        self.rows: dict[int, tuple[int, str]] = {}  # row key -> (window start, its text)

    def _hit(self, text: str, old: int) -> bool:
        """Does a stop string end in ``text`` after its first ``old`` characters?"""
        return any(text.find(s, max(0, old - len(s) + 1)) >= 0 for s in self.stops)

    def check(self, key: int, out: list[int], n_new: int, prompt: Sequence[int] = ()) -> int | None:
        """Row ``key``'s new tokens are ``out``, the last ``n_new`` of them appended since
        its previous check (``prompt``: the row's prompt ids, or its last few: the first
        window is decoded after them, :func:`decode_after`, as the row's text is). Returns
        how many of those ``n_new`` to keep when one of them completes a stop string (the
        row ends with that token), else ``None``."""
        if n_new <= 0:
            return None
        old_end = len(out) - n_new
        start, prev = self.rows.get(key, (0, ""))  # prev: the text of out[start:old_end]

        def window(end: int | None = None) -> str:  # out[start:end]'s text
            head = prompt[-CONTEXT_TOKENS:] if start == 0 else ()
            return decode_after(self.tokenizer, head, out[start:end])

        text = window()
        old = len(prev)  # text before `old` is not new
        if not text.startswith(prev):  # prev's tail decodes differently now: their common part
            old = next((i for i, (a, b) in enumerate(zip(prev, text)) if a != b), len(text))
        if self._hit(text, old):
            self.rows.pop(key, None)
            for j in range(1, n_new):  # the first token whose text completes a stop
                if self._hit(window(old_end + j), old):
                    return j
            return n_new
        if len(out) - start > 2 * self.context:  # slide the window forward
            start = len(out) - self.context
            text = window()
            while start > 0 and len(text) < self.min_chars:  # tokens of little text
                start = max(0, start - self.context)
                text = window()
        self.rows[key] = (start, text)
        return None


def decode_rows(tokenizer, result, stop_strings, prompts=None) -> list[str]:
    """Each row of ``result`` (a :class:`bass.GenerationResult`) as text: its new tokens
    decoded after its prompt (:func:`decode_after`; ``prompts``: each row's prompt ids,
    ``None``: the tokens alone), special tokens skipped, and, for a row a stop string
    ended, cut right before the stop string (as vLLM's default)."""
    out = []
    prompts = [()] * len(result.sequences) if prompts is None else prompts
    for seq, why, prompt in zip(result.sequences, result.finish_reasons, prompts, strict=True):
        text = decode_after(tokenizer, prompt, seq)
        out.append(cut_at_stop(text, stop_strings) if stop_strings and why == "stop" else text)
    return out


#: Prompt tokens decoded before the new ones (:func:`decode_after`).
CONTEXT_TOKENS = 8


def decode_after(tokenizer, prompt: Sequence[int], ids: Sequence[int]) -> str:
    """The text ``ids`` add to ``prompt``'s: the new tokens decoded after the prompt's last
    few and that prefix's text removed, as transformers' pipelines and vLLM give it.
    Decoded alone, a text loses what its first token means only after others: SentencePiece
    tokenizers (Llama, Mistral, Phi-3) drop its leading space, the indentation of a code
    body's first line. Where the prefix's text does not start the whole (a character cut
    between prompt and new tokens), the new tokens alone."""
    if not prompt:
        return decode(tokenizer, list(ids))
    head = list(prompt[-CONTEXT_TOKENS:])
    before = decode(tokenizer, head)
    both = decode(tokenizer, head + list(ids))
    return both[len(before) :] if both.startswith(before) else decode(tokenizer, list(ids))


def decode(tokenizer, ids: list[int]) -> str:
    """``tokenizer.decode(ids, skip_special_tokens=True)``, which must be text: anything
    else (a tokenizer of another kind, a mock) is refused naming what it returned."""
    text = tokenizer.decode(ids, skip_special_tokens=True)
    if not isinstance(text, str):
        raise TypeError(
            f"tokenizer.decode returned {type(text).__name__} ({text!r:.60}), not text: pass a "
            f"tokenizer whose decode(ids, skip_special_tokens=True) returns a str (a "
            f"transformers tokenizer; {type(tokenizer).__name__} is not one)"
        )
    return text
