"""The ``torch.ops.bass`` custom ops: ragged attention and the ragged KV append.

Importing this module (``import bass`` does) registers, in namespace ``bass``:

* ``bass::ragged_attention(q, k, v, q_lens, kv_lens, scale, impl="auto")``: the public
  contract (see :func:`ragged_attention`). It is a CompositeImplicitAutograd op that
  validates its inputs, picks an implementation once from shapes and device, and calls
  that implementation's op ``bass::ragged_attention_<impl>``. Under ``torch.compile`` the
  graph therefore holds the implementation op itself, so a Triton implementation
  registered with ``torch.library.triton_op`` stays visible to Inductor.
* ``bass::ragged_attention_reference``: the pure-PyTorch oracle (CPU and CUDA).
* ``bass::kv_append(k_cache, v_cache, k_new, v_new, cache_lens, new_lens)``: writes a
  step's new keys/values into a preallocated cache at per-row offsets (mutates the cache).
* the packed forms ``bass::ragged_attention_packed`` and ``bass::kv_append_packed``
  (:mod:`bass.ops.packed`): every row's new tokens in one flat ``[1, N]`` batch with
  per-row offsets ``cu_q_lens`` int32 ``[B+1]``: what the engine's passes use.

The ragged convention, used everywhere in bass: a batch of B rows, each with its own
length, stored padded; lengths are int32 tensors of shape [B] (never Python lists, which
would recompile on every new value). Padding slots hold :data:`PAD_OUTPUT` in outputs.

Worked example: ``q_lens = [2, 0, 1]``, ``kv_lens = [5, 3, 1]``, ``T = 2``. Row 0's two
queries sit at positions 3 and 4 and see keys 0..3 and 0..4; row 1 has no query (its two
output slots are 0); row 2's single query sits at position 0 and sees key 0, and its
slot 1 is padding (0).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from . import auto, reference, sdpa
from .auto import length_hint
from .checks import (
    LENGTH_DTYPE,
    check_append_inputs,
    check_attention_inputs,
    check_no_grad,
    length_checks,
)

__all__ = [
    "LENGTH_DTYPE",
    "PAD_OUTPUT",
    "QUERY_BUCKETS",
    "Implementation",
    "available_implementations",
    "bucket_query_len",
    "kv_append",
    "kv_append_packed",
    "length_checks",
    "length_hint",
    "ragged_attention",
    "ragged_attention_packed",
    "refresh_availability",
    "register_implementation",
    "resolve_implementation",
]

PAD_OUTPUT = 0.0  # value of ragged_attention's output in padding query slots
# Query lengths a compiled caller should pad T to, so a whole generation compiles a
# handful of graphs instead of one per draft length (true lengths travel in q_lens).
QUERY_BUCKETS = (1, 2, 4, 8, 16, 32, 64)

_lib = torch.library.Library("bass", "DEF")
_lib.define(
    "ragged_attention(Tensor q, Tensor k, Tensor v, Tensor q_lens, Tensor kv_lens, "
    "float scale, str impl='auto') -> Tensor"
)


# --------------------------------------------------------------------------- registry


@dataclass(frozen=True)
class Implementation:
    """One implementation of ``ragged_attention``.

    ``op`` has the schema ``(q, k, v, q_lens, kv_lens, scale) -> out`` and the same
    semantics; ``devices`` lists the device types it runs on; ``available`` says whether
    it can run in this process (e.g. Triton importable, CUTLASS library built).
    ``priority`` orders the candidates of ``impl="auto"`` (higher first); an
    implementation with ``in_auto=False`` is only used when named explicitly.
    ``host_lengths``: it reads the length tensors on the host (free on a CPU, a device
    sync per call elsewhere), so the ops' ``auto`` takes it on a CPU only; a planned pass
    (:mod:`bass.ops.plan`) hands it the lengths it holds on the host instead. ``plan``
    (packed implementations): ``plan(packed_plan) -> run(q, k, v, scale)``, the per-pass
    work done once from the plan's host lengths (default: ``op`` with the pass's tensors).
    """

    name: str
    op: Callable[..., torch.Tensor]
    devices: tuple[str, ...]
    available: Callable[[], bool] = lambda: True
    priority: int = 0
    description: str = ""
    in_auto: bool = True
    host_lengths: bool = False
    plan: Callable | None = None


_IMPLEMENTATIONS: dict[str, Implementation] = {}
_VERSION = [0]  # bumped by every registration: keys the caches below
_RUNNABLE: dict[tuple, list[Implementation]] = {}
_AUTO_PICKS: dict[tuple, Implementation] = {}  # auto's decisions, by device and features


def register_implementation(impl: Implementation) -> None:
    """Add (or replace) an implementation selectable as ``impl=<name>``."""
    if impl.name == "auto":
        raise ValueError("'auto' is reserved for automatic selection")
    _IMPLEMENTATIONS[impl.name] = impl
    refresh_availability()


_ON_REFRESH: list[Callable[[], None]] = []  # other caches of decisions (the packed ops')


def refresh_availability() -> None:
    """Forget which implementations can run here (``auto`` caches it per device type);
    call it after making one available, e.g. after building the CUTLASS library."""
    _VERSION[0] += 1
    _RUNNABLE.clear()
    _AUTO_PICKS.clear()
    auto.clear_caches()
    for forget in _ON_REFRESH:
        forget()


def _runnable(device_type: str) -> list[Implementation]:
    key = (id(_IMPLEMENTATIONS), _VERSION[0], device_type)
    found = _RUNNABLE.get(key)
    if found is None:
        found = [i for i in _IMPLEMENTATIONS.values() if device_type in i.devices and i.available()]
        _RUNNABLE[key] = found
    return found


def _available_names(registry: dict[str, Implementation], device) -> list[str]:
    kind = None if device is None else torch.device(device).type
    return [n for n, i in registry.items() if (kind is None or kind in i.devices) and i.available()]


def available_implementations(device: str | torch.device | None = None) -> list[str]:
    """Names of the implementations that can run here (on ``device``'s type, if given)."""
    return _available_names(_IMPLEMENTATIONS, device)


def _named_implementation(
    registry: dict[str, Implementation], op: str, impl: str, device: torch.device
) -> Implementation:
    """``registry[impl]`` if it runs on ``device`` here, else an error that says why and
    what to use instead (shared by ``ragged_attention`` and ``ragged_attention_packed``)."""
    found = registry.get(impl)
    if found is None:
        names = ", ".join(["auto", *registry])
        raise ValueError(f"unknown {op} implementation {impl!r}; registered: {names}")
    if device.type not in found.devices:
        raise ValueError(
            f"{op} implementation {impl!r} runs on {', '.join(found.devices)}, "
            f"not {device.type}; use impl='auto' or one of {_available_names(registry, device)}"
        )
    if not found.available():
        raise RuntimeError(
            f"{op} implementation {impl!r} is not available in this process "
            f"({found.description}); available on {device.type}: "
            f"{_available_names(registry, device)}"
        )
    return found


def _highest_priority(
    candidates: list[Implementation], op: str, device: torch.device
) -> Implementation:
    """The static order of ``auto``: the candidate of highest priority registered with
    ``in_auto`` (``candidates`` must already be the ones available on ``device``)."""
    candidates = [i for i in candidates if i.in_auto]
    if not candidates:
        raise RuntimeError(f"no {op} implementation runs on {device}")
    return max(candidates, key=lambda i: i.priority)


def resolve_implementation(
    impl: str, device: torch.device, features: auto.Features | None = None
) -> Implementation:
    """The implementation ``impl`` names for ``device``; ``"auto"`` picks one.

    ``auto`` uses the device's calibrated rule at ``features`` when both exist (see
    :mod:`bass.ops.auto`), else the highest-priority available implementation registered
    with ``in_auto``. Nothing here reads device memory, so it is safe in a compiled graph.
    """
    if impl == "auto":
        key = (
            id(_IMPLEMENTATIONS),
            _VERSION[0],
            auto.generation(),
            device.type,
            device.index,
            None if features is None else features.key(),
        )
        found = _AUTO_PICKS.get(key)
        if found is None:
            found = _AUTO_PICKS[key] = _auto_pick(device, features)
            if len(_AUTO_PICKS) > 1 << 16:  # bounded: a long run sees many lengths
                _AUTO_PICKS.clear()
        return found
    return _named_implementation(_IMPLEMENTATIONS, "ragged_attention", impl, device)


def _auto_pick(device: torch.device, features: auto.Features | None) -> Implementation:
    runnable = _runnable(device.type)
    if features is not None:
        picked = auto.choose(device, features, [i.name for i in runnable])
        if picked is not None:
            return _IMPLEMENTATIONS[picked]
    return _highest_priority(runnable, "ragged_attention", device)


def bucket_query_len(t: int) -> int:
    """The smallest bucket in :data:`QUERY_BUCKETS` that holds ``t`` query tokens
    (multiples of the largest bucket beyond it)."""
    for b in QUERY_BUCKETS:
        if t <= b:
            return b
    top = QUERY_BUCKETS[-1]
    return -(-t // top) * top


# --------------------------------------------------------------------------- pure-PyTorch ops


def register_torch_implementation(
    name: str, fn: Callable[..., torch.Tensor], *, devices: tuple[str, ...], **kw
) -> Implementation:
    """Register ``fn(q, k, v, q_lens, kv_lens, scale) -> out`` (PyTorch code, or a launcher
    of precompiled kernels such as ``cutlass``) as the custom op
    ``bass::ragged_attention_<name>`` with kernels for ``devices`` only and a shape-only
    fake (a contiguous ``[B, Hq, T, D]``), and as ``impl=<name>``. Opaque to Inductor:
    kernels that Inductor should see into register through ``torch.library.triton_op``
    instead (see ``triton_fused``)."""

    def kernel(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        q_lens: torch.Tensor,
        kv_lens: torch.Tensor,
        scale: float,
    ) -> torch.Tensor:
        return fn(q, k, v, q_lens, kv_lens, scale).contiguous()

    op = torch.library.custom_op(
        f"bass::ragged_attention_{name}", kernel, mutates_args=(), device_types=devices
    )
    op.register_fake(lambda q, k, v, q_lens, kv_lens, scale: q.new_empty(q.shape))
    impl = Implementation(
        name=name,
        op=getattr(torch.ops.bass, f"ragged_attention_{name}").default,
        devices=devices,
        **kw,
    )
    register_implementation(impl)
    return impl


register_torch_implementation(
    "reference",
    reference.ragged_attention,
    devices=("cpu", "cuda"),
    priority=0,
    description="pure PyTorch, masked dense attention over the whole cache",
)
register_torch_implementation(
    "sdpa",
    sdpa.ragged_attention,
    devices=("cpu",),
    priority=1,
    description="F.scaled_dot_product_attention per row on its own slices (CPU)",
)
register_torch_implementation(
    "sdpa_padded",
    sdpa.ragged_attention_padded,
    devices=("cpu",),
    priority=0,
    # Only through the calibrated CPU rule: it loses to "sdpa" when lengths spread.
    in_auto=False,
    description="one F.scaled_dot_product_attention over rows padded to the longest kv_len "
    "with a length mask (CPU)",
)


# --------------------------------------------------------------------------- public op


def ragged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_lens: torch.Tensor,
    kv_lens: torch.Tensor,
    scale: float,
    impl: str = "auto",
) -> torch.Tensor:
    """Causal attention of ragged new queries over per-row KV caches.

    ``torch.ops.bass.ragged_attention(q, k, v, q_lens, kv_lens, scale)`` (this function
    calls it). Row ``b``'s query ``i < q_lens[b]`` sits at absolute position
    ``kv_lens[b] - q_lens[b] + i`` and attends to keys ``0..`` that position of row ``b``.
    Query slots ``i >= q_lens[b]`` are padding and their output is 0.

    Args:
        q: ``[B, Hq, T, D]`` queries (torch SDPA's and transformers' layout); float16,
            bfloat16, float32 or float64.
        k: ``[B, Hkv, S, D]`` per-row key cache, same dtype; ``Hq`` is a multiple of
            ``Hkv`` (GQA/MQA: query head ``h`` uses KV head ``h // (Hq // Hkv)``).
        v: ``[B, Hkv, S, D]`` per-row value cache.
        q_lens: int32 ``[B]``, ``0 <= q_lens[b] <= min(T, kv_lens[b])``.
        kv_lens: int32 ``[B]``, ``kv_lens[b] <= S``; the new keys are already in the cache.
        scale: softmax scale, usually ``D ** -0.5``.
        impl: ``"auto"`` (default), ``"reference"`` or another registered implementation
            (see :func:`available_implementations`).

    Returns:
        ``[B, Hq, T, D]`` in q's dtype, contiguous whatever q's strides (every
        implementation and its fake agree on that, so Inductor's stride checks hold).

    Inference only: inputs requiring grad raise. In eager mode the lengths are range-
    checked on the host (see :func:`length_checks` to skip that in a trusted hot loop).

    Example (row 0: two new tokens after three cached; row 1: one token, no history)::

        >>> import torch, bass
        >>> q = torch.randn(2, 4, 2, 8)                    # B=2, Hq=4, T=2, D=8
        >>> k, v = torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)  # Hkv=2, S=5
        >>> q_lens = torch.tensor([2, 1], dtype=torch.int32)
        >>> kv_lens = torch.tensor([5, 1], dtype=torch.int32)
        >>> out = torch.ops.bass.ragged_attention(q, k, v, q_lens, kv_lens, 8 ** -0.5)
        >>> out.shape
        torch.Size([2, 4, 2, 8])
        >>> bool((out[1, :, 1] == 0).all())               # row 1's slot 1 is padding
        True
    """
    return torch.ops.bass.ragged_attention(q, k, v, q_lens, kv_lens, scale, impl)


def _ragged_attention_composite(q, k, v, q_lens, kv_lens, scale, impl="auto"):
    check_attention_inputs(q, k, v, q_lens, kv_lens, scale)
    check_no_grad("bass.ragged_attention", q=q, k=k, v=v)
    features = auto.features(q, k, kv_lens) if impl == "auto" else None
    return resolve_implementation(impl, q.device, features).op(q, k, v, q_lens, kv_lens, scale)


_lib.impl("ragged_attention", _ragged_attention_composite, "CompositeImplicitAutograd")


# --------------------------------------------------------------------------- kv append


@torch.library.custom_op("bass::kv_append", mutates_args=("k_cache", "v_cache"))
def _kv_append(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    cache_lens: torch.Tensor,
    new_lens: torch.Tensor,
) -> None:
    check_append_inputs(k_cache, v_cache, k_new, v_new, cache_lens, new_lens)
    check_no_grad("bass.kv_append", k_new=k_new, v_new=v_new)
    reference.kv_append(k_cache, v_cache, k_new, v_new, cache_lens, new_lens)


@_kv_append.register_fake
def _(k_cache, v_cache, k_new, v_new, cache_lens, new_lens):
    check_append_inputs(k_cache, v_cache, k_new, v_new, cache_lens, new_lens)


def kv_append(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    cache_lens: torch.Tensor,
    new_lens: torch.Tensor,
) -> None:
    """Write a step's new keys and values into per-row caches, in place.

    ``torch.ops.bass.kv_append(k_cache, v_cache, k_new, v_new, cache_lens, new_lens)``
    (this function calls it). For every row ``b`` and ``i < new_lens[b]``::

        k_cache[b, :, cache_lens[b] + i] = k_new[b, :, i]     (and the same for v)

    Nothing else in the caches changes. The caller advances its lengths itself
    (``cache_lens + new_lens``); the op returns nothing.

    Args:
        k_cache, v_cache: ``[B, Hkv, S, D]`` preallocated caches (mutated).
        k_new, v_new: ``[B, Hkv, T, D]`` new entries, ``T <= S``; slots
            ``i >= new_lens[b]`` are padding and are ignored.
        cache_lens: int32 ``[B]``, each row's current length (where its first new entry
            goes).
        new_lens: int32 ``[B]``, ``new_lens[b] <= T`` and
            ``cache_lens[b] + new_lens[b] <= S``.

    Example::

        >>> import torch, bass
        >>> kc, vc = torch.zeros(2, 1, 4, 2), torch.zeros(2, 1, 4, 2)
        >>> new = torch.ones(2, 1, 2, 2)
        >>> bass.ops.kv_append(kc, vc, new, new, torch.tensor([1, 3], dtype=torch.int32),
        ...                    torch.tensor([2, 1], dtype=torch.int32))
        >>> kc[:, 0, :, 0]
        tensor([[0., 1., 1., 0.],
                [0., 0., 0., 1.]])
    """
    check_no_grad("bass.kv_append", k_new=k_new, v_new=v_new)
    torch.ops.bass.kv_append(k_cache, v_cache, k_new, v_new, cache_lens, new_lens)


def _document_ops() -> None:
    # Let help(torch.ops.bass.<op>) show the contract, not just the schema.
    for name, fn in (("ragged_attention", ragged_attention), ("kv_append", kv_append)):
        packet = getattr(torch.ops.bass, name)
        try:
            packet.__doc__ = fn.__doc__
            packet.default.__doc__ = fn.__doc__
        except (AttributeError, TypeError):  # pragma: no cover - older torch
            pass


_document_ops()
from . import cutlass as _cutlass  # noqa: E402, F401  (registers impls "pad", "split")
from . import packed  # noqa: E402, F401  (registers the packed ops)
from . import triton_fused as _triton_fused  # noqa: E402, F401  (registers impl "fused")
from .packed import kv_append_packed, ragged_attention_packed  # noqa: E402
