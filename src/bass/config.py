"""The config file: TOML tables derived from the option declarations, checked key by key.

A config file has three tables, all optional; a key left out keeps its default::

    # bass.toml
    [model]
    main = "HuggingFaceTB/SmolLM2-360M-Instruct"  # HF name, local dir or .gguf file;
                                                   # leave out for the embedded default
    draft = "ngram"        # a model (name/dir/.gguf), "ngram" (prompt lookup), "none" or an
                           # installed drafter's name
    attention = "auto"     # attention implementation: "auto", "reference", "sdpa", ...
    compile = false        # true: torch.compile each pass; "reduce-overhead": CUDA graphs
    cpu_linear = "auto"    # CPU: GEMM layout per row count, measured ("unpacked", "torch")
    draft_sampling = "coupled"  # sampled drafts: coupled draws, or "rejection" sampling
    dtype = "float32"      # float32, float16, bfloat16 or float64
    chat = true            # apply the chat template (leave out: when the tokenizer has one)

    [generation]
    max_new_tokens = 128
    do_sample = true       # false: greedy; true: sample with the settings below
    temperature = 0.8
    top_p = 0.95           # leave out for no limit (top_k, min_p likewise)
    repetition_penalty = 1.1  # transformers' repetition penalty; leave out for none
    presence_penalty = 0.5    # vLLM's/OpenAI's (frequency_penalty likewise), in [-2, 2]
    seed = 0
    time_budget = 30.0     # seconds per row from its start; leave out for none
    stop_strings = ["\\n\\n"]  # a row ends once its text contains one
    eos_token_id = 2       # an id or a list of ids; leave out for the tokenizer's
    logprobs = "raw"       # each token's log-probability in --output; leave out for none
    # prompt_logprobs = true  # each prompt token's, too

    [policy]
    name = "adaptive"      # a draft-length policy: see `bass policies`

    [policy.options]       # that policy's options (`bass policies` lists them)
    k_max = 16

Every key, its flag, default and allowed values: docs/reference/options.md; how a call's
arguments and the flags override the file: docs/guides/config-and-cli.md. Every problem
raises :class:`ConfigError` naming the file, the key (``[generation].temperature``), the
value and what is allowed. The tables' dataclasses, defaults and checks are made from
the options of :data:`bass.options.OPTIONS` that name a ``table``.
"""

from __future__ import annotations

import copy
import difflib
import os
import sys
from dataclasses import asdict, dataclass, field, fields, make_dataclass
from pathlib import Path
from typing import Any

from . import options, policies
from .errors import ConfigError, PluginError, PluginLoadError
from .option_kinds import Option
from .options import KEYLESS_FLAGS, OPTIONS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10, where tomli is a dependency
    import tomli as tomllib

__all__ = [
    "TABLES",
    "Config",
    "ConfigError",
    "GenerationConfig",
    "ModelConfig",
    "PolicyConfig",
    "apply_config",
    "as_config",
    "load_config",
    "read_toml",
]


# --------------------------------------------------------------------------- the tables

#: Each table's options (``[policy]``, ``[generation]``, ``[model]``), by key, in the
#: order :data:`bass.options.OPTIONS` declares them.
TABLES: dict[str, dict[str, Option]] = {}
for _o in OPTIONS.values():
    if _o.table is not None:
        TABLES.setdefault(_o.table, {})[_o.key or _o.said] = _o


#: Keys whose field is ``None`` until set (a file or the code): ``generate``'s own default
#: applies, which warns where the model's generation_config samples and decodes greedily
UNSET = ("do_sample",)


def _section(table: str, name: str, doc: str) -> type:
    """The dataclass of ``[table]``: one field per key, typed and defaulted as declared."""

    def spec(key: str, o: Option) -> tuple:
        hint = o.kind.type or Any
        default = None if o.name in UNSET else o.default
        if default is None and hint is not Any:
            hint = hint | None
        if isinstance(default, (dict, list)):  # a fresh one per instance
            return key, hint, field(default_factory=lambda d=default: copy.copy(d))
        return key, hint, field(default=default)

    cls = make_dataclass(name, [spec(k, o) for k, o in TABLES[table].items()])
    cls.__module__, cls.__doc__ = __name__, doc
    return cls


PolicyConfig = _section("policy", "PolicyConfig", "``[policy]``: the policy's name and options.")
GenerationConfig = _section(
    "generation", "GenerationConfig", "``[generation]``: :meth:`bass.Generator.generate`'s."
)
ModelConfig = _section("model", "ModelConfig", "``[model]``: the models and how they run.")


def _unknown(source: str, what: str, names: list[str], allowed: list[str]) -> ConfigError:
    shown = ", ".join(repr(n) for n in sorted(names, key=repr))  # a dict's keys: any type
    hints = []  # where a key belongs, or the allowed name it is a letter or two from
    for name in (n for n in names if isinstance(n, str)):
        home = [t for t, keys in TABLES.items() if name in keys and f"[{t}]" not in what]
        if home:
            hints.append(f"{name!r} belongs in [{home[0]}]")
        elif name in OPTIONS and OPTIONS[name].table is None:  # the API's alone (n, ...)
            flag = KEYLESS_FLAGS.get(name)
            call = f"{OPTIONS[name].call}()" + (f", {flag} on the command line" if flag else "")
            hints.append(f"{name!r} is an argument of {call}, not a config key")
        elif close := difflib.get_close_matches(
            name.lower(), [a.strip("[]") for a in allowed], n=1
        ):
            hints.append(f"did you mean {close[0]!r}?")
        elif what == "key in [policy]":
            hints.append(f"a policy's options, {name!r} too, go in [policy.options]")
    hint = f" ({'; '.join(hints)})" if hints else ""
    return ConfigError(
        f"{source}: unknown {what} {shown}{hint}; allowed: {', '.join(allowed)} "
        "(check the spelling; see the example in `python -m pydoc bass.config`)"
    )


def _table(d: dict, table: str, cls: type, source: str, labels: dict[str, str], build: bool):
    """``[table]`` of the document ``d`` as ``cls``: every key checked (keys left out:
    defaults), then the checks between its options (with ``build``, ``[policy]``'s policy
    or ``[model]``'s installed drafter built once)."""
    raw = {} if d.get(table) is None else d[table]
    if not isinstance(raw, dict):
        raise ConfigError(
            f"{source}: [{table}] = {raw!r} is not allowed; expected a table "
            f"([{table}] with key = value lines)"
        )
    keys = TABLES[table]
    unknown = [k for k in raw if k not in keys]
    if unknown:
        raise _unknown(source, f"key in [{table}]", unknown, list(keys))

    def label(key: str) -> str:  # as the user typed it (a flag, --temperature), else as a file
        return labels.get(f"{table}.{key}", f"[{table}].{key}")

    def check(key: str, value: Any) -> Any:
        return keys[key].check(value, where=source, label=label(key), error=ConfigError)

    section = cls(**{k: check(k, v) for k, v in raw.items() if v is not None})
    if table == "policy":
        check("name", section.name)  # the default too: it must be installed
        if build:
            _build_policy(section, source, label)
    elif table == "model" and build and section.draft not in (None, "none"):
        _load_drafter(section.draft, source, label("draft"))
    elif table == "generation":
        how = label("temperature")  # as the user typed it
        options.check_sampling(
            section.do_sample, section.temperature, source, label=how, error=ConfigError
        )
    return section


def _build_policy(section, source: str, label) -> None:
    """Build ``[policy]``'s policy once, so that what is wrong with it is reported here,
    named with ``source`` and the key at fault: ``[policy].name`` (``--policy``) for a
    policy that cannot be loaded, ``[policy].options`` for options it refuses."""
    name, options = section.name, section.options
    try:  # the policy checks its own options
        policies.load(name, **options)
    except PluginLoadError as exc:  # does not import, or is no policy: the name's fault
        raise ConfigError(
            f"{source}: {label('name')} = {name!r} cannot be used: {exc} (`bass policies` "
            "lists the installed policies and why any of them does not load)",
            option="policy",
            value=name,
        ) from exc
    except PluginError as exc:  # another package's policy raised while being built
        given = f" with {label('options')} = {options!r}" if options else ""
        raise _located(exc, f"{source}: {label('name')} = {name!r}{given}: ") from exc.__cause__
    except (ValueError, TypeError, ImportError) as exc:
        raise ConfigError(
            f"{source}: {label('options')} for policy {name!r}: "
            f"{exc} (`bass policies` lists every option with its default)",
            option="policy_options",
            value=options,
        ) from exc


def _load_drafter(name: str, source: str, key: str) -> None:
    """An installed drafter's name in ``[model].draft`` (``--draft``) loaded and built once,
    so that a plugin that fails is reported here, with the file and key (before any model
    loads); another name is a model's, checked where it loads."""
    from . import drafters

    if name not in drafters.available():
        return
    try:
        drafters.load(name)
    except PluginError as exc:
        raise _located(exc, f"{source}: {key} = {name!r}: ") from exc.__cause__


def _located(exc: PluginError, where: str) -> PluginError:
    """``exc`` (a plugin's error) again, its message after ``where`` (the file, the key)."""
    try:
        return type(exc)(where + str(exc), plugin=exc.plugin, hook=exc.hook)
    except TypeError:  # a subclass built differently
        return PluginError(where + str(exc), plugin=exc.plugin, hook=exc.hook)


@dataclass
class Config:
    """The whole configuration: ``[policy]``, ``[generation]`` and ``[model]``."""

    policy: PolicyConfig = field(default_factory=PolicyConfig)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    model: ModelConfig = field(default_factory=ModelConfig)

    @classmethod
    def from_dict(
        cls,
        d: dict,
        *,
        source: str = "config",
        labels: dict[str, str] | None = None,
        build: tuple[str, ...] = ("policy", "model"),
    ) -> Config:
        """Validate ``d`` (a parsed TOML document) into a :class:`Config`: ``source``
        names where it came from in error messages (a file path), ``labels`` what a user
        typed instead of ``"table.key"`` (a flag such as ``"--temperature"``). The plugins
        of the tables in ``build`` (``[policy]``'s policy, ``[model]``'s installed drafter)
        are built once, so that one that fails, or options the policy refuses, are
        reported here."""
        if not isinstance(d, dict):
            raise ConfigError(f"{source}: expected a table of tables, got {type(d).__name__}")
        unknown = [k for k in d if k not in TABLES]
        if unknown:
            raise _unknown(source, "table", unknown, [f"[{t}]" for t in TABLES])
        # in order: a bad [policy] is reported before [generation]
        tables = {f.name: f.default_factory for f in fields(cls)}
        return cls(
            **{
                t: _table(d, t, make, source, labels or {}, t in build)
                for t, make in tables.items()
            }
        )

    def to_dict(self) -> dict:
        """The TOML-shaped dict (``None`` values left out, as TOML has no null)."""
        tables = asdict(self)  # a copy
        return {t: {k: v for k, v in keys.items() if v is not None} for t, keys in tables.items()}

    def _kwargs(self, call: str) -> dict:
        return {
            o.name: copy.copy(getattr(getattr(self, o.table), key))
            for table, keys in TABLES.items()
            for key, o in keys.items()
            if o.call == call
        }

    def generator_kwargs(self) -> dict:
        """Keyword arguments of :class:`bass.Generator`: the policy, its options, and
        ``[model]``'s attention, compile, cpu_linear and draft_sampling."""
        return self._kwargs("Generator")

    def generate_kwargs(self) -> dict:
        """Keyword arguments of :meth:`bass.Generator.generate`; ``None`` values (no limit,
        no seed, the default eos, ``do_sample`` not set) are left out so the callee's
        defaults apply."""
        return {k: v for k, v in self._kwargs("generate").items() if v is not None}


# --------------------------------------------------------------------------- files


def read_toml(path: str | os.PathLike) -> dict:
    """The parsed TOML document at ``path`` (unvalidated), with errors that name it."""
    path = Path(path)
    try:
        # a UTF-8 byte-order mark (Windows editors write one) is not TOML: read past it
        text = path.read_bytes().removeprefix(b"\xef\xbb\xbf").decode("utf-8")
        return tomllib.loads(text)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist; check the path") from None
    except IsADirectoryError:
        raise ConfigError(f"config file {path} is a directory; pass a .toml file") from None
    except OSError as exc:  # no permission, ...
        raise ConfigError(f"config file {path}: cannot read it: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{path}: not a TOML file: not UTF-8 text (byte at offset {exc.start}); pass a "
            "TOML text file (see `python -m pydoc bass.config`)"
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc


def load_config(path: str | os.PathLike) -> Config:
    """Read and validate the TOML config file at ``path``."""
    return Config.from_dict(read_toml(path), source=str(path))


def as_config(path_or_config: str | os.PathLike | Config | dict) -> Config:
    """A :class:`Config` from a config file's path, a :class:`Config` or a TOML-shaped
    dict (validated)."""
    if isinstance(path_or_config, Config):
        return path_or_config
    if isinstance(path_or_config, dict):
        return Config.from_dict(path_or_config)
    if isinstance(path_or_config, (str, os.PathLike)):
        return load_config(path_or_config)
    raise TypeError(
        "a config is a path to a TOML file, a bass.config.Config or a dict, "
        f"got {type(path_or_config).__name__}"
    )


options.use_config_reader(as_config)  # Generator(config=...) reads through it


def apply_config(path_or_config: str | os.PathLike | Config | dict) -> tuple[dict, dict]:
    """``(generator_kwargs, generate_kwargs)`` from a config file, a :class:`Config` or a
    TOML-shaped dict: ``Generator(main, draft, **g)`` then ``gen.generate(prompts, **r)``
    (``[model]``'s ``chat`` and ``dtype`` go to ``generate_text`` and ``from_pretrained``)."""
    config = as_config(path_or_config)
    return config.generator_kwargs(), config.generate_kwargs()
