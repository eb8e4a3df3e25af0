"""The linear layers' matrix products on a CPU in the fastest of three layouts per row
count, measured on the model: docs/guides/performance.md ("CPU: the linear layers'
layouts", which also says how they are measured, routed and kept up to date).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import hashlib
import itertools
import json
import os
import platform
import re
import time
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from . import disk_cache

__all__ = [
    "ABOVE",
    "LAYOUTS",
    "MARGIN",
    "MODES",
    "ROWS",
    "LinearPlan",
    "active",
    "calibrate",
    "choose",
    "cpu_linear_op",
    "fingerprint",
    "install",
    "linear_bytes",
    "measured",
    "pack",
    "packed_bytes",
    "packed_linear",
    "prepare",
    "refresh",
    "routing",
    "transposed_linear",
    "uninstall",
]

ROWS = tuple(range(1, 17))  # row counts calibrated one by one
ABOVE = (32, 128)  # row counts measured for every count past ROWS' largest
MARGIN = 0.9  # another layout than torch's is kept where it takes at most this share of the time
LAYOUTS = ("torch", "transposed", "packed")  # their codes in the op's plan: 0, 1, 2
MODES = ("auto", "unpacked", "torch")  # Generator(cpu_linear=...)
_CODED = 30  # the op's plan holds a code per row count up to this one (2 bits each)
_PLAN = "_bass_cpu_linear_plan"
_ORIGINAL = "_bass_cpu_linear_original"
_CALIBRATION = "_bass_cpu_linear_calibration"
_ACTIVE = False  # inside one of bass's passes (active()): only then is anything routed

Shape = tuple[int, int, torch.dtype]  # (out, in, dtype) of a weight


@dataclass(frozen=True)
class LinearPlan:
    """Which layout each row count takes, per weight shape ``(out, in, dtype)``, and the
    timings it was chosen from (its fields: docs/guides/performance.md, "The plan")."""

    rows: dict[Shape, dict[int, str]]
    above: dict[Shape, str] = field(default_factory=dict)
    last: int = ROWS[-1]
    timings: dict[Shape, dict[int, dict[str, float]]] = field(default_factory=dict)
    swept: dict[Shape, int] = field(default_factory=dict)

    def layout(self, shape: Shape, m: int) -> str:
        """The layout a pass of ``m`` rows takes for weights of ``shape``."""
        if m > self.last:
            return self.above.get(shape, "torch")
        return self.rows.get(shape, {}).get(m, "torch")

    def code(self, shape: Shape) -> int:
        """The plan as one integer, as the op ``bass::cpu_linear`` takes it (2 bits per
        row count: docs/guides/performance.md, "The plan")."""
        out = LAYOUTS.index(self.layout(shape, _CODED + 1))
        for m in range(1, _CODED + 1):
            out |= LAYOUTS.index(self.layout(shape, m)) << (2 * m)
        return out

    def routes(self, shape: Shape) -> bool:
        """Whether weights of ``shape`` take another layout than torch's anywhere."""
        return bool(self.rows.get(shape)) or self.above.get(shape, "torch") != "torch"

    def packs(self, shape: Shape) -> bool:
        """Whether weights of ``shape`` take the packed layout somewhere (need a copy)."""
        return self.above.get(shape) == "packed" or "packed" in self.rows.get(shape, {}).values()

    def without_packed(self, margin: float = MARGIN) -> LinearPlan:
        """The plan chosen from the same timings with the packed layout left out (no
        timings: torch's layout where it was packed)."""
        if self.timings:
            return _plan_from(self.timings, self.swept, self.last, margin, LAYOUTS[:2])
        rows = {s: {m: k for m, k in r.items() if k != "packed"} for s, r in self.rows.items()}
        above = {s: k for s, k in self.above.items() if k != "packed"}
        return replace(self, rows=rows, above=above)

    def describe(self) -> str:
        """One line per weight shape: which row counts take which layout."""
        lines = []
        for shape in sorted(self.rows.keys() | self.above.keys(), key=lambda s: s[:2]):
            o, i, dt = shape
            by: dict[str, list[int]] = {}
            for m, k in self.rows.get(shape, {}).items():
                by.setdefault(k, []).append(m)
            parts = [f"{k} {_ranges(ms)}" for k, ms in sorted(by.items())]
            if self.above.get(shape, "torch") != "torch":
                parts.append(f"{self.above[shape]} above {self.last}")
            dtype = str(dt).removeprefix("torch.")
            lines.append(f"{o}x{i} {dtype}: {'; '.join(parts) or 'torch layout only'}")
        return "\n".join(lines)


def _ranges(rows: Iterable[int]) -> str:
    """``1-3, 5, 7-8`` for ``[1, 2, 3, 5, 7, 8]``: runs of consecutive counts."""
    pairs = itertools.groupby(enumerate(sorted(rows)), key=lambda im: im[1] - im[0])
    runs = [[m for _, m in run] for _, run in pairs]
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def _cpu_linears(model: torch.nn.Module) -> list[torch.nn.Linear]:
    return [
        m
        for m in model.modules()
        if isinstance(m, torch.nn.Linear)
        and m.weight.device.type == "cpu"
        and m.weight.dtype.is_floating_point
        and m.weight.dim() == 2
    ]


def _shape(m: torch.nn.Linear) -> Shape:
    return (m.weight.shape[0], m.weight.shape[1], m.weight.dtype)


def transposed_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None):
    """``F.linear(x, weight, bias)`` computed as ``(weight @ x^T)^T`` (contiguous; a single
    row goes in twice: docs/guides/performance.md, "The layouts")."""
    x2 = x.reshape(-1, x.shape[-1])
    one = x2.shape[0] == 1
    if one:
        x2 = torch.cat([x2, x2])
    if bias is None:
        y = torch.mm(weight, x2.t())
    else:
        y = torch.addmm(bias.unsqueeze(1), weight, x2.t())
    if one:
        y = y[:, :1]
    return y.t().contiguous().view(*x.shape[:-1], weight.shape[0])


def pack(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` reordered into oneDNN's blocked layout (an opaque copy for
    :func:`packed_linear`). Raises where the build or the dtype has no such layout."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach())


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None):
    """``F.linear(x, weight, bias)`` by oneDNN, ``packed`` being :func:`pack` of ``weight``."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def _packable(weights: list[tuple[torch.Tensor, torch.Tensor | None]]) -> list | None:
    """The packed copies of ``weights``, or ``None`` where packing fails or a packed
    product computes other numbers than ``F.linear`` beyond rounding."""
    try:
        w, b = weights[0]
        first = pack(w)  # checked before the others are copied
        x = torch.randn(3, w.shape[1], dtype=w.dtype)
        want = F.linear(x, w, b).double()
        got = packed_linear(x, first, b).double()
        tol = 16 * torch.finfo(w.dtype).eps * (w.shape[1] ** 0.5)
        if got.shape != want.shape or not torch.allclose(got, want, rtol=tol, atol=tol):
            return None
        return [first] + [pack(w) for w, _ in weights[1:]]
    except (RuntimeError, AttributeError, NotImplementedError):
        return None


def calibrate(
    model: torch.nn.Module,
    rows: Iterable[int] = ROWS,
    *,
    above: Iterable[int] = ABOVE,
    rounds: int = 2,
    budget_bytes: int = 48 << 20,
    margin: float = MARGIN,
    packed: bool = True,
) -> LinearPlan:
    """Time the layouts (``packed=False``: the two that need no copy) on ``model``'s CPU
    linear layers, per weight shape, per row count in ``rows`` and in ``above`` (standing
    for every larger count), and return the plan: another layout than torch's where it
    takes at most ``margin`` of torch's time. Best of ``rounds``, each sweep over at least
    ``budget_bytes`` of weights (how: docs/guides/performance.md, "Measuring")."""
    if not 0.0 < margin <= 1.0:
        raise ValueError(f"margin must be in (0, 1], got {margin}")
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    groups: dict[Shape, list[torch.nn.Linear]] = {}
    for m in _cpu_linears(model):
        groups.setdefault(_shape(m), []).append(m)
    rows = sorted({int(r) for r in rows if int(r) >= 1})
    last = rows[-1] if rows else 0
    points = rows + sorted({int(a) for a in above if int(a) > last})
    timings: dict[Shape, dict[int, dict[str, float]]] = {}
    swept: dict[Shape, int] = {}
    with torch.inference_mode():
        for shape, mods in groups.items():
            o, i, dtype = shape
            per = o * i * torch.finfo(dtype).bits // 8
            mods = mods[: max(1, -(-budget_bytes // per))]  # enough to leave the caches
            weights = [(m.weight, m.bias) for m in mods]
            swept[shape] = per * len(weights)
            calls = {
                "torch": [(F.linear, w, b) for w, b in weights],
                "transposed": [(transposed_linear, w, b) for w, b in weights],
            }
            packs = _packable(weights) if packed else None
            if packs is not None:
                calls["packed"] = [(packed_linear, p, b) for p, (_, b) in zip(packs, weights)]
            best = {r: dict.fromkeys(calls, float("inf")) for r in points}
            xs = {r: torch.randn(r, i, dtype=dtype) for r in points}
            for cs in calls.values():  # warm-up: first calls allocate, BLAS picks its kernels
                for f, w, b in cs[:2]:
                    f(xs[points[0]], w, b)
            order = list(calls)
            for rnd in range(rounds):
                for r in points:
                    for k in order if rnd % 2 == 0 else order[::-1]:  # alternate the order
                        t0 = time.perf_counter()
                        for f, w, b in calls[k]:
                            f(xs[r], w, b)
                        best[r][k] = min(best[r][k], time.perf_counter() - t0)
            timings[shape] = best
            del packs, calls
    return _plan_from(timings, swept, last, margin, LAYOUTS)


CACHE_VARIABLE = "BASS_CPU_LINEAR_CACHE"


def _machine() -> str:
    """What the timings depend on besides the shapes: the CPU, its threads, torch's build."""
    try:
        cpu = re.search(r"model name\s*:\s*(.*)", Path("/proc/cpuinfo").read_text()).group(1)
    except (OSError, AttributeError):  # not Linux
        cpu = platform.processor() or platform.machine()
    mkldnn = torch.backends.mkldnn.is_available()
    return f"{cpu}|{os.cpu_count()}|{torch.get_num_threads()}|{torch.__version__}|{mkldnn}"


def measured(model: torch.nn.Module) -> LinearPlan:
    """:func:`calibrate` with its defaults, through the cache on disk
    (``$BASS_CPU_LINEAR_CACHE``: docs/guides/performance.md)."""
    counts = collections.Counter(_shape(m) for m in _cpu_linears(model))
    folder = disk_cache.root(CACHE_VARIABLE, "cpu_linear")
    shapes = sorted([o, i, str(dt), n] for (o, i, dt), n in counts.items())
    ident = json.dumps([1, _machine(), ROWS, ABOVE, MARGIN, shapes])
    name = hashlib.sha256(ident.encode()).hexdigest()[:24]
    path = folder / f"{name}.json" if folder is not None else None
    stored = disk_cache.read_json(path) if path is not None else None
    if isinstance(stored, dict) and stored.get("ident") == ident:
        with contextlib.suppress(KeyError, TypeError, ValueError, AttributeError):
            timings, swept = {}, {}
            for o, i, dt, t, nbytes in stored["shapes"]:
                shape = (int(o), int(i), getattr(torch, dt.removeprefix("torch.")))
                timings[shape] = {int(r): dict(ts) for r, ts in t.items()}
                swept[shape] = int(nbytes)
            return _plan_from(timings, swept, int(stored["last"]), MARGIN, LAYOUTS)
    plan = calibrate(model)
    if path is not None:
        rows = [[*s[:2], str(s[2]), t, plan.swept[s]] for s, t in plan.timings.items()]
        disk_cache.write_json(
            path, {"ident": ident, "last": plan.last, "shapes": rows}, CACHE_VARIABLE
        )
    return plan


def _plan_from(timings, swept, last: int, margin: float, layouts: tuple[str, ...]) -> LinearPlan:
    rows, above = {}, {}
    for shape, t in timings.items():
        t = {r: {k: s for k, s in ts.items() if k in layouts} for r, ts in t.items()}
        rows[shape] = {
            r: k for r, ts in t.items() if r <= last and (k := choose(ts, margin)) != "torch"
        }
        past = {choose(ts, margin) for r, ts in t.items() if r > last}
        if len(past) == 1 and (k := past.pop()) != "torch":
            above[shape] = k  # every count measured past `last` agrees
    return LinearPlan(rows, above, last, timings, swept)


def choose(timings: dict[str, float], margin: float = MARGIN) -> str:
    """The fastest layout of ``timings`` (``{layout: seconds}``) if it took at most
    ``margin`` of torch's time, else ``"torch"``.

    >>> choose({"torch": 1.0, "transposed": 0.5, "packed": 0.6})
    'transposed'
    >>> choose({"torch": 1.0, "transposed": 0.95})
    'torch'
    """
    k = min((k for k in timings if k != "torch"), key=timings.__getitem__, default="torch")
    return k if k != "torch" and timings[k] <= margin * timings["torch"] else "torch"


@contextlib.contextmanager
def active(on: bool = True) -> Iterator[None]:
    """Inside, installed layers take their planned layouts (``on=False``: ``F.linear``,
    as everywhere outside)."""
    global _ACTIVE
    previous, _ACTIVE = _ACTIVE, on
    try:
        yield
    finally:
        _ACTIVE = previous


# the packed copies, by handle: [weight's data_ptr, its version, the copy, the layer that
# owns it (a weak reference; its collection frees the copy), the weight's fingerprint, the
# weight packed (a weak reference: which tensor it was)]
_PACKS: dict[int, list] = {}
_HANDLES = itertools.count()
_HANDLE = "_bass_cpu_linear_pack"  # a routed layer's handle (-1: none) and plan code
_CODE = "_bass_cpu_linear_code"
# element size -> the integers its bit patterns are read as (a float64 as two int32)
_BITS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int32}
# fingerprint: each block of _BLOCK elements (in memory order) is summed with four vectors of
# seeded pseudo-random multipliers in [1, 2**12). A bit pattern is at most 2**31 in size, so
# every partial sum stays below 2**10 * 2**31 * 2**12 = 2**53: float64 (BLAS) sums them
# exactly, in any order.
_BLOCK = 1024
_MULTIPLIERS = (
    np.random.default_rng(0x0BA55).integers(1, 2**12, size=(_BLOCK, 4)).astype(np.float64)
)
_TILE = 128  # blocks converted to float64 at a time (1 MiB: stays in cache)


def _version(t: torch.Tensor) -> int:
    try:
        return t._version
    except RuntimeError:  # an inference tensor keeps no version counter
        return -1


def fingerprint(weight: torch.Tensor) -> tuple:
    """What :func:`refresh` compares: ``weight``'s shape and dtype, and four sums over each
    block of 1024 of its elements (in memory order) of their bit patterns as integers, each
    times a seeded pseudo-random multiplier in [1, 4096), computed exactly. It costs about
    one read of the weight.

    Not exact: a change to the weight's bits is missed if it leaves all four sums of every
    block equal. A change with a block in which exactly one element changed (a single
    element, a swap of two elements of different blocks) is always found. Any other change
    (sign flips, scalings, permutations, small perturbations), made without regard to the
    fixed multipliers, is missed with probability at most ``4095**-4`` (about ``2**-48``);
    one computed from the multipliers can pass (docs/guides/performance.md, "Weight
    changes")."""
    w = weight.detach()
    if not w.is_contiguous():
        w = w.contiguous()
    x = w.view(_BITS[w.element_size()]).numpy().reshape(-1)
    full, rest = divmod(x.size, _BLOCK)
    sums = np.empty((full + (rest > 0), _MULTIPLIERS.shape[1]), np.float64)
    blocks = x[: full * _BLOCK].reshape(full, _BLOCK)
    tile = np.empty((min(_TILE, full), _BLOCK), np.float64)
    for start in range(0, full, _TILE):  # in tiles: no float64 copy of the whole weight
        t = tile[: min(_TILE, full - start)]
        np.copyto(t, blocks[start : start + _TILE])
        np.matmul(t, _MULTIPLIERS, out=sums[start : start + len(t)])
    if rest:
        sums[full] = x[full * _BLOCK :].astype(np.float64) @ _MULTIPLIERS[:rest]
    return tuple(w.shape), w.dtype, sums.tobytes()


def _repack(entry: list, weight: torch.Tensor) -> None:
    try:
        copy = pack(weight)
    except RuntimeError:  # e.g. the model was cast to a dtype oneDNN lacks
        copy = None
    entry[:3] = weight.data_ptr(), _version(weight), copy
    entry[4:6] = fingerprint(weight), weakref.ref(weight)


def _packed(handle: int, weight: torch.Tensor) -> torch.Tensor | None:
    """The packed copy held under ``handle`` (``None``: unknown), packed again if
    ``weight`` was replaced or its version counter moved. A replacement is another tensor
    (a new one may take a freed weight's address, at the same version: its address and
    version alone would not tell), or the same one at another address (``.data = t``)."""
    entry = _PACKS.get(handle)
    if entry is None:
        return None
    if entry[5]() is not weight or entry[0] != weight.data_ptr() or entry[1] != _version(weight):
        _repack(entry, weight)
    return entry[2]


def refresh(model: torch.nn.Module) -> int:
    """Pack again every packed copy of ``model``'s routed layers whose weight changed since,
    in any way (docs/guides/performance.md, "Weight changes"). Returns how many copies were
    packed again."""
    repacked = 0
    with torch.no_grad():
        for handle in _owned(model)[0]:
            entry = _PACKS[handle]
            w = entry[3]().weight  # the owning layer's (a copy of the model has its own)
            moved = entry[5]() is not w or entry[0] != w.data_ptr() or entry[1] != _version(w)
            if moved or entry[4] != fingerprint(w):
                _repack(entry, w)
                repacked += 1
    return repacked


def _owned(model: torch.nn.Module) -> tuple[set[int], bool]:
    """The handles of the packed copies ``model``'s layers own, and whether every routed
    layer holds one of them (not one a ``copy.deepcopy`` of the model inherited)."""
    layers = {id(m) for m in model.modules()}
    own = {h for h, e in _PACKS.items() if id(e[3]()) in layers}  # (a dead owner: id(None))
    held = [m.__dict__[_HANDLE] for m in model.modules() if m.__dict__.get(_HANDLE, -1) >= 0]
    return own, all(h in own for h in held)


_lib = torch.library.Library("bass", "FRAGMENT")
_lib.define("cpu_linear(Tensor x, Tensor weight, Tensor? bias, int plan, int handle=-1) -> Tensor")


def cpu_linear_op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, plan: int,
                  handle: int = -1) -> torch.Tensor:  # fmt: skip
    """``F.linear(x, weight, bias)`` in the layout ``plan`` (:meth:`LinearPlan.code`) names
    for ``x``'s row count, the packed one taking the copy held under ``handle``
    (``F.linear`` where there is none): the CPU kernel of the op ``bass::cpu_linear``."""
    m = x.numel() // x.shape[-1] if x.shape[-1] else 0
    code = ((plan >> (2 * m)) & 3 if m <= _CODED else plan & 3) if m else 0
    if code == 1:
        return transposed_linear(x, weight, bias)
    if code == 2 and (p := _packed(handle, weight)) is not None:
        return packed_linear(x, p, bias)
    return F.linear(x, weight, bias)


_lib.impl("cpu_linear", cpu_linear_op, "CPU")


@torch.library.register_fake("bass::cpu_linear", lib=_lib)
def _(x, weight, bias, plan, handle=-1):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def _routed_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """The forward :func:`install` binds to a routed layer (a ``functools.partial`` of a
    module-level function, not a closure nor a bound method, for ``copy.deepcopy`` and
    pickling, ``torch.save(model)``: docs/guides/performance.md, "Routing")."""
    w, b = self.weight, self.bias
    if not _ACTIVE or x.device.type != "cpu" or x.dim() == 0:
        return F.linear(x, w, b)
    if torch.is_autocast_enabled("cpu"):  # autocast casts F.linear's inputs (oneDNN's op:
        return F.linear(x, w, b)  # not), so precision would depend on the layout
    if torch.is_grad_enabled() and (w.requires_grad or x.requires_grad):
        return F.linear(x, w, b)  # autograd goes through torch's own op
    plan, handle = getattr(self, _CODE), getattr(self, _HANDLE)
    if torch.compiler.is_compiling():
        return torch.ops.bass.cpu_linear(x, w, b, plan, handle)
    return cpu_linear_op(x, w, b, plan, handle)  # eager: the op's kernel, no dispatch


def install(model: torch.nn.Module, plan: LinearPlan) -> int:
    """Route ``model``'s CPU linear layers by ``plan`` and make the packed copies it needs
    (one per weight); returns how many layers were routed. Calling it again replaces the
    previous routing; :func:`uninstall` removes it."""
    uninstall(model)
    routed = 0
    handles: dict[int, int] = {}  # weight data_ptr -> handle
    for m in _cpu_linears(model):
        shape = _shape(m)
        if not plan.routes(shape) or type(m).forward is not torch.nn.Linear.forward:
            continue  # nothing to route, or a subclass with a forward of its own
        handle = -1
        if plan.packs(shape):
            ptr = m.weight.data_ptr()
            if ptr not in handles:  # a new packed copy, owned by m
                handles[ptr] = h = next(_HANDLES)
                _PACKS[h] = entry = [0, 0, None, weakref.ref(m), None, None]
                _repack(entry, m.weight)
                weakref.finalize(m, _PACKS.pop, h, None)
            handle = handles[ptr]
        setattr(m, _ORIGINAL, m.__dict__.get("forward"))
        setattr(m, _HANDLE, handle)
        setattr(m, _CODE, plan.code(shape))
        m.forward = functools.partial(_routed_forward, m)
        routed += 1
    setattr(model, _PLAN, plan)
    return routed


def uninstall(model: torch.nn.Module) -> None:
    """Give every linear layer of ``model`` its own forward back and free the packed copies
    its layers own."""
    for h in _owned(model)[0]:
        _PACKS.pop(h, None)
    for m in model.modules():
        if _ORIGINAL in m.__dict__:
            had = m.__dict__.pop(_ORIGINAL)
            for name in (_HANDLE, _CODE):
                m.__dict__.pop(name, None)
            if had is None:
                m.__dict__.pop("forward", None)
            else:
                m.forward = had
    model.__dict__.pop(_PLAN, None)
    model.__dict__.pop(_CALIBRATION, None)


def packed_bytes(model: torch.nn.Module) -> int:
    """Bytes of the packed copies of ``model``'s routed layers (of the weights copied; a
    weight oneDNN could not pack, in a dtype it lacks, has none)."""
    own = _owned(model)[0]
    seen = {m.__dict__[_HANDLE]: m.weight for m in model.modules() if _HANDLE in m.__dict__}
    held = {h for h in own if _PACKS[h][2] is not None}
    return sum(w.numel() * w.element_size() for h, w in seen.items() if h in held)


def linear_bytes(model: torch.nn.Module) -> int:
    """Bytes of ``model``'s CPU linear weights (each shared weight once): what packed
    copies of all of them would take, an upper bound of :func:`packed_bytes`."""
    seen = {m.weight.data_ptr(): m.weight for m in _cpu_linears(model)}
    return sum(w.numel() * w.element_size() for w in seen.values())


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"cpu_linear must be one of {', '.join(map(repr, MODES))}, got {mode!r}")


def routing(model: torch.nn.Module) -> LinearPlan | None:
    """The plan installed on ``model``, or ``None``."""
    return model.__dict__.get(_PLAN)


def prepare(model: torch.nn.Module, mode: str = "auto") -> LinearPlan | None:
    """What the Generator calls: ``"auto"`` calibrates ``model`` once (:func:`measured`)
    and installs the plan, ``"unpacked"`` the same plan without the packed layout,
    ``"torch"`` nothing (docs/guides/performance.md, "Modes"). Returns the plan installed,
    or ``None``."""
    _check_mode(mode)
    if mode == "torch" or not _cpu_linears(model):
        return None
    base = model.__dict__.get(_CALIBRATION) or routing(model) or measured(model)
    want = base if mode == "auto" else base.without_packed()
    if routing(model) != want or not _owned(model)[1]:
        install(model, want)  # (a deepcopy of a routed model: its own copies)
    setattr(model, _CALIBRATION, base)
    return want
