"""One validator per option: the Python API, the config file and the command line check a
value the same way, before any work.

Every option bass takes from a user (the keywords of :class:`bass.Generator`,
:meth:`~bass.Generator.generate` and :meth:`~bass.Generator.generate_text`, the keys of a
config file, the ``bass`` flags that set them) is an :class:`Option` here: its name, what is
allowed (a phrase), what leaving it out means, and a function that returns the value
normalised (numpy integers as ``int``, a single stop string as a list...) or refuses it.
A refused value raises :class:`OptionError` (a ``TypeError`` and a ``ValueError``) naming
the option as its source spells it, the value, and what is allowed::

    generate(): seed=-1 is not allowed; expected an integer >= 0 and < 2**63, or None (a seed drawn from torch's global generator)
    bass.toml: [generation].seed = -1 is not allowed; expected an integer >= 0 and < 2**63 (leave it out: a seed drawn from torch's global generator)
    command line: --seed = -1 is not allowed; expected an integer >= 0 and < 2**63 (...)

:func:`check` validates one value; :func:`generation_kwargs` the arguments of a ``generate``
call (with the checks between options: ``temperature > 0`` when sampling, stop strings
need a tokenizer, token ids within the vocabulary).
"""  # noqa: E501

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any

import numpy as np

__all__ = [
    "GENERATE",
    "OPTIONS",
    "SAMPLING_TEMPERATURE",
    "Option",
    "OptionError",
    "check",
    "check_keywords",
    "fail",
    "generation_kwargs",
    "show",
]

#: What ``temperature`` must be when sampling (a check between two options).
SAMPLING_TEMPERATURE = "a number > 0 when do_sample is true (do_sample = false is greedy decoding)"


class OptionError(TypeError, ValueError):
    """A value an option does not allow (a wrong type or a value out of range: both a
    ``TypeError`` and a ``ValueError``); the message names the option, the value and what
    is allowed. ``option`` and ``value`` are kept on the exception."""

    def __init__(self, message: str, *, option: str | None = None, value: Any = None):
        super().__init__(message)
        self.option, self.value = option, value


class _Refused(Exception):
    """Raised by a parser: the value is not allowed (``why``: a detail for the message)."""

    def __init__(self, why: str = ""):
        super().__init__(why)
        self.why = why


@dataclass(frozen=True)
class Option:
    """An option: ``parse(value, ctx)`` returns it normalised or raises :class:`_Refused`;
    ``allowed(ctx)`` says what is allowed; ``absent`` what ``None`` (the API) or leaving
    it out (a file, the command line) means, or ``None`` where it is required;
    ``absent_config`` when that differs in a config file; ``keyword`` the keyword
    argument's name when two options share one (``generate_text``'s ``tokenizer``)."""

    name: str
    parse: Callable[[Any, Mapping[str, Any]], Any]
    allowed: str | Callable[[Mapping[str, Any]], str]
    absent: str | None = None
    absent_config: str | None = None
    keyword: str | None = None  # the keyword's name where it differs from ``name``

    def allowed_text(self, ctx: Mapping[str, Any]) -> str:
        return self.allowed(ctx) if callable(self.allowed) else self.allowed


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
        raise _Refused()
    return int(v)


def _number(v: Any) -> float:
    """A finite real number (int, float, numpy's), never a bool."""
    if _is_bool(v) or not isinstance(v, Real):
        raise _Refused()
    if not math.isfinite(v):
        raise _Refused()
    return float(v)


def _bool(v: Any) -> bool:
    if _is_bool(v):
        return bool(v)
    raise _Refused()


def _ints(ok: Callable[[int], bool]) -> Callable[[Any, Mapping], int]:
    """A parser of integers for which ``ok`` holds."""

    def parse(v: Any, ctx: Mapping) -> int:
        v = _int(v)
        if not ok(v):
            raise _Refused()
        return v

    return parse


def _numbers(ok: Callable[[float], bool]) -> Callable[[Any, Mapping], float]:
    """A parser of finite numbers (as floats) for which ``ok`` holds."""

    def parse(v: Any, ctx: Mapping) -> float:
        v = _number(v)
        if not ok(v):
            raise _Refused()
        return v

    return parse


def _ids(v: Any) -> list | None:
    """``v`` as a list when it is a 1-D sequence of ids (a list, a tuple, a 1-D tensor or
    array), ``None`` when it is not a sequence at all. Strings are refused."""
    if isinstance(v, (str, bytes)):
        raise _Refused("a string is text, not token ids")
    if hasattr(v, "ndim") and hasattr(v, "tolist"):  # a tensor or an array
        if v.ndim == 0:
            return None
        if v.ndim != 1:
            raise _Refused(f"a {v.ndim}-D {type(v).__name__}")
        return v.tolist()
    if isinstance(v, (list, tuple)):
        return list(v)
    return None


def _token(t: Any, ctx: Mapping) -> int:
    t = _int(t)
    vocab = ctx.get("vocab")
    if t < 0 or (vocab is not None and t >= vocab):
        raise _Refused(f"token id {t} is outside the vocabulary" if t >= 0 else "")
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
        raise _Refused("an empty list stops nothing (leave it out for no eos)")
    return [_token(t, ctx) for t in ids]


def _stop_strings(v: Any, ctx: Mapping) -> list[str]:
    stops = [v] if isinstance(v, str) else v
    if not isinstance(stops, (list, tuple)):
        raise _Refused()
    for s in stops:
        if not isinstance(s, str):
            raise _Refused("token ids go in stop_sequences" if _is_ids(s) else "")
        if not s:
            raise _Refused("an empty string would stop every row at once")
    return list(stops)


def _is_ids(v: Any) -> bool:
    try:
        ids = _ids(v)
    except _Refused:
        return False
    return isinstance(v, Integral) or (
        ids is not None and all(isinstance(t, Integral) for t in ids)
    )


def _stop_sequences(v: Any, ctx: Mapping) -> list[tuple[int, ...]]:
    seqs = _ids(v)
    if seqs is None:
        raise _Refused()
    if seqs and all(isinstance(t, Integral) for t in seqs):
        raise _Refused(f"for one stop sequence pass [{show(list(seqs), 40)}]")
    out = []
    for seq in seqs:
        ids = _ids(seq)
        if ids is None:
            raise _Refused(f"{show(seq, 30)} is not a list of token ids")
        if not ids:
            raise _Refused("an empty sequence would stop every row at once")
        out.append(tuple(_token(t, ctx) for t in ids))
    return out


def _tokenizer(v: Any, ctx: Mapping) -> Any:
    if not callable(getattr(v, "decode", None)):
        raise _Refused()
    return v


def _text_tokenizer(v: Any, ctx: Mapping) -> Any:
    if not callable(v) or not callable(getattr(v, "decode", None)):
        raise _Refused()
    return v


def _callable(v: Any, ctx: Mapping) -> Any:
    if not callable(v):
        raise _Refused()
    return v


def _one_of(choices: Callable[[], Sequence[str]]) -> Callable[[Any, Mapping], str]:
    def parse(v: Any, ctx: Mapping) -> str:
        if not isinstance(v, str) or v not in choices():
            raise _Refused()
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
    if isinstance(v, bool) or v == "reduce-overhead":
        return v
    if isinstance(v, str):
        if v in _backends():
            return v
        raise _Refused()
    if callable(v) and ctx.get("source") == "keyword":  # a backend function (the API only)
        return v
    raise _Refused()


def _source(v: Any, ctx: Mapping) -> str:
    if not isinstance(v, (str, os.PathLike)) or not str(v).strip():
        raise _Refused()
    return str(v).strip()


def _installed_policies() -> list[str]:
    from . import policies

    return list(policies.available())


def _policy(v: Any, ctx: Mapping) -> Any:
    if isinstance(v, str):
        if v not in _installed_policies():
            raise _Refused()
        return v
    if ctx.get("source") == "keyword":  # a policy object (the API only)
        from .policies import DraftLengthPolicy

        if isinstance(v, DraftLengthPolicy):
            return v
    raise _Refused()


def _policy_text(ctx: Mapping) -> str:
    names = ", ".join(_installed_policies()) or "(none installed)"
    text = f"an installed policy: {names} (see `bass policies`)"
    if ctx.get("source") == "keyword":
        text += ", or a policy object with draft_length() and update(stats)"
    return text


def _policy_options(v: Any, ctx: Mapping) -> dict:
    if not isinstance(v, Mapping) or not all(isinstance(k, str) for k in v):
        raise _Refused()
    return dict(v)


def _main_model(v: Any, ctx: Mapping) -> Any:
    from transformers import PreTrainedModel

    if isinstance(v, PreTrainedModel):
        return v
    if v is None or isinstance(v, (str, os.PathLike)):
        raise _Refused(
            "to load a model by name, directory or .gguf file use "
            "Generator.from_pretrained(main, draft)"
        )
    raise _Refused(f"got a {type(v).__name__}")


def _texts(v: Any, ctx: Mapping) -> list[str]:
    if isinstance(v, str):
        raise _Refused("for one text pass [text]")
    if not isinstance(v, (list, tuple)):
        raise _Refused()
    bad = [t for t in v if not isinstance(t, str)]
    if bad:
        raise _Refused(f"{show(bad[0], 30)} is not a string (token ids go to generate())")
    return list(v)


def _config(v: Any, ctx: Mapping) -> Any:
    from .config import Config

    if isinstance(v, (str, os.PathLike, Config, dict)):
        return v
    raise _Refused()


OPTIONS: dict[str, Option] = {
    o.name: o
    for o in [
        # generate()
        Option("max_new_tokens", _ints(lambda v: v >= 1), "an integer >= 1"),
        Option("do_sample", lambda v, ctx: _bool(v), "a bool: true or false"),
        Option("temperature", _numbers(lambda v: v >= 0), "a finite number >= 0"),
        Option("top_k", _ints(lambda v: v >= 1), "an integer >= 1", "no limit"),
        Option("top_p", _numbers(lambda v: 0 < v <= 1), "a number with 0 < top_p <= 1", "no limit"),
        Option(
            "seed",
            _ints(lambda v: 0 <= v < 2**63),
            "an integer >= 0 and < 2**63",
            "a seed drawn from torch's global generator",
        ),
        Option(
            "eos_token_id",
            _eos,
            lambda ctx: f"{_id_range(ctx)} or a non-empty list of them",
            "no eos: rows end at max_new_tokens or a stop",
            "the tokenizer's eos",
        ),
        Option(
            "time_budget",
            _numbers(lambda v: v >= 0),
            "a finite number of seconds >= 0 (0: stop after the prefill)",
            "no limit",
        ),
        Option(
            "stop_strings",
            _stop_strings,
            'a non-empty string or a list of non-empty strings, e.g. ["\\n\\n"]',
            "no stop strings",
        ),
        Option(
            "stop_sequences",
            _stop_sequences,
            lambda ctx: f"a list of non-empty token-id lists ({_id_range(ctx)} each)",
            "no stop sequences",
        ),
        Option(
            "tokenizer",
            _tokenizer,
            "a tokenizer (with decode(ids))",
            "none; needed only with stop_strings",
        ),
        Option("on_step", _callable, "a function of (generator, state)", "no callback"),
        # Generator()
        Option(
            "main",
            _main_model,
            "a transformers causal LM (a PreTrainedModel)",
        ),
        Option("policy", _policy, _policy_text, "the default policy"),
        Option(
            "policy_options",
            _policy_options,
            "a table of option names to values (a dict; `bass policies` lists them)",
            "the policy's defaults",
        ),
        Option(
            "attention",
            _one_of(_attention_choices),
            lambda ctx: (
                f"one of {', '.join(_attention_choices())} (available here; see `bass ops`)"
            ),
            "auto",
        ),
        Option(
            "compile",
            _compile,
            'true, false, "reduce-overhead" (CUDA graphs) or a torch.compile backend '
            "name (inductor, aot_eager, eager, ...)",
            "off",
        ),
        Option(
            "forced_acceptance", _numbers(lambda v: 0 <= v <= 1), "a probability in [0, 1]", "off"
        ),
        Option(
            "static_shapes", lambda v, ctx: _bool(v), "a bool: true or false", "on with compile"
        ),
        Option("prefill_chunk_tokens", _ints(lambda v: v >= 1), "an integer >= 1"),
        Option(
            "cpu_linear",
            _one_of(_cpu_linear_choices),
            lambda ctx: " or ".join(f'"{m}"' for m in _cpu_linear_choices()),
            "auto",
        ),
        Option(
            "shared_vocab",
            _ints(lambda v: v >= 1),
            "an integer >= 1 (the tokenizer's length, len(tokenizer))",
            "the models' logit counts must agree",
        ),
        # generate_text(), and [model] in a config file
        Option("texts", _texts, "a list of strings"),
        Option(
            "text_tokenizer",
            _text_tokenizer,
            "a transformers tokenizer (tokenizer(text) and tokenizer.decode(ids))",
            keyword="tokenizer",
        ),
        Option(
            "chat",
            lambda v, ctx: _bool(v),
            "a bool: true or false",
            "when the tokenizer has a chat template",
        ),
        Option("main_source", _source, "a model name, directory or .gguf file"),
        Option(
            "draft_source",
            _source,
            "a model name, directory or .gguf file, 'ngram' or 'none'",
        ),
        Option("dtype", _one_of(lambda: DTYPES), f"one of {', '.join(DTYPES)}"),
        Option(
            "config",
            _config,
            "a TOML file path, a bass.config.Config or a dict shaped like one",
            "no config file",
        ),
    ]
}

#: The options of :meth:`bass.Generator.generate` that a config file's ``[generation]`` may
#: also set.
GENERATE = (
    "max_new_tokens",
    "do_sample",
    "temperature",
    "top_k",
    "top_p",
    "eos_token_id",
    "seed",
    "time_budget",
    "stop_strings",
)


def check(
    name: str,
    value: Any,
    *,
    where: str = "",
    label: str | None = None,
    error: type[OptionError] = OptionError,
    **ctx: Any,
) -> Any:
    """``value`` of option ``name`` normalised, or :class:`OptionError` (``error``).

    ``label`` is how the user spelled the option: ``None`` for a keyword argument
    (``seed=-1``), else a config key (``[generation].seed``) or a flag (``--seed``);
    ``where`` prefixes the message (``"generate()"``, a file name, ``"command line"``).
    ``ctx`` holds what some checks need: ``vocab`` (the main model's logit count)."""
    opt = OPTIONS[name]
    source = "keyword" if label is None else "config"
    ctx = {"source": source, **ctx}
    try:
        return opt.parse(value, ctx)
    except _Refused as refused:
        raise error(
            _message(opt, value, ctx, where, label, refused.why), option=name, value=value
        ) from None


def _message(opt: Option, value: Any, ctx: Mapping, where: str, label: str | None, why: str):
    text = (
        _said(opt.keyword or opt.name, value, where, label)
        + f" is not allowed; expected {opt.allowed_text(ctx)}"
    )
    absent = opt.absent if label is None else (opt.absent_config or opt.absent)
    if absent is not None:
        text += f", or None ({absent})" if label is None else f" (leave it out: {absent})"
    return text + (f"; {why}" if why else "")


def _said(name: str, value: Any, where: str, label: str | None) -> str:
    said = f"{name}={show(value)}" if label is None else f"{label} = {show(value)}"
    return f"{where}: {said}" if where else said


def fail(
    name: str,
    value: Any,
    allowed: str,
    *,
    where: str = "",
    label: str | None = None,
    error: type[OptionError] = OptionError,
) -> OptionError:
    """The error for a value that only a check between options refuses (``temperature=0``
    with ``do_sample=True``), in :func:`check`'s words."""
    message = _said(name, value, where, label) + f" is not allowed; expected {allowed}"
    return error(message, option=name, value=value)


def check_keywords(where: str, **values: Any) -> dict[str, Any]:
    """Each keyword argument checked as :func:`check` does (``None`` kept as ``None``
    where the option may be left out); returns them normalised."""
    return {
        name: None
        if value is None and OPTIONS[name].absent is not None
        else check(name, value, where=where)
        for name, value in values.items()
    }


def generation_kwargs(
    given: Mapping[str, Any], defaults: Mapping[str, Any], *, vocab: int | None = None
) -> dict[str, Any]:
    """The arguments of one ``generate`` call, checked and normalised: ``given`` (its
    keyword arguments; ``None``: not given) over ``defaults`` (a config's ``[generation]``,
    checked when it was read; the vocabulary-dependent checks run again here). Returns
    every key of ``given`` and :data:`GENERATE`, with ``eos_token_id`` as a set of ids and
    ``stop_sequences`` as tuples."""
    kw: dict[str, Any] = {}
    for name in dict.fromkeys([*GENERATE, *given]):
        value = given.get(name)
        where = "generate()"
        if value is None:
            value = defaults.get(name)
            where = "generate() (from the Generator's config)"
        kw[name] = None if value is None else check(name, value, where=where, vocab=vocab)
    if kw.get("max_new_tokens") is None:
        raise OptionError(
            "generate(): max_new_tokens is required: pass max_new_tokens=N (an integer >= 1) "
            "or set it in the config's [generation] table",
            option="max_new_tokens",
        )
    kw["do_sample"] = bool(kw.get("do_sample"))
    if kw.get("temperature") is None:
        kw["temperature"] = 1.0
    if kw["do_sample"] and kw["temperature"] <= 0:
        raise fail(
            "temperature",
            kw["temperature"],
            SAMPLING_TEMPERATURE,
            where="generate()",
        )
    if kw.get("stop_strings") and kw.get("tokenizer") is None:
        raise OptionError(
            "generate(): stop_strings need a tokenizer to decode the generated tokens: pass "
            "tokenizer=... to generate() (generate_text passes its own), or give token ids "
            "as stop_sequences",
            option="tokenizer",
        )
    eos = kw.get("eos_token_id")
    kw["eos_token_id"] = set() if eos is None else set(eos if isinstance(eos, list) else [eos])
    kw["stop_sequences"] = kw.get("stop_sequences") or []
    return kw


def row_ids(value, n: int) -> list[int]:
    """``generate``'s ``row_ids``: ``range(n)`` by default, else ``n`` distinct ints
    ``>= 0`` (each row's index in the whole job, which keys its sampled draws)."""
    if value is None:
        return list(range(n))
    ids = list(value) if isinstance(value, (list, tuple, range)) else None
    if (
        ids is None
        or len(ids) != n
        or any(_is_bool(i) or not isinstance(i, int) or i < 0 for i in ids)
        or len(set(ids)) != n
    ):
        raise OptionError(
            f"generate(): row_ids={show(value)} is not allowed; expected {n} distinct ints "
            ">= 0, one per prompt (each row's index in the whole job, which keys its sampled "
            "draws)",
            option="row_ids",
            value=value,
        )
    return ids


def text_arguments(texts, tokenizer, chat) -> tuple[list[str], bool]:
    """``generate_text``'s own arguments, checked: the texts, the tokenizer, and whether to
    apply the chat template (``None``: when the tokenizer has one; ``True`` needs one)."""
    texts = check("texts", texts, where="generate_text()")
    check("text_tokenizer", tokenizer, where="generate_text()")
    chat = check_keywords("generate_text()", chat=chat)["chat"]
    has_template = getattr(tokenizer, "chat_template", None) is not None
    if chat and not has_template:
        raise fail(
            "chat", chat, "False or None: this tokenizer has no chat template",
            where="generate_text()",
        )  # fmt: skip
    return texts, has_template if chat is None else chat
