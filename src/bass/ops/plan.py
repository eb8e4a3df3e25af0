"""The one dispatch of the ragged-attention family (FlashInfer's plan/run): :class:`Plan`
resolves the implementation and runs its ``prepare`` once per pass; every layer's
:meth:`Plan.attend` and :meth:`Plan.append` take tensors only. The layout every
implementation sees: docs/reference/ops.md, "The one layout"."""

from __future__ import annotations

import functools
import itertools
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from ..errors import ConfigError, PluginOutputError
from . import contract, cutlass, flex, fused, reference, sdpa
from .contract import (
    LENGTH_DTYPE,
    bucket_query_len,
    check_no_grad,
    check_no_tangent,
    check_rows,
    lib,
)

__all__ = [
    "PASS_KINDS",
    "Implementation",
    "Plan",
    "auto_pick",
    "implementations",
    "register",
    "resolve",
]

# the pass kinds (defined on the Ops page)
PASS_KINDS = ("eager", "compiled", "graphs")


@dataclass(frozen=True)
class Implementation:
    """One implementation of the family.

    ``prepare(plan) -> state``: its per-pass work; ``run(state, q, k, v, scale) -> out``:
    one layer, q ``[1, Hq, N, D]``, k, v ``[B, Hkv, S, D]``, out ``[1, Hq, N, D]``
    token-major. ``devices``: where it runs; ``unavailable()``: why it cannot run in this
    process (``None``: it can). ``single_launch``: one kernel launch per layer whatever
    the lengths. ``traceable``: ``run`` may be traced into a compiled graph (else compiled
    passes call the packed op, opaque). ``host_lengths``: ``prepare`` reads the host
    lengths (a device sync when the op is called directly on a GPU).
    """

    name: str
    devices: tuple[str, ...]
    prepare: Callable[[Plan], Any]
    run: Callable[..., torch.Tensor]
    description: str
    single_launch: bool = False
    traceable: bool = True
    host_lengths: bool = False
    unavailable: Callable[[], str | None] = lambda: None


IMPLEMENTATIONS: dict[str, Implementation] = {}


def register(impl: Implementation) -> None:
    """Add (or replace) an implementation, selectable as ``impl=<name>``."""
    if impl.name == "auto":
        raise ValueError("'auto' is reserved for automatic selection")
    IMPLEMENTATIONS[impl.name] = impl
    _host_plan.cache_clear()  # plans made for the name's previous holder


def implementations(device: str | torch.device | None = None) -> list[str]:
    """Names of the implementations that can run here (on ``device``'s type, if given)."""
    kind = None if device is None else torch.device(device).type
    return [
        n
        for n, i in IMPLEMENTATIONS.items()
        if (kind is None or kind in i.devices) and i.unavailable() is None
    ]


_H100 = "bench/results/gpu/2026-11-26-h100"  # the first GPU run (docs/gpu.md)
_ONE_LAUNCH = (
    "one FlexAttention launch per layer for the whole ragged pass, its block mask built "
    "once per pass from the lengths; valid in eager, compiled and CUDA-graph passes"
)
# auto: per device type and pass kind, the implementation and why (measurements:
# bench/results/cpu_kernels.md and docs/benchmarks/kernels.md)
AUTO: dict[str, dict[str, tuple[str, str]]] = {
    "cpu": {
        "eager": ("sdpa", "measured fastest on CPU in eager passes (one call per row, or "
                  "one for rows alike; no compile step)"),
        "compiled": ("flex", "traced into the compiled graph; in the engine on CPU (batch 8) "
                     "flex 52.5 tok/s, sdpa 51.6 (not traceable: an opaque op there), "
                     "reference 37.3 (bench/results/cpu_attention_passes.md)"),
        "graphs": ("flex", "as compiled passes (CPU has no CUDA graphs)"),
    },
    "cuda": {
        "eager": ("fused", "bass's Triton flash kernel, one launch per layer: on an H100 it "
                  "matched the reference and ran 2-6x faster per layer than flex on verify "
                  f"passes ({_H100})"),
        "compiled": ("flex", _ONE_LAUNCH + "; matched the reference on an H100 traced into "
                     f"a compiled graph ({_H100}); fused's compiled path not yet checked there"),
        "graphs": ("flex", _ONE_LAUNCH + f"; matched the reference on an H100 under CUDA graphs "
                   f"({_H100})"),
    },
}  # fmt: skip
# Forces auto's pick everywhere (to run a suite through one implementation)
AUTO_OVERRIDE = "BASS_AUTO_ATTENTION"


def auto_pick(device_type: str, kind: str) -> tuple[str, str]:
    """What ``auto`` picks for a pass of ``kind`` on ``device_type`` and why: the
    :data:`AUTO` table's entry (``$BASS_AUTO_ATTENTION`` overrides it), whether or not it
    can run in this process (:func:`resolve` adds that check)."""
    forced = os.environ.get(AUTO_OVERRIDE)
    if forced:
        if forced not in IMPLEMENTATIONS:  # a setting a user fixes (the CLI: status 2)
            raise ConfigError(
                f"${AUTO_OVERRIDE}={forced!r} names no ragged attention implementation; "
                f"registered: {', '.join(IMPLEMENTATIONS)} (or unset it)",
                option=AUTO_OVERRIDE,
                value=forced,
            )
        return forced, f"${AUTO_OVERRIDE}"
    unset = ("reference", f"no implementation chosen for {device_type} {kind} passes")
    return AUTO.get(device_type, {}).get(kind, unset)


def resolve(
    impl: str, device: torch.device | str, kind: str = "eager"
) -> tuple[Implementation, str]:
    """The implementation ``impl`` names on ``device`` for a pass of ``kind`` (one of
    :data:`PASS_KINDS`), and why: for ``"auto"`` the :data:`AUTO` table's pick
    (``$BASS_AUTO_ATTENTION`` overrides it), ``reference`` when that cannot run here; for a
    name, that implementation or an error saying why it cannot run and what can."""
    if kind not in PASS_KINDS:
        raise ValueError(f"unknown pass kind {kind!r}; one of {', '.join(PASS_KINDS)}")
    device = torch.device(device)
    if impl != "auto":
        found = IMPLEMENTATIONS.get(impl)
        if found is None:
            names = ", ".join(["auto", *IMPLEMENTATIONS])
            raise ValueError(
                f"unknown ragged attention implementation {impl!r}; registered: {names}"
            )
        here = implementations(device)
        if device.type not in found.devices:
            raise ValueError(
                f"ragged attention implementation {impl!r} runs on {', '.join(found.devices)}, "
                f"not {device.type}; use impl='auto' or one of {here}"
            )
        why = found.unavailable()
        if why is not None:
            raise RuntimeError(
                f"ragged attention implementation {impl!r} is not available here ({why}); "
                f"available on {device.type}: {here}"
            )
        return found, "named explicitly"
    name, why = auto_pick(device.type, kind)
    found = IMPLEMENTATIONS[name]
    missing = found.unavailable() or (None if device.type in found.devices else "wrong device")
    if missing is None:
        return found, why
    if device.type not in IMPLEMENTATIONS["reference"].devices:
        raise RuntimeError(f"no ragged attention implementation runs on {device.type}")
    return IMPLEMENTATIONS["reference"], f"{name} unavailable ({missing}); the reference"


class HostLengths(NamedTuple):
    """A pass's lengths on the host, lists ``[B]``: each row's first token, its tokens,
    its keys (the cache length once the pass's tokens are in)."""

    starts: Sequence[int]
    q_lens: Sequence[int]
    kv_lens: Sequence[int]


class Plan:
    """One pass's attention and KV append (the layout: docs/reference/ops.md, "The one layout").

    Tensors on the pass's device: ``starts``, ``q_lens``, ``kv_lens`` int32 ``[B]``; for
    packed passes ``cu_q_lens`` ``[B+1]`` and ``cache_lens`` ``[B]`` too. ``num_tokens``:
    ``N``; ``cache_size``: ``S``; ``host``: the lengths on the host or ``None``; ``width``:
    the longest row's query count, bucketed (``N`` without host lengths). ``self.impl``
    runs, ``self.reason`` says why.

    >>> import torch
    >>> cu = torch.tensor([0, 3, 3, 5], dtype=torch.int32)
    >>> lens = torch.tensor([4, 4, 0], dtype=torch.int32)
    >>> p = Plan.for_pass("reference", [3, 0, 2], [4, 4, 0], 5, cu, lens, lens + cu.diff(), 16)
    >>> kv = torch.ones(3, 1, 16, 8)  # B=3, Hkv=1, S=16, D=8
    >>> p.host.kv_lens, p.width, p.attend(torch.zeros(1, 2, 5, 8), kv, kv, 1.0).shape
    ([7, 4, 2], 4, torch.Size([1, 2, 5, 8]))
    """

    def __init__(self, impl: str, starts, q_lens, kv_lens, num_tokens: int, cache_size: int, *,
                 kind: str = "eager", host: HostLengths | None = None, width: int | None = None,
                 cu_q_lens=None, cache_lens=None, softcap: float | None = None,
                 window: int | None = None):  # fmt: skip
        self.device = q_lens.device
        # beyond the contract (flex's): the model's logit soft-cap, its sliding window
        self.softcap, self.window = softcap, window
        self.kind = kind
        self.impl, self.reason = resolve(impl, self.device, kind)
        self.starts, self.q_lens, self.kv_lens = starts, q_lens, kv_lens
        self.cu_q_lens, self.cache_lens = cu_q_lens, cache_lens
        self.num_tokens, self.cache_size, self.host = num_tokens, cache_size, host
        if width is None:
            width = num_tokens if host is None else bucket_query_len(max(host.q_lens, default=1))
        self.width = max(1, width)
        # compiled, an untraceable implementation runs as the op, which plans for itself
        opaque = kind != "eager" and not self.impl.traceable
        self.state = None if opaque else self.impl.prepare(self)
        self._index = None  # eager engine passes: the (row, slot) pairs (for_pass)
        self.windowed = False  # a layer computed a sliding window (bass's attention function)

    @classmethod
    def for_pass(cls, impl: str, q_lens: Sequence[int], cache_lens: Sequence[int], num_tokens: int,
                 cu_q_lens, cache_lens_t, kv_lens_t, cache_size: int, kind: str = "eager",
                 softcap: float | None = None, window: int | None = None) -> Plan:  # fmt: skip
        """An engine's packed pass: row ``b`` brings ``q_lens[b]`` tokens after
        ``cache_lens[b]`` cached (host lists); the device tensors ``cu_q_lens`` ``[B+1]``,
        ``cache_lens_t`` and ``kv_lens_t`` ``[B]``; ``softcap``, ``window``: the model's logit
        soft-cap and sliding window (bass's attention function passes them to flex; outside
        the ops' contract)."""
        starts = [0, *itertools.accumulate(q_lens)][:-1]
        kv = [n + q for n, q in zip(cache_lens, q_lens)]
        plan = cls(impl, cu_q_lens[:-1], kv_lens_t - cache_lens_t, kv_lens_t, num_tokens,
                   cache_size, kind=kind, host=HostLengths(starts, list(q_lens), kv),
                   cu_q_lens=cu_q_lens, cache_lens=cache_lens_t, softcap=softcap,
                   window=window)  # fmt: skip
        if kind == "eager":
            plan._index = reference.append_index(q_lens, cache_lens, plan.device)
        return plan

    def attend(self, q, k, v, scale: float) -> torch.Tensor:
        """One layer's attention: q ``[1, Hq, N, D]``; k, v ``[B, Hkv, S, D]`` (the pass's
        keys already appended); returns ``[1, Hq, N, D]`` token-major."""
        if self.state is None:  # compiled, untraceable: the op plans for itself
            return torch.ops.bass.ragged_attention_packed(
                q, k, v, self.cu_q_lens, self.kv_lens, scale, self.impl.name
            )
        out = self.impl.run(self.state, q, k, v, scale)
        if self.impl is not _BUILT_IN.get(self.impl.name) and not torch.compiler.is_compiling():
            _check_output(self.impl.name, out, q)  # a registered one's, in eager passes
        return out

    def append(self, k_cache, v_cache, k_new, v_new) -> None:
        """One layer's KV append of a packed pass (``k_new``, ``v_new``: ``[1, Hkv, N,
        D]``): token ``j`` of row ``b`` to slot ``cache_lens[b] + j - cu_q_lens[b]``."""
        if self._index is not None:  # eager: the pass's (row, slot) pairs, built once
            reference.append_at(k_cache, v_cache, k_new, v_new, self._index)
        else:
            torch.ops.bass.kv_append_packed(
                k_cache, v_cache, k_new, v_new, self.cu_q_lens, self.cache_lens
            )


def _check_output(name: str, out, q: torch.Tensor) -> None:
    """What an implementation's ``run`` returned is the contract's output (q's shape, dtype
    and device, token-major): a registered one that is not fails here, named, not layers
    later in a matrix product (metadata only, no device read)."""
    if isinstance(out, torch.Tensor):
        same = (out.shape, out.dtype, out.device) == (q.shape, q.dtype, q.device)
        if same and out.transpose(1, 2).is_contiguous():
            return
        got = f"{out.dtype} {list(out.shape)} on {out.device}" + (", not token-major" * same)
    else:
        got = f"a {type(out).__name__}"
    raise PluginOutputError(
        f"ragged attention implementation {name!r} returned {got}; its run must return "
        f"{q.dtype} {list(q.shape)} on {q.device} (q's), stored token-major "
        "(out.transpose(1, 2) contiguous): docs/reference/ops.md",
        plugin=name,
        hook="run",
    )


# --------------------------------------------------------------------------- op kernels
# The ops plan each call from their tensors (when they read the lengths: the docs' "The one
# layout").


@functools.lru_cache(maxsize=256)  # per set of lengths: every layer of a pass shares it
def _host_plan(impl, device, N, S, width, starts: tuple, q: tuple, kv: tuple) -> Plan:
    t = torch.tensor([starts, q, kv], dtype=LENGTH_DTYPE).reshape(3, len(kv)).to(device)
    return Plan(impl, t[0], t[1], t[2], N, S, host=HostLengths(starts, q, kv), width=width)


@functools.lru_cache(maxsize=256)
def _host_index(q_lens: tuple, cache_lens: tuple) -> tuple:
    return reference.append_index(q_lens, cache_lens, "cpu")


def read_lengths(op, lens, other, N, S, packed: bool, T=None, append=False, host=False, check=None):
    """The one host read of an op's lengths (``cu_q_lens`` when ``packed``) where ``host``
    asks for them or checks are on (then checked; ``check`` overrides the ops' switch):
    ``(raw, q_lens, other)`` lists, or None."""
    checking = contract.checking_lengths(lens, other) if check is None else check
    if not (host or checking):
        return None
    raw, rest = lens.tolist(), other.tolist()
    n_name = "k_new.shape[2]" if append else "q.shape[2]"
    q = contract.q_lens_of_cu(op, raw, N, n_name) if packed else raw
    if checking:
        check_rows(op, q, rest, S, T=T, append=append, cu=raw if packed else None)
    return raw, q, rest


def _plan_call(op, impl, lens, kv_lens, N, S, packed: bool, width=None) -> Plan:
    device = lens.device
    B = kv_lens.shape[0]
    # "auto" resolved every call, not cached with the lengths: $BASS_AUTO_ATTENTION may change
    found = resolve(impl, device, "eager")[0]
    host = device.type == "cpu" or found.host_lengths
    read = read_lengths(op, lens, kv_lens, N, S, packed, width, host=host)
    if host:
        raw, q, kv = read
        starts = raw[:-1] if packed else [b * width for b in range(B)]
        return _host_plan(found.name, device, N, S, width, tuple(starts), tuple(q), tuple(kv))
    if packed:
        return Plan(impl, lens[:-1], lens.diff(), kv_lens, N, S, width=width, cu_q_lens=lens)
    starts = torch.arange(B, dtype=LENGTH_DTYPE, device=device) * width
    return Plan(impl, starts, lens, kv_lens, N, S, width=width)


def _attention_packed(q, k, v, cu_q_lens, kv_lens, scale, impl="auto"):
    contract.check_attention(q, k, v, cu_q_lens, kv_lens, scale, packed=True)
    plan = _plan_call(
        "ragged_attention_packed", impl, cu_q_lens, kv_lens, q.shape[2], k.shape[2], True
    )
    return plan.attend(q, k, v, float(scale))


def _attention_padded(q, k, v, q_lens, kv_lens, scale, impl="auto"):
    contract.check_attention(q, k, v, q_lens, kv_lens, scale, packed=False)
    B, Hq, T, D = q.shape
    plan = _plan_call("ragged_attention", impl, q_lens, kv_lens, B * T, k.shape[2], False, T)
    flat = q.transpose(0, 1).reshape(1, Hq, B * T, D)  # row after row: starts[b] = b * T
    out = plan.attend(flat, k, v, float(scale))  # [1, Hq, B * T, D] token-major
    return out[0].unflatten(1, (B, T)).transpose(0, 1).contiguous()


def _append_packed(k_cache, v_cache, k_new, v_new, cu_q_lens, cache_lens):
    contract.check_append(
        k_cache, v_cache, k_new, v_new, cu_q_lens, cache_lens, packed=True, memory=True
    )
    N, S, cpu = k_new.shape[2], k_cache.shape[2], k_cache.device.type == "cpu"
    read = read_lengths(
        "kv_append_packed", cu_q_lens, cache_lens, N, S, True, append=True, host=cpu
    )
    if cpu:  # one index per set of lengths
        index = _host_index(tuple(read[1]), tuple(read[2]))
        return reference.append_at(k_cache, v_cache, k_new, v_new, index)
    reference.append(k_cache, v_cache, k_new, v_new, cu_q_lens[:-1], cu_q_lens.diff(), cache_lens)


def _append_padded(k_cache, v_cache, k_new, v_new, cache_lens, new_lens):
    contract.check_append(
        k_cache, v_cache, k_new, v_new, new_lens, cache_lens, packed=False, memory=True
    )
    B, H, T, _ = k_new.shape
    read_lengths("kv_append", new_lens, cache_lens, B * T, k_cache.shape[2], False, T, append=True)
    starts = torch.arange(B, dtype=LENGTH_DTYPE, device=k_new.device) * T
    flat = [t.transpose(0, 1).reshape(1, H, B * T, t.shape[-1]) for t in (k_new, v_new)]
    reference.append(k_cache, v_cache, *flat, starts, new_lens, cache_lens)


def _inference_only(name: str, float_args: tuple[str, ...]) -> None:
    """The op's Autograd kernel: inputs that require grad raise (:func:`check_no_grad`),
    in eager calls and when ``torch.compile`` traces one alike (the ops have no backward);
    the rest goes on to the device's kernel. Not reached under ``torch.inference_mode``."""
    op = getattr(torch.ops.bass, name).default
    names = [a.name for a in op._schema.arguments]

    def kernel(keyset, *args, **kwargs):
        given = {**dict(zip(names, args)), **kwargs}
        floats = {n: given[n] for n in float_args}
        check_no_grad(f"bass.{name}", **floats)
        check_no_tangent(f"bass.{name}", **floats)
        with torch._C._AutoDispatchBelowAutograd():
            return op.redispatch(keyset & torch._C._after_autograd_keyset, *args, **kwargs)

    lib.impl(name, kernel, "Autograd", with_keyset=True)


def _autocast(name: str, device_type: str) -> None:
    """The attention op's kernel under ``torch.autocast(device_type)``: as SDPA there, q,
    k and v (float32, float16, bfloat16; float64 is left as it is) are cast to the
    autocast dtype, then the op runs with autocast off. ``kv_append`` has none: it writes
    the caches in place and refuses new keys of another dtype (the cache's dtype is the
    caller's choice)."""
    op = getattr(torch.ops.bass, name).default
    key = getattr(torch._C.DispatchKey, "Autocast" + device_type.upper())

    def cast(x):
        if not isinstance(x, torch.Tensor) or x.device.type != device_type:
            return x
        if x.is_floating_point() and x.dtype != torch.float64:
            return x.to(torch.get_autocast_dtype(device_type))
        return x

    def run(*args, **kwargs):
        with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(key)):
            return op(*map(cast, args), **{k: cast(v) for k, v in kwargs.items()})

    op.py_impl(key)(run)  # what torch.compile traces (torch.library.register_autocast's way)
    lib.impl(name, lambda _keyset, *args, **kwargs: run(*args, **kwargs),
             f"Autocast{device_type.upper()}", with_keyset=True)  # fmt: skip


for _name, _kernel, _floats in (
    ("ragged_attention", _attention_padded, ("q", "k", "v")),
    ("ragged_attention_packed", _attention_packed, ("q", "k", "v")),
    ("kv_append", _append_padded, ("k_cache", "v_cache", "k_new", "v_new")),
    ("kv_append_packed", _append_packed, ("k_cache", "v_cache", "k_new", "v_new")),
):
    for _key in ("CPU", "CUDA"):
        lib.impl(_name, _kernel, _key)
        if _name.startswith("ragged_attention"):
            _autocast(_name, _key.lower())
    _inference_only(_name, _floats)


# --------------------------------------------------------------------------- registry


def _lengths(plan: Plan) -> tuple[torch.Tensor, ...]:
    return plan.starts, plan.q_lens, plan.kv_lens


for _impl in (
    Implementation(
        "reference", ("cpu", "cuda"), _lengths,
        lambda s, q, k, v, scale: reference.attention(q, k, v, *s, scale),
        "pure PyTorch, each token's cache row gathered, no host read: the oracle's twin "
        "and the fallback; time and memory grow with N * S",
    ),
    Implementation(
        "sdpa", ("cpu", "cuda"), sdpa.prepare, sdpa.run,
        "F.scaled_dot_product_attention per row on its own slices (rows alike share one "
        "call); reads the lengths on the host: a launch per row on a GPU",
        traceable=False, host_lengths=True,
    ),
    Implementation(
        "flex", ("cpu", "cuda"), flex.prepare, flex.run,
        "PyTorch FlexAttention over the whole pass, a block mask built once per pass from "
        "the lengths (Inductor's C++ template on CPU, Triton on CUDA)",
        single_launch=True,
    ),
    Implementation(
        "fused", ("cuda", "cpu") if fused.interpreted() else ("cuda",), _lengths,
        lambda s, q, k, v, scale: torch.ops.bass.ragged_attention_fused(q, k, v, *s, scale),
        "bass's Triton flash-attention kernel over the packed pass (GQA-aware, split-KV), "
        "a grid from shapes only; checked in Triton's interpreter and, in eager passes, "
        f"on an H100 ({_H100})",
        single_launch=True, unavailable=fused.unavailable,
    ),
    *(
        Implementation(
            kind, ("cuda",), cutlass.prepare, cutlass.runner(kind),
            f"BASS-{kind.upper()} (paper Fig. 4{'b' if kind == 'pad' else 'c'}): CUTLASS "
            + ("batched GEMMs over rows padded to the longest kv_len (one host sync)"
               if kind == "pad" else "grouped GEMMs, one problem per row, no host sync")
            + ", Triton masked softmax; fp16/bf16, D % 8 == 0 (else the reference); "
            "matched the reference on an H100 (bench/results/gpu/2026-11-27-h100)",
            unavailable=cutlass.unavailable_reason,
        )
        for kind in ("pad", "split")
    ),
):  # fmt: skip
    register(_impl)
_BUILT_IN = dict(IMPLEMENTATIONS)  # bass's own (its tests check their outputs): unchecked
