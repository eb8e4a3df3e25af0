"""Draft-length policies: how many tokens to draft per speculative step, as plugins.

A policy subclasses :class:`Policy` (:mod:`bass.hooks` declares its hooks with their
defaults; :func:`bind` resolves them once per generation) and is registered under the
``bass.policies`` entry-point group (:mod:`bass.policies.registry`). The built-ins, how to
choose one and how to write one: docs/guides/policies.md.

Typical use::

    policy = bass.policies.load("bass", l0=5)
    for option, default, help in bass.policies.describe("bass"): ...
"""

from __future__ import annotations

from ..hooks import DraftContext, EarlyStop, Policy, StepRecord
from .base import PolicyHooks, bind, is_policy
from .registry import (
    GROUP,
    REQUIRED,
    OptionInfo,
    PolicyLoadError,
    available,
    describe,
    load,
    make,
    parse_options,
)

#: The policy of :class:`bass.Generator`, the CLI and the config when none is named.
DEFAULT = "adaptive"

__all__ = [
    "DEFAULT",
    "GROUP",
    "REQUIRED",
    "DraftContext",
    "EarlyStop",
    "OptionInfo",
    "Policy",
    "PolicyHooks",
    "PolicyLoadError",
    "StepRecord",
    "available",
    "bind",
    "describe",
    "is_policy",
    "load",
    "make",
    "parse_options",
]
