"""A run's settings: the defaults, then ``--config FILE``, then the command-line flags."""

from __future__ import annotations

import argparse

from ..config import Config, ConfigError, read_toml
from ..errors import PluginLoadError
from ..options import LOGPROB_OPTIONS, OPTIONS
from .errors import UsageError, say
from .parser import flag_label

__all__ = ["FLAG_KEYS", "note_sampling", "resolve_config"]

#: argparse dest -> (the config key a flag overrides, the flag as an error names it), from
#: the declarations (bass.options) of the options that have a flag
FLAG_KEYS = {
    o.flag[2:].replace("-", "_"): (o.config_key, flag_label(o))
    for o in OPTIONS.values()
    if o.flag is not None and o.config_key is not None
}


def _merge(base: dict, over: dict) -> dict:
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in base.items()}
    for table, values in over.items():
        out.setdefault(table, {})
        if isinstance(out[table], dict) and isinstance(values, dict):
            out[table] = {**out[table], **values}
        else:
            out[table] = values
    return out


def resolve_config(args: argparse.Namespace, defaults: dict | None = None) -> Config:
    """defaults < ``defaults`` (a subcommand's own) < ``--config`` file < flags."""
    from .. import policies

    raw: dict = {}
    if args.config is not None and not args.config.strip():  # an unset $CONFIG: not ignored
        raise UsageError(f"--config {args.config!r}: pass the path of a TOML file")
    if args.config:
        raw = read_toml(args.config)
        # the file's own errors named by the file (its plugins built here unless flags
        # choose or set them: then below, once)
        Config.from_dict(raw, source=args.config, build=_from_file(args))
    layered = _merge(defaults or {}, raw)
    flags: dict[str, dict] = {}
    labels = {}
    for attr, (dotted, flag) in FLAG_KEYS.items():
        value = getattr(args, attr, None)
        if isinstance(value, list) and any(v == [] for v in value):  # `--stop=--`: argparse
            raise UsageError(  # takes the text -- as the end of the options, not a value
                f"{flag} --: the text -- is taken as the end of the options; write it "
                f"{flag} '\\-\\-' (\\- is a dash)"
            )
        if value is not None:
            table, key = dotted.split(".")
            flags.setdefault(table, {})[key] = value
            labels[dotted] = flag
    policy_raw = layered.get("policy", {})
    file_name = policy_raw.get("name", policies.DEFAULT)
    name = flags.get("policy", {}).get("name", file_name)
    if name != file_name and (dropped := layered.get("policy", {}).pop("options", None)):
        # options in the file belong to another policy: said, not dropped silently
        keys = ", ".join(sorted(dropped))
        if args.policy_option:  # the flags' options, the policy's defaults for the rest
            runs = f"--policy-option {' '.join(args.policy_option)} (its own defaults for the rest)"
            then = ", and left out"
        else:
            runs, then = "its own defaults", f" (set {name}'s with --policy-option)"
        say(
            f"note: --policy {name} runs with {runs}: the [policy.options] in {args.config} "
            f"({keys}) are for policy {file_name!r}{then}"
        )
    if args.policy_option:
        installed = list(policies.available())
        if name not in installed:
            raise ConfigError(
                f"command line: unknown policy {name!r}; installed: {', '.join(installed)}"
            )
        try:
            options = policies.parse_options(name, args.policy_option)
        except PluginLoadError:  # the policy does not load: reported below, as --policy's
            options = {}
        except ValueError as exc:
            raise ConfigError(f"command line: --policy-option: {exc}") from exc
        file_options = dict(layered.get("policy", {}).get("options", {}))
        flags.setdefault("policy", {})["options"] = {**file_options, **options}
        labels["policy.options"] = "--policy-option"
    merged = _merge(layered, flags)
    # what is wrong now comes of the flags, or of the flags with the file's keys (labelled
    # [table].key): say which file
    source = (
        "config"
        if not flags
        else f"{args.config} and the command line"
        if args.config
        else "command line"
    )
    built = _from_file(args) if args.config else ()
    rest = tuple(t for t in ("policy", "model") if t not in built)
    config = Config.from_dict(merged, source=source, labels=labels, build=rest)
    _check_draft_source(config, "--draft" if "model.draft" in labels else args.config)
    return config


def _from_file(args) -> tuple[str, ...]:
    """The tables whose plugin no flag chooses or sets up (``--policy``,
    ``--policy-option``, ``--draft``): built with the config file's keys alone."""
    chosen = {"policy": ("policy", "policy_option"), "model": ("draft",)}
    given = {
        a for attrs in chosen.values() for a in attrs if getattr(args, a, None) not in (None, [])
    }
    return tuple(t for t, attrs in chosen.items() if not given.intersection(attrs))


def _check_draft_source(config: Config, where: str | None) -> None:
    """A draft that is no installed drafter and no model here (a path that does not exist,
    a drafter's name mistyped), refused before anything loads, named as it was set:
    ``where`` is ``--draft`` or the config file (``None``: the default)."""
    from .. import drafters, models

    draft, installed = config.model.draft, tuple(drafters.available())
    if draft in ("none", *installed):
        return
    try:
        models.check_source(draft, installed)
    except models.ModelNotFoundError as exc:
        said = (
            f"command line: --draft = {draft!r}"
            if where == "--draft"
            else (f"{where}: [model].draft = {draft!r}" if where else f"[model].draft = {draft!r}")
        )
        raise ConfigError(f"{said}: {exc}", option="draft", value=draft) from None


def note_sampling(args, config: Config, n: int = 1) -> None:
    """Notes on stderr about sampling flags (and log-probabilities) that have no effect."""
    for key in LOGPROB_OPTIONS:
        if getattr(config.generation, key) and getattr(args, "output", None) is None:
            say(f"note: {key} are written to --output only, and none is given: add -o FILE.jsonl")
    if n > 1 and not config.generation.do_sample:
        say(
            f"note: greedy decoding gives {n} identical samples per prompt; add --sample "
            "(and --temperature) for distinct ones"
        )
    warps = ("temperature", "top_k", "top_p", "min_p")
    given = [f for f in warps if getattr(args, f, None) is not None]
    if given and not config.generation.do_sample:
        flags = ", ".join("--" + f.replace("_", "-") for f in given)
        verb = "applies" if len(given) == 1 else "apply"
        say(f"note: {flags} only {verb} with --sample (decoding is greedy)")
