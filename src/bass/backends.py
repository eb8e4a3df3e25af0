"""Device tuning, chosen once when a :class:`bass.Generator` is built and reported by
:meth:`Backend.describe` (``res.stats.backend``, ``bass ops``). :class:`GenericBackend`
does no tuning (CUDA graphs are ``compile="reduce-overhead"``); :class:`CPUBackend`:
docs/guides/performance.md, "CPU: the linear layers' layouts".
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from . import cpu_linear
from .cpu_linear import _check_mode

__all__ = [
    "PACKED_MEMORY_SHARE",
    "Backend",
    "CPUBackend",
    "GenericBackend",
    "available_memory",
    "select_backend",
]

#: The share of the free memory (``MemAvailable``) that the CPU backend's packed weight
#: copies may take; above it, ``cpu_linear="auto"`` uses the copy-free layouts only.
PACKED_MEMORY_SHARE = 0.5


def available_memory() -> int | None:
    """Bytes of memory available to new allocations (Linux ``MemAvailable``; the free
    physical pages elsewhere), or ``None`` when the system does not say."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


@dataclass
class Backend:
    """The device tuning of one Generator (the base does nothing)."""

    name: str = "generic"

    def logits_multiple(self, model: torch.nn.Module) -> int:
        """Pad the logit rows a pass of ``model`` computes to a multiple of this."""
        return 1

    def prepare(self, models: list[torch.nn.Module]) -> None:
        """Make ``models`` (the main model, then a draft model) ready; called once."""

    def refresh(self, models: list[torch.nn.Module]) -> None:
        """A generation starts: bring whatever the backend derived from the models'
        weights up to date with them (they may have changed since, in any way)."""

    def wrap(self, forward: Callable) -> Callable:
        """The function that runs a packed pass (``forward``'s signature)."""
        return forward

    def describe(self) -> dict:
        """What this backend chose, for ``res.stats.backend`` and ``bass ops``."""
        return {"name": self.name}


@dataclass
class GenericBackend(Backend):
    """No device tuning: CUDA, and any device without a backend of its own."""


@dataclass
class CPUBackend(Backend):
    """Linear layers in their measured-fastest layouts (:mod:`bass.cpu_linear`).

    ``mode``: ``"auto"`` (every layout, packed copies within the memory budget),
    ``"unpacked"`` (the two copy-free layouts), ``"torch"`` (``F.linear`` as is).
    ``memory_share``: the share of :func:`available_memory` the packed copies may take
    (checked against every linear weight of the models, an upper bound).
    """

    name: str = "cpu"
    mode: str = "auto"
    memory_share: float = PACKED_MEMORY_SHARE
    chosen: str = field(default="", init=False)  # the mode actually used
    reason: str = field(default="", init=False)
    packed_bytes: int = field(default=0, init=False)
    routed: bool = field(default=False, init=False)  # the main model's layers route
    check_seconds: float = field(default=0.0, init=False)  # the last refresh's time
    repacked: int = field(default=0, init=False)  # copies the last refresh packed again

    def __post_init__(self) -> None:
        _check_mode(self.mode)
        share = self.memory_share
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 <= share <= 1:
            raise ValueError(f"memory_share must be a number in [0, 1], got {share!r}")

    def logits_multiple(self, model: torch.nn.Module) -> int:
        if self.chosen not in ("", "torch") and cpu_linear.routing(model) is not None:
            return 1  # a calibrated lm head computes exactly the rows asked for
        # the lm head in torch's layout: 4 rows cost less than 2 or 3 (MKL; 21.5 ms for 2
        # rows of a 49152-token head, 16.5 for 4: bench/results/cpu_pass_cost.md)
        return 4

    def prepare(self, models: list[torch.nn.Module]) -> None:
        from . import compat

        mode = self.mode
        if mode == "auto":
            need = sum(cpu_linear.linear_bytes(m) for m in _each_once(models))
            free = available_memory()
            budget = None if free is None else int(self.memory_share * free)
            if budget is None or need > budget:
                mode = "unpacked"
                have = "unknown" if free is None else f"{free / 2**20:.0f} MiB"
                self.reason = (
                    f"packed copies would take up to {need / 2**20:.0f} MiB, over the budget "
                    f"of {self.memory_share:.0%} of the free memory ({have})"
                )
        if compat.tp_group(models[0]) is not None:
            # a tensor-parallel model's linear layers are transformers' own (sharded
            # weights, its communication around them): F.linear, for the draft too
            mode = "torch"
            self.reason = "tensor-parallel main model: its linear layers stay transformers'"
        plans = [cpu_linear.prepare(m, mode) for m in models]
        self.chosen = mode
        self.routed = plans[0] is not None
        self.packed_bytes = _packed_bytes(models)

    def refresh(self, models: list[torch.nn.Module]) -> None:
        """Pack again the copies whose weights changed (:func:`bass.cpu_linear.refresh`):
        the models' copies as they are now, whoever made them (another Generator of the
        same model installs its plan on it, and :meth:`wrap` routes through that)."""
        if self.chosen in ("", "torch"):
            return  # nothing routes in this Generator's passes
        self.packed_bytes = _packed_bytes(models)
        if self.packed_bytes == 0:
            return
        t0 = time.perf_counter()
        self.repacked = sum(cpu_linear.refresh(m) for m in _each_once(models))
        self.check_seconds = time.perf_counter() - t0

    def wrap(self, forward: Callable) -> Callable:
        if self.chosen == "torch" or not self.chosen:
            return forward  # routed layers (another Generator's) run F.linear here

        def routed(*args):
            with cpu_linear.active(True):
                return forward(*args)

        routed.__wrapped__ = forward
        return routed

    def describe(self) -> dict:
        out = {"name": self.name, "cpu_linear": self.chosen or self.mode}
        if self.chosen != self.mode:
            out["requested"] = self.mode
        if self.reason:
            out["reason"] = self.reason
        out["packed_copies_mib"] = round(self.packed_bytes / 2**20, 1)
        if self.packed_bytes:  # this generation's check of the packed weights
            out["weight_check_ms"] = round(1e3 * self.check_seconds, 1)
            out["repacked"] = self.repacked
        return out


def _each_once(models: list[torch.nn.Module]) -> list[torch.nn.Module]:
    """``models`` without repeats (``Generator(model, model)``: one model, one set of copies)."""
    return list({id(m): m for m in models}.values())


def _packed_bytes(models: list[torch.nn.Module]) -> int:
    return sum(cpu_linear.packed_bytes(m) for m in _each_once(models))


def select_backend(
    device: torch.device, cpu_linear: str = "auto", backend: Backend | None = None
) -> Backend:
    """The backend of a Generator whose main model is on ``device`` (``backend`` given:
    that one)."""
    if backend is not None:
        if not isinstance(backend, Backend):
            raise TypeError(
                f"backend must be a bass.backends.Backend, got {type(backend).__name__}"
            )
        return backend
    if device.type == "cpu":
        return CPUBackend(mode=cpu_linear)
    _check_mode(cpu_linear)
    return GenericBackend()
