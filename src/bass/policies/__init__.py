"""Draft-length policies: how many tokens to draft per speculative step, as plugins.

A policy subclasses :class:`Policy` (:mod:`bass.hooks` declares its hooks with their
defaults: ``draft_length()`` or ``draft_lengths(ctx)`` per row, ``early_stop(ctx)`` for a
per-row early stop, ``update(record)``; :func:`bind` resolves them once per generation)
and is registered under the ``bass.policies`` entry-point group. Built-ins
(:mod:`bass.policies.builtin`, :mod:`bass.policies.goodput`):

* ``adaptive`` (:mod:`bass.policies.adaptive`), the default: each row's draft length
  maximises the batch's expected tokens per second, from measured pass costs and per-row
  acceptance (never drafts when that is predicted not to pay).
* ``constant``: always ``k`` tokens (``k=0``: regular decoding).
* ``bass``: Algorithm 1 of the BASS paper (arXiv 2404.15778), exactly.
* ``hf-heuristic``: transformers' assisted-generation schedule (+2 / -1).
* ``confidence``: a fixed cap plus per-row early exit on low draft confidence
  (training-free, after AdaEDL and DISCO).
* ``goodput``: maximises expected tokens per second from measured acceptance and timings
  (after SmartSpec).

Typical use::

    policy = bass.policies.load("bass", l0=5)
    for option, default, help in bass.policies.describe("bass"): ...

:func:`available` lists what is installed; ``bass.policies.registry.entry_points`` is the
single function reading installed metadata (monkeypatch it in tests).
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
