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

import math
import os
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

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
    "load_config",
    "read_toml",
]

#: Allowed ``[model].dtype`` values.
DTYPES = ("float32", "float16", "bfloat16", "float64")


class ConfigError(ValueError):
    """A configuration value that is not allowed; the message says where and what to do."""


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


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


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
    t = "generation"
    if "max_new_tokens" in raw:
        v = raw["max_new_tokens"]
        if not _is_int(v) or v < 1:
            raise c.fail(t, "max_new_tokens", v, "an integer >= 1")
        g.max_new_tokens = v
    if "do_sample" in raw:
        v = raw["do_sample"]
        if not isinstance(v, bool):
            raise c.fail(t, "do_sample", v, "true or false")
        g.do_sample = v
    if "temperature" in raw:
        v = raw["temperature"]
        if not _is_number(v) or v < 0:
            raise c.fail(t, "temperature", v, "a finite number >= 0")
        g.temperature = float(v)
    if g.do_sample and g.temperature <= 0:
        raise c.fail(
            t,
            "temperature",
            g.temperature,
            "a number > 0 when do_sample is true (set do_sample = false for greedy decoding)",
        )
    if raw.get("top_k") is not None:
        v = raw["top_k"]
        if not _is_int(v) or v < 1:
            raise c.fail(t, "top_k", v, "an integer >= 1 (leave it out for no limit)")
        g.top_k = v
    if raw.get("top_p") is not None:
        v = raw["top_p"]
        if not _is_number(v) or not 0 < v <= 1:
            raise c.fail(t, "top_p", v, "a number with 0 < top_p <= 1 (leave it out for no limit)")
        g.top_p = float(v)
    if raw.get("seed") is not None:
        v = raw["seed"]
        if not _is_int(v) or not 0 <= v < 2**63:
            raise c.fail(t, "seed", v, "an integer >= 0")
        g.seed = v
    if raw.get("eos_token_id") is not None:
        v = raw["eos_token_id"]
        ids = v if isinstance(v, list) else [v]
        if not ids or not all(_is_int(i) and i >= 0 for i in ids):
            raise c.fail(t, "eos_token_id", v, "a token id >= 0 or a non-empty list of them")
        g.eos_token_id = list(v) if isinstance(v, list) else v
    if raw.get("time_budget") is not None:
        v = raw["time_budget"]
        if not _is_number(v) or v <= 0:
            raise c.fail(t, "time_budget", v, "a number of seconds > 0 (leave it out for none)")
        g.time_budget = float(v)
    if raw.get("stop_strings") is not None:
        v = raw["stop_strings"]
        if not isinstance(v, list) or not all(isinstance(s, str) and s for s in v):
            raise c.fail(t, "stop_strings", v, 'a list of non-empty strings, e.g. ["\\n\\n"]')
        g.stop_strings = list(v)
    return g


def _model(c: _Checker, raw: dict) -> ModelConfig:
    from . import ops  # registers the implementations; cheap (import bass did it already)

    m = ModelConfig()
    t = "model"
    for key in ("main", "draft"):
        if raw.get(key) is not None:
            v = raw[key]
            if not isinstance(v, str) or not v.strip():
                what = "a model name, directory or .gguf file" + (
                    ", 'ngram' or 'none'" if key == "draft" else ""
                )
                raise c.fail(t, key, v, what)
            setattr(m, key, v.strip())
    if "attention" in raw:
        v = raw["attention"]
        allowed = ["auto", *ops.packed.packed_implementations()]
        if v not in allowed:
            raise c.fail(t, "attention", v, f"one of {', '.join(allowed)} (available here)")
        m.attention = v
    if "dtype" in raw:
        v = raw["dtype"]
        if v not in DTYPES:
            raise c.fail(t, "dtype", v, f"one of {', '.join(DTYPES)}")
        m.dtype = v
    if raw.get("chat") is not None:
        v = raw["chat"]
        if not isinstance(v, bool):
            raise c.fail(t, "chat", v, "true or false (leave it out: when the tokenizer has one)")
        m.chat = v
    if raw.get("compile") is not None:
        v = raw["compile"]
        if v not in (True, False, "reduce-overhead"):
            raise c.fail(t, "compile", v, 'true, false or "reduce-overhead" (CUDA graphs)')
        m.compile = v
    if raw.get("cpu_linear") is not None:
        from .cpu_linear import MODES

        v = raw["cpu_linear"]
        if v not in MODES:
            raise c.fail(t, "cpu_linear", v, " or ".join(f'"{x}"' for x in MODES))
        m.cpu_linear = v
    return m


def _policy(c: _Checker, raw: dict) -> PolicyConfig:
    from . import policies

    p = PolicyConfig()
    name = raw.get("name", p.name)
    installed = list(policies.available())
    if name not in installed:
        shown = ", ".join(installed) or "(none installed)"
        raise c.fail("policy", "name", name, f"an installed policy: {shown} (see `bass policies`)")
    options = raw.get("options", {})
    if not isinstance(options, dict):
        raise c.fail("policy", "options", options, "a table ([policy.options] with key = value)")
    try:
        policies.load(name, **options)  # the policy validates its own options
    except (ValueError, TypeError, ImportError) as exc:
        raise ConfigError(
            f"{c.source}: {c.key('policy', 'options')} for policy {name!r}: {exc} "
            "(`bass policies` lists every option with its default)"
        ) from exc
    p.name, p.options = name, dict(options)
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
        with path.open("rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist; check the path") from None
    except IsADirectoryError:
        raise ConfigError(f"config file {path} is a directory; pass a .toml file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc


def load_config(path: str | os.PathLike) -> Config:
    """Read and validate the TOML config file at ``path``."""
    return Config.from_dict(read_toml(path), source=str(path))


def apply_config(path_or_config: str | os.PathLike | Config | dict) -> tuple[dict, dict]:
    """``(generator_kwargs, generate_kwargs)`` from a config file, a :class:`Config` or a
    TOML-shaped dict: ``Generator(main, draft, **g)`` then ``gen.generate(prompts, **r)``.
    """
    if isinstance(path_or_config, Config):
        config = path_or_config
    elif isinstance(path_or_config, dict):
        config = Config.from_dict(path_or_config)
    elif isinstance(path_or_config, (str, os.PathLike)):
        config = load_config(path_or_config)
    else:
        raise TypeError(
            "apply_config takes a path to a TOML file, a bass.config.Config or a dict, "
            f"got {type(path_or_config).__name__}"
        )
    return config.generator_kwargs(), config.generate_kwargs()
