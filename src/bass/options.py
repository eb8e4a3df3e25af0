"""Every option bass takes from a user, declared once (:data:`OPTIONS`), and the checks at
the public edge: what is made from the declarations and what a refused value's
:class:`~bass.errors.OptionError` says: docs/reference/options.md.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from . import option_kinds as kinds
from . import policies
from .cpu_linear import MODES as CPU_LINEAR_MODES
from .errors import ConfigError, OptionError
from .ops import implementations
from .option_kinds import BOOL, DTYPES, Choice, Option, Range, Refused, Value, show, show_toml

__all__ = [
    "GENERATE",
    "LOGPROB_OPTIONS",
    "MAX_ROWS",
    "OPTIONS",
    "Option",
    "OptionError",
    "check",
    "check_config_eos",
    "check_keywords",
    "check_sampling",
    "fail",
    "generation_kwargs",
    "generator_defaults",
    "pretrained_arguments",
    "row_ids",
    "show",
    "show_toml",
    "text_arguments",
    "use_config_reader",
]

#: The most rows generating at once when ``max_rows`` is not given (vLLM's
#: ``max_num_seqs`` default; :mod:`bass.scheduler`); the KV budget may allow fewer.
MAX_ROWS = 256
#: What ``logprobs`` may ask for (:attr:`bass.GenerationResult.logprobs`).
LOGPROBS = ("raw", "processed")
#: The options that ask for log-probabilities: rows carry them, texts (``generate_text``)
#: and evaluations (``bass eval humaneval``) keep none
LOGPROB_OPTIONS = ("logprobs", "prompt_logprobs")


# --------------------------------------------------------------------------- kinds needing
# what is installed here (the policies, the attention implementations, torch's backends)


def _policy(v: Any, ctx: Mapping) -> Any:
    if isinstance(v, str) and v in policies.available():
        return v
    if ctx.get("source") == "keyword":  # a policy object (the API only)
        if isinstance(v, type):
            raise Refused(f"{v.__name__} is a class: pass an instance, {v.__name__}(...)")
        if policies.is_policy(v):
            return v
    raise Refused()


def _policy_text(ctx: Mapping) -> str:
    if ctx.get("docs"):
        text = "an installed policy's name (`bass policies` lists them)"
    else:
        names = ", ".join(policies.available()) or "(none installed)"
        text = f"an installed policy: {names} (see `bass policies`)"
    if ctx.get("source") == "keyword":
        text += ", or a policy object with draft_length() and update(record)"
    return text


def _compile(v: Any, ctx: Mapping) -> Any:
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, str):
        import torch

        if v == "reduce-overhead" or v in torch._dynamo.list_backends(exclude_tags=()):
            return v
    elif callable(v) and ctx.get("source") == "keyword":  # a backend function (the API only)
        return v
    raise Refused()


def _main_model(v: Any, ctx: Mapping) -> Any:
    # transformers loads here, on first use: the command line's --help need not wait for it
    from transformers import PreTrainedModel

    from .hf import check_loaded

    if isinstance(v, PreTrainedModel) or isinstance(getattr(v, "_orig_mod", None), PreTrainedModel):
        check_loaded(v, "main")  # its own message, as for the draft model
        return v
    if v is None or isinstance(v, (str, os.PathLike)):
        raise Refused(
            "to load a model by name, directory or .gguf file use "
            "Generator.from_pretrained(main, draft)"
        )
    raise Refused(f"got a {type(v).__name__}")


def _config(v: Any, ctx: Mapping) -> Any:
    # a bass.config.Config is known by its methods: this module does not import that layer
    if isinstance(v, (str, os.PathLike, dict)) or callable(getattr(v, "generator_kwargs", None)):
        return v
    raise Refused()


def _row_ids(v: Any, ctx: Mapping) -> list[int]:
    if hasattr(v, "ndim") and hasattr(v, "tolist") and v.ndim == 1:
        v = v.tolist()  # a 1-D tensor or array
    if not isinstance(v, (list, tuple, range)):
        raise Refused()
    ids = [kinds.as_int(i) for i in v]  # numpy ints too
    if len(ids) != ctx["n"] or any(not 0 <= i < 2**63 for i in ids) or len(set(ids)) != len(ids):
        raise Refused()
    return ids


def _logprobs(v: Any, ctx: Mapping) -> str | None:
    if isinstance(v, (bool, np.bool_)):  # true: the raw ones (vLLM's default)
        return "raw" if v else None
    if isinstance(v, str) and v in LOGPROBS:
        return str(v)
    raise Refused()


def _device(v: Any, ctx: Mapping) -> Any:
    import torch

    try:
        dev = torch.device(v)
    except (RuntimeError, TypeError):
        raise Refused() from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise Refused("this torch build sees no CUDA device (torch.cuda.is_available() is False)")
    return v


# --------------------------------------------------------------------------- declarations
# In the order of the config file's tables ([policy], [generation], [model]: their keys
# keep this order in bass.config), then the API's own options.

# fmt: off
G, RUN, TEXT, LOAD = "Generator", "generate", "generate_text", "from_pretrained"
_IDS = Value(kinds.eos, lambda ctx: f"{kinds.id_range(ctx)} or a non-empty list of them")
_SEQS = Value(kinds.stop_sequences,
              lambda ctx: f"a list of non-empty token-id lists ({kinds.id_range(ctx)} each)")
_STOPS = 'a non-empty string or a list of non-empty strings, e.g. ["\\n\\n"]'
_COMPILE = ('true, false, "reduce-overhead" (CUDA graphs) or a torch.compile backend name '
            "(inductor, aot_eager, eager, ...)")
_ATTENTION = Choice(lambda: ["auto", *implementations()], note="available here; see `bass ops`",
                    docs="auto, or an implementation that runs here: reference, sdpa (CPU), "
                    "fused (CUDA), ... (`bass ops` lists them)")
_SOURCE = "a model name, directory or .gguf file"
_PENALTY = Range(float, low=-2, high=2, text="a number in [-2, 2] (0: none)")

OPTIONS: dict[str, Option] = {o.name: o for o in [
    Option("policy", Value(_policy, _policy_text), "the draft-length policy", G,
           policies.DEFAULT, "the default policy", table="policy", key="name", flag="--policy",
           metavar="NAME"),
    Option("policy_options", Value(kinds.table, "a table of option names to values (a dict; "
           "`bass policies` lists them)"), "the policy's options by name (`bass policies` "
           "lists them with their defaults)", G, {}, "the policy's defaults", table="policy",
           key="options"),
    Option("max_new_tokens", Range(int, low=1), "the most new tokens of a row", RUN, 128,
           table="generation", flag="--max-new-tokens", metavar="N"),
    Option("do_sample", BOOL, "sample (with temperature, top_k, top_p, min_p), else greedy", RUN,
           False, "greedy decoding", table="generation", flag="--sample"),
    Option("temperature", Range(float, low=0), "the sampling temperature", RUN, 1.0, "1.0",
           table="generation", flag="--temperature", metavar="T"),
    Option("top_k", Range(int, low=1), "sample among the top_k likeliest tokens", RUN,
           absent="no limit", table="generation", flag="--top-k", metavar="K"),
    Option("top_p", Range(float, low=0, high=1, low_open=True,
                          text="a number with 0 < top_p <= 1"),
           "sample among the likeliest tokens whose probabilities sum to top_p (nucleus)", RUN,
           absent="no limit", table="generation", flag="--top-p", metavar="P"),
    Option("min_p", Range(float, low=0, high=1, text="a number in [0, 1]"),
           "sample among the tokens at least min_p times as likely as the likeliest", RUN,
           absent="no limit", table="generation", flag="--min-p", metavar="P"),
    Option("repetition_penalty", Range(float, low=1e-3, high=1e3,
                                       text="a number in [0.001, 1000] (1: none)"),
           "divide the logits of tokens already in a row (prompt included) by this where "
           "positive, multiply where negative (transformers' repetition_penalty; 1: none)",
           RUN, absent="none", table="generation", flag="--repetition-penalty", metavar="R"),
    Option("frequency_penalty", _PENALTY, "lower the logit of a token by this times its count "
           "among the row's new tokens (OpenAI's and vLLM's frequency_penalty)", RUN,
           absent="none", table="generation", flag="--frequency-penalty", metavar="F"),
    Option("presence_penalty", _PENALTY, "lower the logit of a token already among the row's "
           "new tokens by this (OpenAI's and vLLM's presence_penalty)", RUN, absent="none",
           table="generation", flag="--presence-penalty", metavar="P"),
    Option("seed", Range(int, low=0, high=2**63 - 1, text="an integer >= 0 and < 2**63"),
           "the seed: each row's draws are keyed by it and the row's index, however rows are "
           "batched", RUN, absent="a seed drawn from torch's global generator",
           table="generation", flag="--seed", metavar="S"),
    Option("eos_token_id", _IDS, "the token id(s) that end a row", RUN,
           absent="no eos: rows end at max_new_tokens or a stop",
           absent_config="the tokenizer's and the model's generation_config eos (the CLI, "
                         "generate_text(); generate() called with token ids: none)",
           table="generation"),
    Option("time_budget", Range(float, low=0, text="a finite number of seconds >= 0 (0: stop "
                                "after the prefill)"),
           "seconds after a row starts (its prefill) when it stops where it is", RUN,
           absent="no limit",
           table="generation", flag="--time-budget", metavar="SECONDS"),
    Option("stop_strings", Value(kinds.stop_strings, _STOPS), "a row ends once its text "
           "contains one of these (its tokens are kept)", RUN, absent="no stop strings",
           table="generation", flag="--stop", metavar="TEXT"),
    Option("logprobs", Value(_logprobs, "raw, processed, true (raw) or false (none)", str),
           "each new token's log-probability under the main model: raw (its own "
           "distribution) or processed (the one sampled from: the warps applied)", RUN,
           absent="none", table="generation", flag="--logprobs", metavar="MODE"),
    Option("prompt_logprobs", BOOL, "each prompt token's log-probability under the main "
           "model given the tokens before it (vLLM's prompt_logprobs; the first token's: "
           "None)", RUN, absent="none", table="generation", flag="--prompt-logprobs"),
    Option("main_source", Value(kinds.source, _SOURCE), "the main model: a Hugging Face name, "
           "a local directory or a .gguf file", LOAD, keyword="main", table="model",
           absent_config="the embedded SmolLM2-135M-Instruct", flag="--main", metavar="MODEL"),
    Option("draft_source", Value(kinds.source, f"{_SOURCE}, 'ngram' or 'none'"), "the draft: "
           "a model (name, directory or .gguf), 'ngram' (prompt lookup), an installed "
           "drafter's name (entry points 'bass.drafters'; ./NAME for a directory of that name) "
           "or 'none' (regular decoding)", LOAD, "ngram", "regular decoding",
           absent_config="ngram", keyword="draft", table="model", flag="--draft", metavar="MODEL"),
    Option("attention", _ATTENTION, "the attention implementation of the packed passes", G,
           "auto", "auto", table="model", flag="--attention", metavar="IMPL"),
    Option("dtype", Choice(DTYPES), "the models' dtype when loaded by name", LOAD, "float32",
           absent_config="float32", table="model", flag="--dtype"),
    Option("chat", BOOL, "apply the tokenizer's chat template to each text", TEXT,
           absent="when the tokenizer has a chat template", table="model", flag="--chat"),
    Option("compile", Value(_compile, _COMPILE), "torch.compile every pass after the prefill; "
           '"reduce-overhead": replayed as CUDA graphs', G, False, "off", table="model",
           flag="--compile", metavar="MODE"),
    Option("cpu_linear", Choice(CPU_LINEAR_MODES), "CPU: each linear layer's GEMM layout per "
           "row count, measured (auto), the copy-free layouts only (unpacked), or torch's", G,
           "auto", "auto", table="model", flag="--cpu-linear"),
    Option("draft_sampling", Choice(("coupled", "rejection")), "sampling with a drafter: "
           "coupled (its draws use the main model's keyed noise: samples equal plain "
           "sampling's, however the job is split) or rejection (rejection sampling: the same "
           "distribution, samples that depend on the batch)", G, "coupled", "coupled",
           table="model", flag="--draft-sampling"),
    # the API's own
    Option("stop_sequences", _SEQS, "a row ends once its new tokens end with one of these "
           "(kept, as eos is)", RUN, absent="no stop sequences"),
    Option("tokenizer", Value(kinds.has("decode"), "a tokenizer (with decode(ids))"),
           "decodes the new tokens for stop_strings", RUN,
           absent="none; needed only with stop_strings"),
    Option("on_step", Value(kinds.has(call=True), "a function of (generator, state)"),
           "called with (generator, state) after each step", RUN, absent="no callback"),
    Option("n", Range(int, low=1, high=10**7, text="an integer in [1, 10**7]"), "samples per "
           "prompt: row i*n + j of the result is sample j of prompt i, its draws keyed by "
           "bass.sampling.row_key(i, j) (i: the prompt's row id), as bass generate keys them",
           RUN, absent="one row per prompt, its draws keyed by its row id"),
    Option("max_rows", Range(int, low=1), "the most rows generating at once: when one "
           "finishes, the next waiting prompt takes its cache slot (continuous batching)",
           RUN, absent=f"as many as the KV budget holds, at most {MAX_ROWS}"),
    Option("kv_budget_gib", Range(float, low=0, low_open=True, text="a finite number of GiB > 0"),
           "the most memory the KV caches of the rows at once may take, in GiB", RUN,
           absent="80% of the free GPU memory; half the available memory on a CPU"),
    Option("on_finish", Value(kinds.has(call=True), "a function of one bass.FinishedRow"),
           "called with each row the moment it finishes", RUN, absent="no callback"),
    Option("main", Value(_main_model, "a transformers causal LM (a PreTrainedModel)"),
           "the main model", G),
    Option("forced_acceptance", Range(float, low=0, high=1, text="a probability in [0, 1]"),
           "BENCHMARKING ONLY: accept each draft token with this probability", G,
           absent="off"),
    Option("static_shapes", BOOL, "pass shapes a CUDA graph can replay", G,
           absent='on with compile="reduce-overhead"'),
    Option("prefill_chunk_tokens", Range(int, low=1), "the most tokens one prefill pass "
           "feeds", G, 8192),
    Option("shared_vocab", Range(int, low=1, text="an integer >= 1 (the tokenizer's length, "
                                 "len(tokenizer))"),
           "a draft model whose logits differ from the main model's by padding: the "
           "tokenizer's length", G, absent="the models' logit counts must agree"),
    Option("config", Value(_config, "a TOML file path, a bass.config.Config or a dict shaped "
           "like one"), "a config file whose tables are the defaults", G,
           absent="no config file"),
    Option("row_ids", Value(_row_ids, lambda ctx: f"{ctx.get('n', 'n')} distinct ints >= 0 "
           "and < 2**63, one per prompt (each row's index in the whole job, which keys its "
           "sampled draws)"), "each prompt's index in the whole job", RUN,
           absent="each prompt's index in this call"),
    Option("texts", Value(kinds.texts, "a list of strings"), "the prompts, as text", TEXT),
    Option("text_tokenizer", Value(kinds.has("decode", call=True), "a transformers tokenizer "
           "(tokenizer(text) and tokenizer.decode(ids))"), "encodes the texts and decodes "
           "the completions", TEXT, keyword="tokenizer"),
    Option("device", Value(_device, "a torch device: 'cpu', 'cuda', 'cuda:1', ..."),
           "where the models load", LOAD, absent="the CPU"),
]}
# fmt: on

#: The flags of ``bass generate`` (and ``bass eval humaneval``) that set an option no
#: config file sets (the errors of a config that tries point to them).
KEYLESS_FLAGS = {"n": "--samples", "max_rows": "--batch-size", "kv_budget_gib": "--kv-budget-gib"}

#: The options of :meth:`bass.Generator.generate` that a config file's ``[generation]`` may
#: also set.
GENERATE = tuple(o.name for o in OPTIONS.values() if o.table == "generation")


# --------------------------------------------------------------------------- checks


def check(name: str, value: Any, **how: Any) -> Any:
    """``value`` of option ``name`` normalised, or an :class:`OptionError` naming it as
    :meth:`~bass.option_kinds.Option.check` does (``how``: its ``where``, ``label`` and
    ``error``, and ``vocab``, the main model's logit count, for the token ids)."""
    return OPTIONS[name].check(value, **how)


fail = kinds.refusal


def check_sampling(do_sample: bool, temperature: float, where: str, **label: Any) -> None:
    """The check between ``do_sample`` and ``temperature``: sampling needs a temperature
    above 0 (``label``, ``error``: as :func:`fail` takes them)."""
    if do_sample and temperature <= 0:
        allowed = "a number > 0 when do_sample is true (do_sample = false is greedy decoding)"
        raise fail("temperature", temperature, allowed, where=where, **label)


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
    given: Mapping[str, Any],
    defaults: Mapping[str, Any],
    *,
    vocab: int | None = None,
    call: str = "generate",
) -> dict[str, Any]:
    """The arguments of one ``generate`` call, checked and normalised: ``given`` (its
    keyword arguments; ``None``: not given) over ``defaults`` (a config's ``[generation]``,
    checked when it was read; the vocabulary-dependent checks run again here), over the
    declared defaults. Returns every key of ``given`` and :data:`GENERATE`, with
    ``eos_token_id`` as a set of ids and ``stop_sequences`` as tuples. ``call``: the
    method the errors name (``stream``)."""
    kw: dict[str, Any] = {}
    for name in dict.fromkeys([*GENERATE, *given]):
        value = given.get(name)
        where = f"{call}()"
        if value is None:
            value = defaults.get(name)
            where = f"{call}() (from the Generator's config)"
        kw[name] = None if value is None else check(name, value, where=where, vocab=vocab)
        if kw[name] is None and OPTIONS[name].absent is not None:
            kw[name] = OPTIONS[name].default  # do_sample False, temperature 1.0
    if kw.get("max_new_tokens") is None:
        raise OptionError(
            f"{call}(): max_new_tokens is required: pass max_new_tokens=N (an integer >= 1), "
            "or build the Generator with a config (its [generation] max_new_tokens; 128 where "
            "the file leaves it out)",
            option="max_new_tokens",
        )
    check_sampling(kw["do_sample"], kw["temperature"], f"{call}()")
    if kw.get("stop_strings") and kw.get("tokenizer") is None:
        raise OptionError(
            f"{call}(): stop_strings need a tokenizer to decode the generated tokens: pass "
            f"tokenizer=... to {call}() (generate_text passes its own), or give token ids "
            "as stop_sequences",
            option="tokenizer",
        )
    check_stops_shown(kw.get("stop_strings"), kw.get("tokenizer"), f"{call}()")
    eos = kw.get("eos_token_id")
    kw["eos_token_id"] = set() if eos is None else set(eos if isinstance(eos, list) else [eos])
    kw["stop_sequences"] = kw.get("stop_sequences") or []
    return kw


def check_stops_shown(
    stops, tokenizer, where: str = "generate()", label: str = "stop_strings"
) -> None:
    """Refuse a stop string holding a special token's text (``<|im_end|>``, ``</s>``): the
    text is decoded with special tokens skipped, so it would never match."""
    if not stops or tokenizer is None:
        return
    tokens = getattr(tokenizer, "all_special_tokens", None)  # a transformers tokenizer's
    if not isinstance(tokens, (list, tuple)):
        return
    special = [t for t in tokens if isinstance(t, str) and len(t.strip()) >= 3]
    for stop in [stops] if isinstance(stops, str) else stops:
        hit = next((t for t in special if t in stop), None)
        if hit is not None:
            ids = tokenizer.convert_tokens_to_ids(hit)
            raise OptionError(
                f"{where}: {label} {stop!r} holds the special token {hit!r}, which the "
                "decoded text never shows (special tokens are skipped), so it would never "
                f"match: stop on its id ({ids}) instead, with eos_token_id or stop_sequences "
                "(for bass generate: eos_token_id in the config's [generation] table)",
                option="stop_strings",
            )


def row_ids(value, n: int, call: str = "generate") -> list[int]:
    """``generate``'s ``row_ids``: ``range(n)`` by default, else ``n`` distinct ints
    ``>= 0`` (each row's index in the whole job, which keys its sampled draws)."""
    return list(range(n)) if value is None else check("row_ids", value, where=f"{call}()", n=n)


# --------------------------------------------------------------------------- config=

_read_config: Callable[[Any], Any] | None = None


def read_config(config):
    """A :class:`bass.config.Config` from a ``config=`` argument (a path, a dict, a
    Config), checked (its errors name the file and key)."""
    return _read_config(config)


def use_config_reader(read: Callable[[Any], Any]) -> None:
    """Install ``read(config)``: a :class:`bass.config.Config` from a ``config=`` argument
    (a path, a dict, a Config). :mod:`bass.config` calls it when imported (this core
    module imports no layer above the core)."""
    global _read_config
    _read_config = read


def generator_defaults(config, main) -> tuple[dict, dict, bool | None]:
    """What a :class:`bass.Generator` built with ``config`` (``None``: no config) for the
    model ``main`` takes from it: ``(generator_kwargs, generate_kwargs, chat)`` (``chat``:
    ``generate_text``'s default). An ``eos_token_id`` outside ``main``'s vocabulary is
    refused here, naming the key, rather than at the first ``generate()``."""
    if config is None:
        return {}, {}, None
    cfg = _read_config(config)
    defaults = cfg.generate_kwargs()
    file = isinstance(config, (str, os.PathLike))
    check_config_eos(defaults, main, os.fspath(config) if file else "Generator(config=...)")
    return cfg.generator_kwargs(), defaults, cfg.model.chat


def check_config_eos(generate_kwargs: Mapping[str, Any], main, where: str) -> None:
    """A config's ``[generation].eos_token_id`` (in its ``generate_kwargs``) checked against
    the main model's vocabulary, which a config file's own check could not know."""
    if generate_kwargs.get("eos_token_id") is not None:
        vocab = main.get_output_embeddings().weight.shape[0]
        check("eos_token_id", generate_kwargs["eos_token_id"], where=where,
              label="[generation].eos_token_id", vocab=vocab, error=ConfigError)  # fmt: skip


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
        dtype = _read_config(config).model.dtype
    if isinstance(dtype, str):
        dtype = getattr(torch, check("dtype", dtype, where=where))
    elif dtype is not None and not (
        isinstance(dtype, torch.dtype) and str(dtype).removeprefix("torch.") in DTYPES
    ):  # a model's weights: a floating dtype (int8 failed inside transformers, after a download)
        allowed = f"a floating torch dtype, one of {', '.join(DTYPES)} (or its name)"
        raise fail("dtype", dtype, allowed, where=where)
    if device is not None:
        check("device", device, where=where)
    return main, draft, dtype, device


def text_arguments(texts, tokenizer, chat, kw: dict) -> tuple[list[str], bool]:
    """``generate_text``'s own arguments, checked: the texts, the tokenizer, and whether to
    apply the chat template (``None``: when the tokenizer has one; ``True`` needs one).
    Its texts carry no log-probabilities: ``logprobs`` or ``prompt_logprobs`` in ``kw`` is
    refused unless an ``on_finish`` callback takes the rows (a config's is computed all the
    same: ranks of a tensor-parallel group that pass ``on_finish`` or not must agree)."""
    texts = check("texts", texts, where="generate_text()")
    check("text_tokenizer", tokenizer, where="generate_text()")
    chat = check_keywords("generate_text()", chat=chat)["chat"]
    has_template = getattr(tokenizer, "chat_template", None) is not None
    if chat and not has_template:
        raise fail(
            "chat", chat, "False or None: this tokenizer has no chat template",
            where="generate_text()",
        )  # fmt: skip
    for key in LOGPROB_OPTIONS:
        if kw.get("on_finish") is None and kw.get(key) not in (None, False):
            allowed = (
                "false: generate_text() returns text only; call generate(), or pass "
                "on_finish (its rows carry them)"
            )
            raise fail(key, kw[key], allowed, where="generate_text()")
    return texts, has_template if chat is None else chat
