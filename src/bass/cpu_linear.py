"""The linear layers' matrix products on a CPU, in the faster of two layouts per row count.

A linear layer computes ``y = x W^T`` for ``x [M, in]`` and ``W [out, in]``; torch's
``F.linear`` hands the BLAS ``x`` times ``W^T``. The same numbers come out of
``(W x^T)^T``: ``W`` times the ``M`` columns of ``x^T``, transposed back. Which of the
two runs faster depends on ``M``, the weight's shape, the BLAS and the CPU: on the 2-core
AMD EPYC with MKL this was measured on, a whole pass of the embedded SmolLM2-135M
computing 2-4 tokens took 0.4-0.55x the time with the second layout, one token (its row
fed twice: see :func:`transposed_linear`) about 0.6x, and the two were mixed above 8
(``bench/results/cpu_pass_cost.md``). Decode and verify passes compute few tokens per
row, which is exactly that range.

:func:`calibrate` times both layouts on the model's own layers, for every row count
``M`` in :data:`ROWS` (interleaved, best of ``rounds``, each sweep over at least
``budget_bytes`` of weights of one shape, more than a CPU's last-level cache holds, so
they come from memory as in a real pass), and keeps the second layout only where it is
faster by :data:`MARGIN`. :func:`install`
routes each ``nn.Linear`` accordingly: a Python membership test per call (a
``torch.compile``d pass calls the custom op ``bass::cpu_linear``, which reads the row
count at run time: one graph for every token count), nothing off the CPU, and nothing
outside bass's own passes (:func:`active`, entered by :func:`bass.hf.run_packed`): the
model's other callers, ``model.generate`` included, run ``F.linear`` as before. The
:class:`bass.Generator` does both for CPU models unless ``cpu_linear="torch"``; the
plan is kept on the model (one calibration per model and process; about 2 s for the
135M model on 2 cores). Results differ from ``F.linear``'s by float rounding only.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

__all__ = [
    "MARGIN",
    "MODES",
    "ROWS",
    "LinearPlan",
    "active",
    "calibrate",
    "choose",
    "cpu_linear_op",
    "install",
    "prepare",
    "prepare_all",
    "routing",
    "row_mask",
    "transposed_linear",
    "uninstall",
]

ROWS = tuple(range(1, 17))  # row counts calibrated; larger passes keep torch's layout
MARGIN = 0.9  # the transposed layout is kept where it takes at most this share of the time
MODES = ("auto", "torch")  # Generator(cpu_linear=...)
_PLAN = "_bass_cpu_linear_plan"
_ORIGINAL = "_bass_cpu_linear_original"
_ACTIVE = False  # inside one of bass's passes (active()): only then is anything routed

Shape = tuple[int, int, torch.dtype]  # (out, in, dtype) of a weight


@dataclass(frozen=True)
class LinearPlan:
    """Per weight shape ``(out, in, dtype)``: the row counts computed as ``(W x^T)^T``;
    ``timings`` what was measured, best of the rounds (``{shape: {M: (torch_s,
    transposed_s)}}``, seconds per sweep)."""

    transposed: dict[Shape, frozenset[int]]
    timings: dict[Shape, dict[int, tuple[float, float]]] = field(default_factory=dict)

    def describe(self) -> str:
        """One line per weight shape: which row counts take the transposed layout."""
        lines = []
        for (o, i, dt), rows in sorted(self.transposed.items(), key=lambda kv: kv[0][:2]):
            dtype = str(dt).removeprefix("torch.")
            lines.append(f"{o}x{i} {dtype}: {_ranges(rows) or 'torch layout only'}")
        return "\n".join(lines)


def _ranges(rows: Iterable[int]) -> str:
    out, run = [], []
    for m in sorted(rows):
        if run and m != run[-1] + 1:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
            run = []
        run.append(m)
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ", ".join(out)


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
    """``F.linear(x, weight, bias)`` computed as ``(weight @ x^T)^T`` (contiguous). A single
    row goes in twice: ``weight`` times one column is a matrix-vector product, which some
    BLAS builds run far slower than a matrix product of two columns (MKL on the machine of
    the module docstring: 3x slower)."""
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


def calibrate(
    model: torch.nn.Module,
    rows: Iterable[int] = ROWS,
    *,
    rounds: int = 2,
    budget_bytes: int = 48 << 20,
    margin: float = MARGIN,
) -> LinearPlan:
    """Time ``F.linear`` against the transposed layout on ``model``'s CPU linear layers
    (per weight shape, per row count in ``rows``) and return the plan (see the module
    docstring)."""
    if not 0.0 < margin <= 1.0:
        raise ValueError(f"margin must be in (0, 1], got {margin}")
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    groups: dict[Shape, list[torch.nn.Linear]] = {}
    for m in _cpu_linears(model):
        groups.setdefault(_shape(m), []).append(m)
    rows = sorted({int(r) for r in rows if int(r) >= 1})
    plan, timings = {}, {}
    if not rows:
        return LinearPlan({shape: frozenset() for shape in groups})
    with torch.inference_mode():
        for shape, mods in groups.items():
            o, i, dtype = shape
            per = o * i * torch.finfo(dtype).bits // 8
            mods = mods[: max(1, -(-budget_bytes // per))]  # enough to leave the caches
            weights = [(m.weight, m.bias) for m in mods]
            layouts = (F.linear, transposed_linear)
            best = {(r, k): float("inf") for r in rows for k in range(2)}
            xs = {r: torch.randn(r, i, dtype=dtype) for r in rows}
            for k in range(2):  # warm-up: first calls allocate, BLAS picks its kernels
                for w, b in weights[:2]:
                    layouts[k](xs[rows[0]], w, b)
            for rnd in range(rounds):
                for r in rows:
                    for k in (0, 1) if rnd % 2 == 0 else (1, 0):  # alternate the order
                        t0 = time.perf_counter()
                        for w, b in weights:
                            layouts[k](xs[r], w, b)
                        best[(r, k)] = min(best[(r, k)], time.perf_counter() - t0)
            timings[shape] = {r: (best[(r, 0)], best[(r, 1)]) for r in rows}
            plan[shape] = choose(timings[shape], margin)
    return LinearPlan(plan, timings)


def choose(timings: dict[int, tuple[float, float]], margin: float = MARGIN) -> frozenset[int]:
    """The row counts whose transposed layout took at most ``margin`` of torch's time
    (``timings[M] = (torch_s, transposed_s)``).

    >>> sorted(choose({2: (1.0, 0.5), 3: (1.0, 0.95), 4: (1.0, 2.0)}))
    [2]
    """
    return frozenset(r for r, (a, b) in timings.items() if b <= margin * a)


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


_lib = torch.library.Library("bass", "FRAGMENT")
_lib.define("cpu_linear(Tensor x, Tensor weight, Tensor? bias, int rows) -> Tensor")


def row_mask(rows: Iterable[int]) -> int:
    """The bit mask :func:`cpu_linear_op` takes: bit ``M`` set for each row count ``M`` in
    ``rows`` (counts >= 63 cannot be marked: they keep torch's layout).

    >>> row_mask([1, 3])
    10
    """
    return sum(1 << int(m) for m in set(rows) if 0 < int(m) < 63)


def cpu_linear_op(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, rows: int
) -> torch.Tensor:
    """``F.linear(x, weight, bias)``, through :func:`transposed_linear` when ``x``'s row
    count ``M`` has its bit set in ``rows`` (:func:`row_mask`): the CPU kernel of the op
    ``bass::cpu_linear`` a ``torch.compile``d pass calls (one opaque op, so the row count,
    a dynamic dimension there, is read at run time, not guarded on). Registered with
    ``torch.library.Library`` (a plain kernel and a fake), not ``custom_op``, whose Python
    wrapper costs more than the layout saves on a small matrix (a pass calls the op seven
    times per layer)."""
    m = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if 0 < m < 63 and (rows >> m) & 1:
        return transposed_linear(x, weight, bias)
    return F.linear(x, weight, bias)


_lib.impl("cpu_linear", cpu_linear_op, "CPU")


@torch.library.register_fake("bass::cpu_linear", lib=_lib)
def _(x, weight, bias, rows):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def _routed_forward(module: torch.nn.Linear, rows: frozenset[int]):
    mask = row_mask(rows)

    def forward(x: torch.Tensor) -> torch.Tensor:
        w, b = module.weight, module.bias
        if not _ACTIVE or x.device.type != "cpu" or x.dim() == 0:
            return F.linear(x, w, b)
        if torch.compiler.is_compiling():
            return torch.ops.bass.cpu_linear(x, w, b, mask)
        return cpu_linear_op(x, w, b, mask)  # eager: the op's kernel, without dispatch

    return forward


def install(model: torch.nn.Module, plan: LinearPlan) -> int:
    """Route ``model``'s CPU linear layers by ``plan``; returns how many were routed (a
    layer whose shape never takes the transposed layout keeps its own forward). Calling
    it again replaces the previous routing; :func:`uninstall` removes it."""
    uninstall(model)
    routed = 0
    for m in _cpu_linears(model):
        rows = plan.transposed.get(_shape(m), frozenset())
        if not rows or type(m).forward is not torch.nn.Linear.forward:
            continue  # nothing to route, or a subclass with a forward of its own
        had = m.__dict__.get("forward")
        setattr(m, _ORIGINAL, had)
        m.forward = _routed_forward(m, rows)
        routed += 1
    setattr(model, _PLAN, plan)
    return routed


def uninstall(model: torch.nn.Module) -> None:
    """Give every linear layer of ``model`` its own forward back."""
    for m in model.modules():
        if _ORIGINAL in m.__dict__:
            had = m.__dict__.pop(_ORIGINAL)
            if had is None:
                m.__dict__.pop("forward", None)
            else:
                m.forward = had
    model.__dict__.pop(_PLAN, None)


def prepare_all(mode: str, *models: torch.nn.Module | None) -> list[LinearPlan | None]:
    """:func:`prepare` (which checks ``mode``) for each model given, ``None`` entries
    skipped."""
    return [prepare(m, mode) for m in models if m is not None]


def routing(model: torch.nn.Module) -> LinearPlan | None:
    """The plan installed on ``model``, or ``None``."""
    return model.__dict__.get(_PLAN)


def prepare(model: torch.nn.Module, mode: str = "auto") -> LinearPlan | None:
    """What the Generator calls: ``"auto"`` calibrates ``model`` (once: the plan is kept
    on it) and installs the plan when its weights are on the CPU; ``"torch"`` does
    nothing (that Generator's passes do not route: see :func:`bass.hf.run_packed`, so
    other Generators of the model keep theirs)."""
    if mode not in MODES:
        raise ValueError(f"cpu_linear must be one of {', '.join(map(repr, MODES))}, got {mode!r}")
    if mode == "torch":
        return None
    if not _cpu_linears(model):
        return None
    plan = routing(model)
    if plan is None:
        plan = calibrate(model)
        install(model, plan)
    return plan
