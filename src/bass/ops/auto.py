"""``impl="auto"``: which implementation runs a call, from measured benchmark data.

The BASS paper leaves open when padding the batch (BASS-PAD) beats one problem per row
(BASS-SPLIT): it depends on the batch size, the query length, the context length and how
far the rows' lengths spread. bass does not guess: ``bench/bench_kernels.py`` times every
implementation on a grid of those shapes, and ``bench/calibrate_auto.py`` turns that run
into a *rule file* ``auto_rules/<device key>.json`` (this package's data): the measured
points and, at each, every implementation's time. ``auto`` describes the call by four
features and runs the fastest available implementation at the nearest measured point.

Features of a call (:class:`Features`): batch ``B``, query length ``T`` (the padded
width), the longest ``kv_len``, the *fill* ``mean(kv_lens) / max(kv_lens)`` (1: every row
as long as the longest; small: a few long rows among short ones) and the head geometry
(query heads, KV heads, head dim: a 135M model's 9/3/64 heads and a 7B model's 32/8/128
heads do not cross over at the same batch size). The lengths come from, in order:

1. a :func:`length_hint` the caller set (for callers that know the lengths on the host
   while ``kv_lens`` lives on a GPU; bass's own engine plans its packed passes from host
   lengths instead, :mod:`bass.ops.plan`);
2. ``kv_lens`` itself when it is an ordinary CPU tensor (reading it costs nothing);
3. the shapes alone: ``max_kv = S`` (the cache's capacity) and fill 1.

Under ``torch.compile`` (and for fake or CUDA tensors without a hint) only the shapes are
used, so the choice is fixed when the graph is traced and never reads device memory; with
dynamic (symbolic) shapes ``auto`` uses the static order below.

Your own calibration (another CPU, another GPU) goes in a directory named by
``$BASS_AUTO_RULES``, which is searched before the packaged rules (``nox -s calibrate``
or ``bench/calibrate_auto.py --out DIR``).

A device without a rule file (or a call whose nearest point names no implementation that
is available here) falls back to the registry's static order: the available
implementation with the highest ``priority`` among those registered with ``in_auto``.
Only implementations named in a rule file are eligible through it: a kernel enters
``auto`` on a device by being calibrated there, after its tests passed there.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import json
import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch

__all__ = [
    "RULES_DIR",
    "Features",
    "Rule",
    "choose",
    "clear_caches",
    "device_key",
    "features",
    "length_hint",
    "load_rule",
    "rules_dirs",
]

RULES_DIR = Path(__file__).with_name("auto_rules")
# Distance weights: a factor 2 in B, T, max_kv, KV width (Hkv * D) or group size
# (Hq / Hkv) costs 1; a fill difference of 0.125 too. Padding wins only when lengths are
# nearly even, so fill separates the decisions sharply (leave-one-out on the CPU grid:
# weight 8 picks the fastest at 138 of 160 points, weight 4 at 120).
FILL_WEIGHT = 8.0

_HINT: contextvars.ContextVar[tuple[int, float] | None] = contextvars.ContextVar(
    "bass_length_hint", default=None
)


class Features(NamedTuple):  # a NamedTuple: built on every call, cheaper than a dataclass
    """What ``auto`` knows of a call: ``B``, ``T``, the longest kv_len, the fill and the
    head geometry."""

    batch: int
    q_len: int
    max_kv: int
    fill: float  # mean(kv_lens) / max(kv_lens), in (0, 1]; 1 when unknown
    heads: tuple[int, int, int] = (32, 8, 128)  # (Hq, Hkv, D)

    def key(self) -> tuple:
        """A coarse, hashable version (quarter-octaves of max_kv, fill to 0.05) so that
        nearby calls share one cached decision."""
        return (
            self.batch,
            self.q_len,
            round(math.log2(max(self.max_kv, 1)) * 4) / 4,
            round(self.fill * 20) / 20,
            self.heads,
        )


def _stats(kv_lens: Sequence[int]) -> tuple[int, float]:
    top = max(kv_lens, default=0)
    fill = (sum(kv_lens) / len(kv_lens)) / top if top > 0 else 1.0
    return top, fill


@contextlib.contextmanager
def length_hint(kv_lens: Sequence[int]) -> Iterator[None]:
    """Tell ``auto`` the rows' ``kv_len`` values for the calls inside the block.

    For callers that know the lengths on the host while ``kv_lens`` lives on a GPU
    (reading it there would cost a device sync per call). A wrong hint never changes a
    result, only which implementation computes it.

        >>> import bass
        >>> with bass.ops.length_hint([512, 40, 700]):
        ...     pass  # torch.ops.bass.ragged_attention(...) calls here use the hint
    """
    token = _HINT.set(_stats([int(x) for x in kv_lens]))
    try:
        yield
    finally:
        _HINT.reset(token)


def features(q: torch.Tensor, k: torch.Tensor, kv_lens: torch.Tensor) -> Features | None:
    """The :class:`Features` of a call (see the module docstring for the sources);
    ``None`` when a shape is symbolic (dynamic-shape tracing: deciding on its value would
    specialise the graph), which leaves ``auto`` to the static order."""
    B, Hq, T, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    if not all(type(n) is int for n in (B, Hq, T, D, Hkv, S)):
        return None
    heads = (Hq, Hkv, D)
    if not torch.compiler.is_compiling():
        hint = _HINT.get()
        if hint is not None:
            return Features(B, T, hint[0], hint[1], heads)
        if type(kv_lens) is torch.Tensor and kv_lens.device.type == "cpu":
            top, fill = _stats(kv_lens.tolist())
            return Features(B, T, top, fill, heads)
    return Features(B, T, S, 1.0, heads)


def device_key(device: torch.device) -> str:
    """The rule file a device uses: ``cpu``, or ``cuda-sm<major><minor>``."""
    if device.type == "cuda":
        return _cuda_key(device.index if device.index is not None else -1)
    return device.type


@functools.cache
def _cuda_key(index: int) -> str:
    major, minor = torch.cuda.get_device_capability(None if index < 0 else index)
    return f"cuda-sm{major}{minor}"


@dataclass(frozen=True, eq=False)
class Point:
    batch: int
    q_len: int
    max_kv: int
    fill: float
    us: dict[str, float]  # implementation -> median microseconds
    heads: tuple[int, int, int] = (32, 8, 128)

    def distance(self, f: Features) -> float:
        (hq, hkv, d), (fq, fkv, fd) = self.heads, f.heads
        return math.sqrt(
            _log2_ratio(self.batch, f.batch) ** 2
            + _log2_ratio(self.q_len, f.q_len) ** 2
            + _log2_ratio(self.max_kv, f.max_kv) ** 2
            + (FILL_WEIGHT * (self.fill - f.fill)) ** 2
            + _log2_ratio(hkv * d, fkv * fd) ** 2
            + _log2_ratio(hq // max(hkv, 1), fq // max(fkv, 1)) ** 2
        )


def _log2_ratio(a: int, b: int) -> float:
    return math.log2(max(a, 1) / max(b, 1))


@dataclass(frozen=True, eq=False)
class Rule:
    """A calibrated rule: measured points, each with every implementation's time."""

    device_key: str
    implementations: tuple[str, ...]
    points: tuple[Point, ...]
    source: str = ""

    @classmethod
    def from_dict(cls, data: dict) -> Rule:
        points = tuple(
            Point(
                int(p["B"]),
                int(p["T"]),
                int(p["max_kv"]),
                float(p["fill"]),
                dict(p["us"]),
                tuple(int(x) for x in p.get("heads", (32, 8, 128))),
            )
            for p in data["points"]
        )
        if not points:
            raise ValueError("a rule needs at least one measured point")
        return cls(
            data["device_key"], tuple(data["implementations"]), points, data.get("source", "")
        )

    def nearest(self, f: Features) -> Point:
        return min(self.points, key=lambda p: p.distance(f))

    def choose(self, f: Features, allowed: Sequence[str]) -> str | None:
        """The fastest implementation in ``allowed`` at the point nearest ``f``
        (``None`` when that point timed none of them)."""
        us = self.nearest(f).us
        timed = [(us[n], n) for n in allowed if n in us and n in self.implementations]
        return min(timed)[1] if timed else None


def rules_dirs() -> list[Path]:
    """Where rules are looked up, first match wins: ``$BASS_AUTO_RULES`` (a directory of
    your own calibrations, e.g. ``calibrate_auto.py --out``), then bass's packaged rules."""
    env = os.environ.get("BASS_AUTO_RULES")
    return [Path(env).expanduser(), RULES_DIR] if env else [RULES_DIR]


@functools.cache
def load_rule(key: str) -> Rule | None:
    """The rule for device key ``key`` (``None`` when no file exists for it in
    :func:`rules_dirs`); read once per process."""
    path = next((d / f"{key}.json" for d in rules_dirs() if (d / f"{key}.json").is_file()), None)
    if path is None:
        return None
    try:
        return Rule.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise RuntimeError(
            f"the auto rule {path} is unreadable ({e}); regenerate it with "
            "`python bench/calibrate_auto.py` or delete it to fall back to the static order"
        ) from e


_GENERATION = [0]


def generation() -> int:
    """Bumped by :func:`clear_caches`: callers that cache decisions key them on it."""
    return _GENERATION[0]


def clear_caches() -> None:
    """Forget loaded rules and cached decisions (after changing :data:`RULES_DIR` or
    ``$BASS_AUTO_RULES``)."""
    _GENERATION[0] += 1
    load_rule.cache_clear()


def choose(device: torch.device, f: Features, allowed: Sequence[str]) -> str | None:
    """The rule's pick for ``f`` among ``allowed`` on ``device`` (``None``: no rule, or
    it timed none of them there). Decided at ``f``'s coarse :meth:`Features.key`, so
    every call sharing a key (which callers may cache on) gets the same answer."""
    rule = load_rule(device_key(device))
    if rule is None:
        return None
    B, T, log_kv, fill, heads = f.key()
    return rule.choose(Features(B, T, round(2**log_kv), fill, heads), allowed)
