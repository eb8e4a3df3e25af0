"""Draft-length policies: :class:`Policy` plugins of entry-point group ``bass.policies``
(the built-ins, choosing and writing one: docs/guides/policies.md).

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
    maker,
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
    "maker",
    "parse_options",
]
