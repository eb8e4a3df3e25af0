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

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from . import option_kinds as kinds
from .errors import OptionError
from .option_kinds import DTYPES, Refused, show

__all__ = [
    "DRAFT_SAMPLING",
    "DTYPES",
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

#: How sampled drafts are drawn and verified (:class:`bass.Generator`'s ``draft_sampling``).
DRAFT_SAMPLING = ("coupled", "rejection")

#: What ``temperature`` must be when sampling (a check between two options).
SAMPLING_TEMPERATURE = "a number > 0 when do_sample is true (do_sample = false is greedy decoding)"


@dataclass(frozen=True)
class Option:
    """An option: ``parse(value, ctx)`` returns it normalised or raises :class:`Refused`;
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


OPTIONS: dict[str, Option] = {
    o.name: o
    for o in [
        # generate()
        Option("max_new_tokens", kinds._ints(lambda v: v >= 1), "an integer >= 1"),
        Option("do_sample", lambda v, ctx: kinds._bool(v), "a bool: true or false"),
        Option("temperature", kinds._numbers(lambda v: v >= 0), "a finite number >= 0"),
        Option("top_k", kinds._ints(lambda v: v >= 1), "an integer >= 1", "no limit"),
        Option(
            "top_p",
            kinds._numbers(lambda v: 0 < v <= 1),
            "a number with 0 < top_p <= 1",
            "no limit",
        ),
        Option(
            "seed",
            kinds._ints(lambda v: 0 <= v < 2**63),
            "an integer >= 0 and < 2**63",
            "a seed drawn from torch's global generator",
        ),
        Option(
            "eos_token_id",
            kinds._eos,
            lambda ctx: f"{kinds._id_range(ctx)} or a non-empty list of them",
            "no eos: rows end at max_new_tokens or a stop",
            "the tokenizer's eos",
        ),
        Option(
            "time_budget",
            kinds._numbers(lambda v: v >= 0),
            "a finite number of seconds >= 0 (0: stop after the prefill)",
            "no limit",
        ),
        Option(
            "stop_strings",
            kinds._stop_strings,
            'a non-empty string or a list of non-empty strings, e.g. ["\\n\\n"]',
            "no stop strings",
        ),
        Option(
            "stop_sequences",
            kinds._stop_sequences,
            lambda ctx: f"a list of non-empty token-id lists ({kinds._id_range(ctx)} each)",
            "no stop sequences",
        ),
        Option(
            "tokenizer",
            kinds._tokenizer,
            "a tokenizer (with decode(ids))",
            "none; needed only with stop_strings",
        ),
        Option("on_step", kinds._callable, "a function of (generator, state)", "no callback"),
        # Generator()
        Option(
            "main",
            kinds._main_model,
            "a transformers causal LM (a PreTrainedModel)",
        ),
        Option("policy", kinds._policy, kinds._policy_text, "the default policy"),
        Option(
            "policy_options",
            kinds._policy_options,
            "a table of option names to values (a dict; `bass policies` lists them)",
            "the policy's defaults",
        ),
        Option(
            "attention",
            kinds._one_of(kinds._attention_choices),
            lambda ctx: (
                f"one of {', '.join(kinds._attention_choices())} (available here; see `bass ops`)"
            ),
            "auto",
        ),
        Option(
            "compile",
            kinds._compile,
            'true, false, "reduce-overhead" (CUDA graphs) or a torch.compile backend '
            "name (inductor, aot_eager, eager, ...)",
            "off",
        ),
        Option(
            "forced_acceptance",
            kinds._numbers(lambda v: 0 <= v <= 1),
            "a probability in [0, 1]",
            "off",
        ),
        Option(
            "static_shapes",
            lambda v, ctx: kinds._bool(v),
            "a bool: true or false",
            'on with compile="reduce-overhead"',
        ),
        Option("prefill_chunk_tokens", kinds._ints(lambda v: v >= 1), "an integer >= 1"),
        Option(
            "cpu_linear",
            kinds._one_of(kinds._cpu_linear_choices),
            lambda ctx: " or ".join(f'"{m}"' for m in kinds._cpu_linear_choices()),
            "auto",
        ),
        Option(
            "draft_sampling",
            kinds._one_of(lambda: DRAFT_SAMPLING),
            '"coupled" or "rejection"',
            "coupled",
        ),
        Option(
            "shared_vocab",
            kinds._ints(lambda v: v >= 1),
            "an integer >= 1 (the tokenizer's length, len(tokenizer))",
            "the models' logit counts must agree",
        ),
        # generate_text(), and [model] in a config file
        Option("texts", kinds._texts, "a list of strings"),
        Option(
            "text_tokenizer",
            kinds._text_tokenizer,
            "a transformers tokenizer (tokenizer(text) and tokenizer.decode(ids))",
            keyword="tokenizer",
        ),
        Option(
            "chat",
            lambda v, ctx: kinds._bool(v),
            "a bool: true or false",
            "when the tokenizer has a chat template",
        ),
        Option(
            "main_source", kinds._source, "a model name, directory or .gguf file", keyword="main"
        ),
        Option(
            "draft_source",
            kinds._source,
            "a model name, directory or .gguf file, 'ngram' or 'none'",
            keyword="draft",
        ),
        Option("dtype", kinds._one_of(lambda: DTYPES), f"one of {', '.join(DTYPES)}"),
        Option(
            "config",
            kinds._config,
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
    except Refused as refused:
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
    if hasattr(value, "ndim") and hasattr(value, "tolist") and value.ndim == 1:
        value = value.tolist()  # a 1-D tensor or array
    ids = list(value) if isinstance(value, (list, tuple, range)) else None
    if ids is not None:
        try:
            ids = [kinds._int(i) for i in ids]  # numpy ints too
        except kinds.Refused:
            ids = None
    if ids is None or len(ids) != n or any(not 0 <= i < 2**63 for i in ids) or len(set(ids)) != n:
        raise OptionError(
            f"generate(): row_ids={show(value)} is not allowed; expected {n} distinct ints "
            ">= 0 and < 2**63, one per prompt (each row's index in the whole job, which keys "
            "its sampled draws)",
            option="row_ids",
            value=value,
        )
    return ids


def pretrained_arguments(main, draft, dtype, device, config) -> tuple:
    """``Generator.from_pretrained``'s loading arguments, checked before anything loads:
    ``main`` a name, directory or .gguf file; ``draft`` one too, an installed drafter's
    name or ``None`` (``"none"``: ``None``); ``dtype`` a torch dtype or its name (default:
    the config's ``[model].dtype``, else float32); ``device`` one torch knows and this
    machine has. Returns ``(main, draft, dtype, device)`` normalised."""
    import torch

    where = "Generator.from_pretrained()"
    main = check("main_source", main, where=where)
    if draft is not None:
        draft = check("draft_source", draft, where=where)
        draft = None if draft == "none" else draft
    if dtype is None and config is not None:
        from .config import as_config

        dtype = as_config(config).model.dtype
    if isinstance(dtype, str):
        dtype = getattr(torch, check("dtype", dtype, where=where))
    elif dtype is not None and not isinstance(dtype, torch.dtype):
        raise fail("dtype", dtype, f"a torch dtype or one of {', '.join(DTYPES)}", where=where)
    if device is not None:
        try:
            dev = torch.device(device)
        except (RuntimeError, TypeError):
            raise fail("device", device, "a torch device: 'cpu', 'cuda', 'cuda:1', ...",
                       where=where) from None  # fmt: skip
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise fail(
                "device", device, "a device this machine has: this torch build sees no CUDA "
                "device (torch.cuda.is_available() is False)", where=where,
            )  # fmt: skip
    return main, draft, dtype, device


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
