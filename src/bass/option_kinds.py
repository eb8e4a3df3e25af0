"""Declaring an option once (:class:`Option`: its kind of value, default, doc, config key
and flag), and refusing a value in the option's words: :mod:`bass.options` declares
bass's options with these, a policy's :func:`~bass.policies.base.option` its bound as a
:class:`Range`. A core module: it imports nothing of bass but :mod:`bass.errors`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any

import numpy as np

from .errors import OptionError

__all__ = ["BOOL", "DTYPES", "Choice", "Kind", "Option", "Range", "Refused", "Value", "show"]

#: The model dtypes a config file, a flag or ``from_pretrained`` may name.
DTYPES = ("float32", "float16", "bfloat16", "float64")


class Refused(Exception):
    """Raised by a kind's ``parse``: the value is not allowed (its text, if any: a detail
    for the message)."""


def show(value: Any, limit: int = 80) -> str:
    """``repr(value)`` on one line, cut to about ``limit`` characters; a module (whose
    repr lists its layers) by its type."""
    text = repr(value)
    if "\n" in text and callable(getattr(value, "named_modules", None)):
        return f"<{type(value).__name__}>"
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def show_toml(value: Any) -> str:
    """:func:`show`, with booleans as TOML spells them (``true``, not ``True``)."""
    return str(value).lower() if isinstance(value, bool) else show(value)


# --------------------------------------------------------------------------- kinds
# A kind has ``parse(value, ctx)``: the value normalised, or Refused; ``allowed(ctx)``: what
# is allowed, in a phrase; ``type``: a value's type when it comes as text (a flag). ``ctx``
# holds what a check needs: ``source`` ("keyword": the API, else "config"), ``vocab`` (the
# main model's logit count), ``values`` (the other options', for a bound that names one),
# ``docs`` (true: a phrase that does not depend on what this machine has installed).


def as_int(v: Any) -> int:
    """An integer (numpy's too), never a bool (``True`` for 1 is always a mistake)."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, Integral):
        raise Refused()
    return int(v)


@dataclass(frozen=True)
class Range:
    """An ``int`` or a finite ``float`` within bounds (included; ``low`` excluded with
    ``low_open``): numbers, or the name of another option (``high="l_limit"``: its value in
    ``ctx["values"]``); ``optional`` allows ``None``. The phrase is ``text``, or made from
    the bounds (``an integer >= 1``, ``an int in [1, l_limit=32]``: ``noun`` is
    ``an integer``/``a finite number`` unless given)."""

    type: type = int
    low: float | str | None = None
    high: float | str | None = None
    low_open: bool = False
    optional: bool = False
    noun: str | None = None
    text: str | None = None

    def convert(self, v: Any) -> Any:
        """``v`` as this range's type (a float: finite; never a bool), bounds unchecked (or
        :class:`Refused`)."""
        if v is None and self.optional:
            return None
        if self.type is int:
            return as_int(v)
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, Real):
            raise Refused()
        try:
            v = float(v)
        except OverflowError:  # an int past float's range (10**400)
            raise Refused("too large for a float") from None
        if not math.isfinite(v):
            raise Refused()
        return v

    def names_another(self) -> bool:
        return isinstance(self.low, str) or isinstance(self.high, str)

    def within(self, v: Any, ctx: Mapping[str, Any]) -> bool:
        if v is None:  # optional, and left out
            return True
        values = ctx.get("values", {})
        low, high = (values.get(b) if isinstance(b, str) else b for b in (self.low, self.high))
        too_low = low is not None and (v <= low if self.low_open else v < low)
        return not (too_low or (high is not None and v > high))

    def parse(self, v: Any, ctx: Mapping[str, Any]) -> Any:
        v = self.convert(v)
        if not self.within(v, ctx):
            raise Refused()
        return v

    def allowed(self, ctx: Mapping[str, Any]) -> str:
        if self.text is not None:
            return self.text
        values = ctx.get("values", {})
        low, high = (f"{b}={values[b]!r}" if b in values else str(b) for b in (self.low, self.high))
        noun = self.noun or ("an integer" if self.type is int else "a finite number")
        if self.low is not None and self.high is not None:
            text = f"{noun} in {'(' if self.low_open else '['}{low}, {high}]"
        elif self.low is not None:
            text = f"{noun} {'>' if self.low_open else '>='} {low}"
        elif self.high is not None:
            text = f"{noun} <= {high}"
        else:
            text = noun
        return text + (" or None" if self.optional else "")


@dataclass(frozen=True)
class Choice:
    """One of some names: fixed (a tuple) or what is available here (a function; ``docs``
    then says it without this machine's list); ``note`` follows the list."""

    choices: tuple[str, ...] | Callable[[], Sequence[str]] = ()
    note: str = ""
    docs: str = ""
    type: type = str

    def parse(self, v: Any, ctx: Mapping[str, Any]) -> str:
        names = self.choices() if callable(self.choices) else self.choices
        if not isinstance(v, str) or v not in names:
            raise Refused()
        return v

    def allowed(self, ctx: Mapping[str, Any]) -> str:
        if ctx.get("docs") and self.docs:
            return self.docs
        names = self.choices() if callable(self.choices) else self.choices
        return f"one of {', '.join(names)}" + (f" ({self.note})" if self.note else "")


@dataclass(frozen=True)
class Value:
    """Any other kind: ``parse(value, ctx)`` normalises or raises :class:`Refused`; ``text``
    is the phrase (or a function of ``ctx`` that makes it)."""

    parse: Callable[[Any, Mapping[str, Any]], Any]
    text: str | Callable[[Mapping[str, Any]], str]
    type: type | None = None

    def allowed(self, ctx: Mapping[str, Any]) -> str:
        return self.text(ctx) if callable(self.text) else self.text


def _bool(v: Any, ctx: Mapping) -> bool:
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    raise Refused()


#: ``True`` or ``False`` (numpy's too); nothing else stands for one.
BOOL = Value(_bool, "a bool: true or false", bool)

Kind = Range | Choice | Value


# --------------------------------------------------------------------------- the option


@dataclass(frozen=True)
class Option:
    """One option, declared once: ``name`` (its keyword in ``call``, unless ``keyword``
    says otherwise), ``kind``, ``doc`` (one line, for the API, the file, the flags and the
    docs alike), ``default`` (its value when left out of a config file or the flags),
    ``absent`` (what ``None`` or leaving it out means, in words; ``None``: the API requires
    it) and ``absent_config`` where a file differs, ``table``/``key`` (its place in a config
    file; ``key`` defaults to the keyword), ``flag``/``metavar`` (on the command line)."""

    name: str
    kind: Kind
    doc: str
    call: str = ""
    default: Any = None
    absent: str | None = None
    absent_config: str | None = None
    table: str | None = None
    key: str | None = None
    flag: str | None = None
    metavar: str | None = None
    keyword: str | None = None

    @property
    def said(self) -> str:
        """The keyword the API spells it with."""
        return self.keyword or self.name

    @property
    def config_key(self) -> str | None:
        """``table.key`` in a config file, or ``None``."""
        return None if self.table is None else f"{self.table}.{self.key or self.said}"

    def check(
        self,
        value: Any,
        *,
        where: str = "",
        label: str | None = None,
        error: type[OptionError] = OptionError,
        **ctx: Any,
    ) -> Any:
        """``value`` normalised, or ``error`` (:class:`~bass.errors.OptionError`) naming
        it as ``label`` spells it (``None``: the keyword argument, ``seed=-1``; else a
        config key, ``[generation].seed``, or a flag, ``--seed``) after ``where``
        (``"generate()"``, a file name, ``"command line"``)."""
        ctx = {"source": "keyword" if label is None else "config", **ctx}
        try:
            return self.kind.parse(value, ctx)
        except Refused as refused:
            allowed = self.kind.allowed(ctx)
            absent = self.absent if label is None else (self.absent_config or self.absent)
            if absent is not None:
                allowed += (
                    f", or None ({absent})" if label is None else f" (leave it out: {absent})"
                )
            allowed += f"; {refused}" if str(refused) else ""
            raise refusal(
                self.said, value, allowed, where=where, label=label, error=error, option=self.name
            ) from None


def refusal(
    name: str,
    value: Any,
    allowed: str,
    *,
    where: str = "",
    label: str | None = None,
    error: type[OptionError] = OptionError,
    option: str | None = None,
) -> OptionError:
    """The error for a value that is not allowed: ``where: name=value`` (a keyword) or
    ``where: label = value`` (a config key or a flag), ``is not allowed; expected`` what is
    (``option``: the option's name where the keyword differs)."""
    if label is None:
        text = f"{name}={show(value)}"
    else:  # a config key's ("[table].key") as its file spells it
        text = f"{label} = {show_toml(value) if label[:1] == '[' else show(value)}"
    text = f"{where}: {text}" if where else text
    message = f"{text} is not allowed; expected {allowed}"
    return error(message, option=option or name, value=value, allowed=allowed)


# --------------------------------------------------------------------------- values


def ids(v: Any) -> list | None:
    """``v`` as a list when it is a 1-D sequence of ids (a list, a tuple, a 1-D tensor or
    array), ``None`` when it is not a sequence at all. Strings are refused."""
    if isinstance(v, (str, bytes)):
        raise Refused("a string is text, not token ids")
    if hasattr(v, "ndim") and hasattr(v, "tolist"):  # a tensor or an array
        if v.ndim == 0:
            return None
        if v.ndim != 1:
            raise Refused(f"a {v.ndim}-D {type(v).__name__}")
        return v.tolist()
    if isinstance(v, (list, tuple)):
        return list(v)
    return None


def _token(t: Any, ctx: Mapping) -> int:
    t = as_int(t)
    vocab = ctx.get("vocab")
    if t < 0 or (vocab is not None and t >= vocab):
        raise Refused(f"token id {t} is outside the vocabulary" if t >= 0 else "")
    return t


def id_range(ctx: Mapping) -> str:
    vocab = ctx.get("vocab")
    return "a token id >= 0" if vocab is None else f"a token id in [0, {vocab})"


def eos(v: Any, ctx: Mapping) -> int | list[int]:
    found = ids(v)
    if found is None:
        if hasattr(v, "ndim"):  # a 0-d tensor or array: its one id
            v = v.item()
        return _token(v, ctx)
    if not found:
        raise Refused("an empty list stops nothing")
    return [_token(t, ctx) for t in found]


def _is_ids(v: Any) -> bool:
    try:
        found = ids(v)
    except Refused:
        return False
    return all(isinstance(t, Integral) for t in ([v] if found is None else found))


def stop_strings(v: Any, ctx: Mapping) -> list[str]:
    stops = [v] if isinstance(v, str) else v
    if not isinstance(stops, (list, tuple)):
        raise Refused()
    for s in stops:
        if not isinstance(s, str):
            raise Refused("token ids go in stop_sequences" if _is_ids(s) else "")
        if not s:
            raise Refused("an empty string would stop every row at once")
        _unicode(s, show(s, 30), "; no decoded text holds it: it could never match")
    return list(stops)


def stop_sequences(v: Any, ctx: Mapping) -> list[tuple[int, ...]]:
    seqs = ids(v)
    if seqs is None:
        raise Refused()
    if seqs and all(isinstance(t, Integral) for t in seqs):
        raise Refused(f"for one stop sequence pass [{show(list(seqs), 40)}]")
    out = []
    for seq in seqs:
        found = ids(seq)
        if found is None:
            raise Refused(f"{show(seq, 30)} is not a list of token ids")
        if not found:
            raise Refused("an empty sequence would stop every row at once")
        out.append(tuple(_token(t, ctx) for t in found))
    return out


def texts(v: Any, ctx: Mapping) -> list[str]:
    if isinstance(v, str):
        raise Refused("for one text pass [text]")
    if not isinstance(v, (list, tuple)):
        raise Refused()
    if not v:
        raise Refused("no texts: pass at least one")
    bad = [t for t in v if not isinstance(t, str)]
    if bad:
        raise Refused(f"{show(bad[0], 30)} is not a string (token ids go to generate())")
    for i, t in enumerate(v):
        if not t.strip():  # (as bass generate refuses it; a chat template would wrap it)
            raise Refused(f"text {i} is empty: every text needs some text")
        _unicode(t, f"text {i}")  # no tokenizer can take a lone surrogate
    return list(v)


def _unicode(text: str, what: str, why: str = "") -> None:
    """:class:`Refused` where ``text`` holds a lone surrogate (a byte that was not UTF-8,
    decoded with ``surrogateescape``, or ``"\\ud800"`` written out)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise Refused(
            f"{what} is not valid Unicode text ({show(text[exc.start : exc.end])} at character "
            f"{exc.start}: a lone surrogate, e.g. from undecodable bytes{why})"
        ) from None


def has(*methods: str, call: bool = False) -> Callable[[Any, Mapping], Any]:
    """A check that ``v`` has callable ``methods`` (and is callable itself, ``call``)."""

    def check(v: Any, ctx: Mapping) -> Any:
        if (call and not callable(v)) or not all(callable(getattr(v, m, None)) for m in methods):
            raise Refused()
        return v

    return check


def source(v: Any, ctx: Mapping) -> str:
    """A model's name, directory or file (a path), stripped."""
    if not isinstance(v, (str, os.PathLike)) or not str(v).strip():
        raise Refused()
    return str(v).strip()


def table(v: Any, ctx: Mapping) -> dict:
    """A mapping of option names to values, numpy's scalars as Python's."""
    if not isinstance(v, Mapping) or not all(isinstance(k, str) for k in v):
        raise Refused()
    return {k: x.item() if isinstance(x, np.generic) else x for k, x in v.items()}
