"""Typed configuration: a TOML file <-> dataclasses, validated key by key.

A config file has three tables, all optional; a key left out keeps its default::

    # bass.toml
    [model]
    main = "HuggingFaceTB/SmolLM2-360M-Instruct"  # HF name, local dir or .gguf file;
                                                   # leave out for the embedded default
    draft = "ngram"        # a model (name/dir/.gguf), "ngram" (prompt lookup) or "none"
    attention = "auto"     # attention implementation: "auto", "reference", "sdpa" (CPU), ...
    compile = false        # true: torch.compile each pass; "reduce-overhead": CUDA graphs
    cpu_linear = "auto"    # CPU: GEMM layout per row count, measured ("unpacked", "torch")
    draft_sampling = "coupled"  # sampled drafts: coupled draws, or "rejection" sampling
    dtype = "float32"      # float32, float16, bfloat16 or float64
    chat = true            # apply the chat template (leave out: when the tokenizer has one)

    [generation]
    max_new_tokens = 128
    do_sample = false      # false: greedy; true: sample with the settings below
    temperature = 1.0
    top_k = 50             # leave out for no limit
    top_p = 0.95           # leave out for no limit
    seed = 0
    eos_token_id = 2       # an id or a list of ids; leave out for the tokenizer's
    time_budget = 30.0     # seconds per batch; leave out for none
    stop_strings = ["\\n\\n"]  # a row ends once its text contains one; leave out for none

    [policy]
    name = "adaptive"      # a draft-length policy: see `bass policies`

    [policy.options]       # that policy's options (`bass policies` lists them)
    k_max = 16

Use it with the engine::

    from bass.config import apply_config
    gen_kw, run_kw = apply_config("bass.toml")
    gen = Generator(main, draft, **gen_kw)
    res = gen.generate(prompts, **run_kw)

or on the command line: ``bass generate --config bass.toml "Hello"`` (flags override the
file, which overrides the defaults). Every problem raises :class:`ConfigError` naming the
file, the key (``[generation].temperature``), the value and what is allowed.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from . import options
from .options import DTYPES, OptionError
from .policies import DEFAULT as DEFAULT_POLICY

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    try:
        import tomli as tomllib
    except ImportError:
        tomllib = None

__all__ = [
    "DTYPES",
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


class ConfigError(OptionError):
    """A configuration value that is not allowed; the message says where and what to do
    (a ``ValueError``; a wrong type is also a ``TypeError``, as :class:`OptionError`)."""

    def __init__(self, message: str, *, option: str | None = None, value: Any = None):
        super().__init__(message, option=option, value=value)


@dataclass
class PolicyConfig:
    """``[policy]``: the draft-length policy's name and its options."""

    name: str = DEFAULT_POLICY
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class GenerationConfig:
    """``[generation]``: the keyword arguments of :meth:`bass.Generator.generate`."""

    max_new_tokens: int = 128
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    eos_token_id: int | list[int] | None = None
    time_budget: float | None = None
    stop_strings: list[str] | None = None


@dataclass
class ModelConfig:
    """``[model]``: which models to load and how to run their attention."""

    main: str | None = None  # None: the embedded default (SmolLM2-135M-Instruct GGUF)
    draft: str = "ngram"  # a model name/path, "ngram" or "none"
    attention: str = "auto"
    dtype: str = "float32"
    chat: bool | None = None  # None: when the tokenizer has a chat template
    compile: bool | str = False  # true: torch.compile the passes; "reduce-overhead": CUDA graphs
    cpu_linear: str = "auto"  # CPU GEMM layouts: "auto", "unpacked" or "torch"
    draft_sampling: str = "coupled"  # "coupled" (split-invariant samples) or "rejection"


_TABLES = {"policy": PolicyConfig, "generation": GenerationConfig, "model": ModelConfig}


def _allowed_keys(table: str) -> list[str]:
    return [f.name for f in fields(_TABLES[table])]


class _Checker:
    """Builds :class:`ConfigError` messages: where (file or command line), which key."""

    def __init__(self, source: str, labels: dict[str, str] | None = None):
        self.source = source
        self.labels = labels or {}

    def key(self, table: str, name: str | None = None) -> str:
        dotted = table if name is None else f"{table}.{name}"
        if dotted in self.labels:
            return self.labels[dotted]
        return f"[{table}]" if name is None else f"[{table}].{name}"

    def check(self, table: str, name: str, value: Any, option: str | None = None) -> Any:
        """``value`` of ``[table].name`` checked as :mod:`bass.options` checks ``option``
        (default: ``name``) wherever it comes from, named as the user spelled it."""
        return options.check(
            option or name, value, where=self.source, label=self.key(table, name), error=ConfigError
        )

    def fail(self, table: str, name: str | None, value: Any, allowed: str) -> ConfigError:
        where = self.key(table, name)
        return ConfigError(f"{self.source}: {where} = {value!r} is not allowed; expected {allowed}")

    def unknown(self, table: str | None, names: list[str], allowed: list[str]) -> ConfigError:
        what = "table" if table is None else f"key in [{table}]"
        shown = ", ".join(repr(n) for n in sorted(names))
        return ConfigError(
            f"{self.source}: unknown {what} {shown}; allowed: {', '.join(allowed)} "
            "(check the spelling; see the example in `python -m pydoc bass.config`)"
        )


def _table(c: _Checker, d: dict, name: str) -> dict:
    raw = d.get(name, {})
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise c.fail(name, None, raw, f"a table ([{name}] with key = value lines)")
    unknown = [k for k in raw if k not in _allowed_keys(name)]
    if unknown:
        raise c.unknown(name, unknown, _allowed_keys(name))
    return raw


def _generation(c: _Checker, raw: dict) -> GenerationConfig:
    g = GenerationConfig()
    for key in options.GENERATE:  # the same checks as generate()'s keyword arguments
        if raw.get(key) is not None:
            setattr(g, key, c.check("generation", key, raw[key]))
    if g.do_sample and g.temperature <= 0:
        raise options.fail(
            "temperature",
            g.temperature,
            options.SAMPLING_TEMPERATURE,
            where=c.source,
            label=c.key("generation", "temperature"),
            error=ConfigError,
        )
    return g


# [model] key -> its option (a model is named here, passed as an object to the API)
_MODEL_OPTIONS = {"main": "main_source", "draft": "draft_source"}


def _model(c: _Checker, raw: dict) -> ModelConfig:
    m = ModelConfig()
    for f in fields(ModelConfig):
        if raw.get(f.name) is not None:
            value = c.check("model", f.name, raw[f.name], _MODEL_OPTIONS.get(f.name, f.name))
            setattr(m, f.name, value)
    return m


def _policy(c: _Checker, raw: dict) -> PolicyConfig:
    from . import policies

    p = PolicyConfig()
    name = c.check("policy", "name", raw.get("name", p.name), "policy")
    opts = raw.get("options", {})
    opts = c.check("policy", "options", {} if opts is None else opts, "policy_options")
    try:
        policies.load(name, **opts)  # the policy validates its own options
    except (ValueError, TypeError, ImportError) as exc:
        raise ConfigError(
            f"{c.source}: {c.key('policy', 'options')} for policy {name!r}: {exc} "
            "(`bass policies` lists every option with its default)"
        ) from exc
    p.name, p.options = name, opts
    return p


@dataclass
class Config:
    """The whole configuration: ``[policy]``, ``[generation]`` and ``[model]``."""

    policy: PolicyConfig = field(default_factory=PolicyConfig)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    model: ModelConfig = field(default_factory=ModelConfig)

    @classmethod
    def from_dict(
        cls, d: dict, *, source: str = "config", labels: dict[str, str] | None = None
    ) -> Config:
        """Validate ``d`` (a parsed TOML document) into a :class:`Config`.

        ``source`` names where ``d`` came from in error messages (a file path);
        ``labels`` maps ``"table.key"`` to the name a user typed instead (a flag such as
        ``"--temperature"``), so a bad command-line value is reported by its flag.
        """
        c = _Checker(source, labels)
        if not isinstance(d, dict):
            raise ConfigError(f"{source}: expected a table of tables, got {type(d).__name__}")
        unknown = [k for k in d if k not in _TABLES]
        if unknown:
            raise c.unknown(None, unknown, [f"[{t}]" for t in _TABLES])
        return cls(
            policy=_policy(c, _table(c, d, "policy")),
            generation=_generation(c, _table(c, d, "generation")),
            model=_model(c, _table(c, d, "model")),
        )

    def to_dict(self) -> dict:
        """The TOML-shaped dict (``None`` values left out, as TOML has no null)."""
        out: dict[str, dict] = {}
        for name in _TABLES:
            section = getattr(self, name)
            out[name] = {
                f.name: getattr(section, f.name)
                for f in fields(section)
                if getattr(section, f.name) is not None
            }
        out["policy"]["options"] = dict(self.policy.options)
        return out

    def generator_kwargs(self) -> dict:
        """Keyword arguments of :class:`bass.Generator` (policy, its options, attention)."""
        return {
            "policy": self.policy.name,
            "policy_options": dict(self.policy.options),
            "attention": self.model.attention,
            "compile": self.model.compile,
            "cpu_linear": self.model.cpu_linear,
            "draft_sampling": self.model.draft_sampling,
        }

    def generate_kwargs(self) -> dict:
        """Keyword arguments of :meth:`bass.Generator.generate`; ``None`` values (no limit,
        no seed, the tokenizer's eos) are left out so the callee's defaults apply."""
        g = self.generation
        kw = {f.name: getattr(g, f.name) for f in fields(g)}
        return {k: v for k, v in kw.items() if v is not None}


def read_toml(path: str | os.PathLike) -> dict:
    """The parsed TOML document at ``path`` (unvalidated), with errors that name it."""
    path = Path(path)
    if tomllib is None:  # pragma: no cover - Python 3.10 without tomli
        raise ConfigError(
            f"{path}: reading TOML on Python < 3.11 needs the 'tomli' package; "
            "install it with: pip install tomli"
        )
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


def generator_defaults(config, main) -> tuple[dict, dict, bool | None]:
    """What a :class:`bass.Generator` built with ``config`` (``None``: no config) for the
    model ``main`` takes from it: ``(generator_kwargs, generate_kwargs, chat)`` (``chat``:
    ``generate_text``'s default). An ``eos_token_id`` outside ``main``'s vocabulary is
    refused here, naming the key, rather than at the first ``generate()``."""
    if config is None:
        return {}, {}, None
    cfg = as_config(config)
    defaults = cfg.generate_kwargs()
    if defaults.get("eos_token_id") is not None:  # needs the model
        vocab = main.get_output_embeddings().weight.shape[0]
        options.check("eos_token_id", defaults["eos_token_id"], where="Generator(config=...)",
                      label="[generation].eos_token_id", vocab=vocab)  # fmt: skip
    return cfg.generator_kwargs(), defaults, cfg.model.chat


def apply_config(path_or_config: str | os.PathLike | Config | dict) -> tuple[dict, dict]:
    """``(generator_kwargs, generate_kwargs)`` from a config file, a :class:`Config` or a
    TOML-shaped dict: ``Generator(main, draft, **g)`` then ``gen.generate(prompts, **r)``.
    (``[model]``'s ``chat`` and ``dtype`` are not among them: :class:`bass.Generator`
    applies them to ``generate_text`` and ``from_pretrained``.)
    """
    config = as_config(path_or_config)
    return config.generator_kwargs(), config.generate_kwargs()
