"""The value kinds of :mod:`bass.options`: one parser per kind of value (integers, ranges,
token ids, stop strings and sequences, choices among what is installed, models and
tokenizers). Each takes ``(value, ctx)`` and returns the value normalised, or raises
:class:`Refused`; :mod:`bass.options` pairs them with what each option allows (its
messages). Private to bass: the names are bass.options' building blocks."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from numbers import Integral, Real
from typing import Any

import numpy as np

__all__ = ["DTYPES", "Refused", "show"]


class Refused(Exception):
    """Raised by a parser: the value is not allowed (``why``: a detail for the message)."""

    def __init__(self, why: str = ""):
        super().__init__(why)
        self.why = why


def show(value: Any, limit: int = 80) -> str:
    """``repr(value)`` on one line, cut to about ``limit`` characters."""
    text = " ".join(repr(value).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --------------------------------------------------------------------------- value kinds


def _is_bool(v: Any) -> bool:
    return isinstance(v, (bool, np.bool_))


def _int(v: Any) -> int:
    """An integer (numpy's too), never a bool (``True`` for 1 is always a mistake)."""
    if _is_bool(v) or not isinstance(v, Integral):
        raise Refused()
    return int(v)


def _number(v: Any) -> float:
    """A finite real number (int, float, numpy's), never a bool."""
    if _is_bool(v) or not isinstance(v, Real):
        raise Refused()
    try:
        f = float(v)
    except OverflowError:  # an int past float's range (10**400)
        raise Refused("too large for a float") from None
    if not math.isfinite(f):
        raise Refused()
    return f


def _bool(v: Any) -> bool:
    if _is_bool(v):
        return bool(v)
    raise Refused()


def _satisfying(kind: Callable[[Any], Any], ok: Callable[[Any], bool]) -> Callable:
    """A parser of ``kind``'s values (:func:`_int`, :func:`_number`) for which ``ok``
    holds."""

    def parse(v: Any, ctx: Mapping) -> Any:
        v = kind(v)
        if not ok(v):
            raise Refused()
        return v

    return parse


def _ints(ok: Callable[[int], bool]) -> Callable[[Any, Mapping], int]:
    """A parser of integers for which ``ok`` holds."""
    return _satisfying(_int, ok)


def _numbers(ok: Callable[[float], bool]) -> Callable[[Any, Mapping], float]:
    """A parser of finite numbers (as floats) for which ``ok`` holds."""
    return _satisfying(_number, ok)


def _ids(v: Any) -> list | None:
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
    t = _int(t)
    vocab = ctx.get("vocab")
    if t < 0 or (vocab is not None and t >= vocab):
        raise Refused(f"token id {t} is outside the vocabulary" if t >= 0 else "")
    return t


def _id_range(ctx: Mapping) -> str:
    vocab = ctx.get("vocab")
    return "a token id >= 0" if vocab is None else f"a token id in [0, {vocab})"


# --------------------------------------------------------------------------- parsers


def _eos(v: Any, ctx: Mapping) -> int | list[int]:
    ids = _ids(v)
    if ids is None:
        if hasattr(v, "ndim"):  # a 0-d tensor or array: its one id
            v = v.item()
        return _token(v, ctx)
    if not ids:
        raise Refused("an empty list stops nothing (leave it out for no eos)")
    return [_token(t, ctx) for t in ids]


def _stop_strings(v: Any, ctx: Mapping) -> list[str]:
    stops = [v] if isinstance(v, str) else v
    if not isinstance(stops, (list, tuple)):
        raise Refused()
    for s in stops:
        if not isinstance(s, str):
            raise Refused("token ids go in stop_sequences" if _is_ids(s) else "")
        if not s:
            raise Refused("an empty string would stop every row at once")
    return list(stops)


def _is_ids(v: Any) -> bool:
    try:
        ids = _ids(v)
    except Refused:
        return False
    return isinstance(v, Integral) or (
        ids is not None and all(isinstance(t, Integral) for t in ids)
    )


def _stop_sequences(v: Any, ctx: Mapping) -> list[tuple[int, ...]]:
    seqs = _ids(v)
    if seqs is None:
        raise Refused()
    if seqs and all(isinstance(t, Integral) for t in seqs):
        raise Refused(f"for one stop sequence pass [{show(list(seqs), 40)}]")
    out = []
    for seq in seqs:
        ids = _ids(seq)
        if ids is None:
            raise Refused(f"{show(seq, 30)} is not a list of token ids")
        if not ids:
            raise Refused("an empty sequence would stop every row at once")
        out.append(tuple(_token(t, ctx) for t in ids))
    return out


def _tokenizer(v: Any, ctx: Mapping) -> Any:
    if not callable(getattr(v, "decode", None)):
        raise Refused()
    return v


def _text_tokenizer(v: Any, ctx: Mapping) -> Any:
    if not callable(v) or not callable(getattr(v, "decode", None)):
        raise Refused()
    return v


def _callable(v: Any, ctx: Mapping) -> Any:
    if not callable(v):
        raise Refused()
    return v


def _one_of(choices: Callable[[], Sequence[str]]) -> Callable[[Any, Mapping], str]:
    def parse(v: Any, ctx: Mapping) -> str:
        if not isinstance(v, str) or v not in choices():
            raise Refused()
        return v

    return parse


def _attention_choices() -> list[str]:
    from .ops import packed

    return ["auto", *packed.packed_implementations()]


def _cpu_linear_choices() -> Sequence[str]:
    from .cpu_linear import MODES

    return MODES


DTYPES = ("float32", "float16", "bfloat16", "float64")


def _backends() -> list[str]:
    import torch

    return torch._dynamo.list_backends(exclude_tags=())


def _compile(v: Any, ctx: Mapping) -> Any:
    if _is_bool(v):
        return bool(v)
    if isinstance(v, str):
        if v == "reduce-overhead":
            return v
        if v in _backends():
            return v
        raise Refused()
    if callable(v) and ctx.get("source") == "keyword":  # a backend function (the API only)
        return v
    raise Refused()


def _source(v: Any, ctx: Mapping) -> str:
    if not isinstance(v, (str, os.PathLike)) or not str(v).strip():
        raise Refused()
    return str(v).strip()


def _installed_policies() -> list[str]:
    from . import policies

    return list(policies.available())


def _policy(v: Any, ctx: Mapping) -> Any:
    if isinstance(v, str):
        if v not in _installed_policies():
            raise Refused()
        return v
    if ctx.get("source") == "keyword":  # a policy object (the API only)
        from .policies import DraftLengthPolicy

        if isinstance(v, type):
            raise Refused(f"{v.__name__} is a class: pass an instance, {v.__name__}(...)")
        if isinstance(v, DraftLengthPolicy):
            return v
    raise Refused()


def _policy_text(ctx: Mapping) -> str:
    names = ", ".join(_installed_policies()) or "(none installed)"
    text = f"an installed policy: {names} (see `bass policies`)"
    if ctx.get("source") == "keyword":
        text += ", or a policy object with draft_length() and update(stats)"
    return text


def _policy_options(v: Any, ctx: Mapping) -> dict:
    if not isinstance(v, Mapping) or not all(isinstance(k, str) for k in v):
        raise Refused()
    # numpy's scalars as Python's (the policy checks each option's type and range)
    return {k: x.item() if isinstance(x, np.generic) else x for k, x in v.items()}


def _main_model(v: Any, ctx: Mapping) -> Any:
    from transformers import PreTrainedModel

    from .hf import check_loaded

    if isinstance(v, PreTrainedModel) or isinstance(getattr(v, "_orig_mod", None), PreTrainedModel):
        try:
            check_loaded(v, "main")
        except (TypeError, ValueError) as exc:
            raise Refused(str(exc)) from None
        return v
    if v is None or isinstance(v, (str, os.PathLike)):
        raise Refused(
            "to load a model by name, directory or .gguf file use "
            "Generator.from_pretrained(main, draft)"
        )
    raise Refused(f"got a {type(v).__name__}")


def _texts(v: Any, ctx: Mapping) -> list[str]:
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
        try:
            t.encode("utf-8")
        except UnicodeEncodeError as exc:  # a lone surrogate: no tokenizer can take it
            raise Refused(
                f"text {i} is not valid Unicode ({show(t[exc.start : exc.end])} at character "
                f"{exc.start}: a lone surrogate, e.g. from undecodable bytes)"
            ) from None
    return list(v)


def _config(v: Any, ctx: Mapping) -> Any:
    from .config import Config

    if isinstance(v, (str, os.PathLike, Config, dict)):
        return v
    raise Refused()
