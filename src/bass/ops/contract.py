"""The ragged-attention family's contract: the four ops' schemas and fakes (kernels:
:mod:`bass.ops.plan`; documentation: :mod:`bass.ops`), and input checks. Checks read
metadata only, except the length range checks (a host read), which run on concrete tensors
in eager mode only, unless :func:`length_checks` is off.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Iterator, Sequence

import torch
import torch.autograd.forward_ad as fwAD

# every length tensor (q_lens, kv_lens, cu_q_lens, cache_lens): a tensor, since Python
# lists would recompile a compiled caller on every new value
LENGTH_DTYPE = torch.int32
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
PAD_OUTPUT = 0.0  # the output of every query slot or token that belongs to no row
# Query widths a compiled caller should pad T to (true lengths travel in q_lens), so a
# generation compiles a handful of graphs instead of one per draft length.
QUERY_BUCKETS = (1, 2, 4, 8, 16, 32, 64)

# per thread: a generation turning its checks off leaves another thread's ops checked
_CHECK_LENGTHS = threading.local()
_FLOAT32_MAX = torch.finfo(torch.float32).max  # a larger scale makes every score inf

lib = torch.library.Library("bass", "DEF")
lib.define(
    "ragged_attention(Tensor q, Tensor k, Tensor v, Tensor q_lens, Tensor kv_lens, "
    "float scale, str impl='auto') -> Tensor"
)
lib.define(
    "ragged_attention_packed(Tensor q, Tensor k, Tensor v, Tensor cu_q_lens, Tensor kv_lens, "
    "float scale, str impl='auto') -> Tensor"
)
lib.define(
    "kv_append(Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor k_new, Tensor v_new, "
    "Tensor cache_lens, Tensor new_lens) -> ()"
)
lib.define(
    "kv_append_packed(Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor k_new, Tensor v_new, "
    "Tensor cu_q_lens, Tensor cache_lens) -> ()"
)


def bucket_query_len(t: int) -> int:
    """The smallest bucket in :data:`QUERY_BUCKETS` that holds ``t`` query tokens
    (multiples of the largest bucket beyond it).

    >>> bucket_query_len(3), bucket_query_len(33), bucket_query_len(65)
    (4, 64, 128)
    """
    for b in QUERY_BUCKETS:
        if t <= b:
            return b
    top = QUERY_BUCKETS[-1]
    return -(-t // top) * top


@contextlib.contextmanager
def length_checks(enabled: bool) -> Iterator[None]:
    """Turn the host-side range checks of length tensors on or off within a block, in
    the calling thread (ops that other threads call meanwhile keep theirs). With them
    off, lengths out of range are undefined behaviour (an error deep in torch, or numbers):
    for loops whose lengths are right by construction, as the engine's."""
    old = getattr(_CHECK_LENGTHS, "on", True)
    _CHECK_LENGTHS.on = enabled
    try:
        yield
    finally:
        _CHECK_LENGTHS.on = old


_PLAIN_DISPATCH = torch.Tensor.__torch_dispatch__  # a subclass that dispatches as a tensor


def checking_lengths(*tensors: torch.Tensor) -> bool:
    """Whether range checks run on these tensors: checks on, and every tensor a plain
    eager tensor holding data (not fake, meta, functional or traced)."""
    if torch.compiler.is_compiling() or not getattr(_CHECK_LENGTHS, "on", True):
        return False
    for t in tensors:
        # fake, functional and other wrapper subclasses hold no data to read; plain-data
        # subclasses (nn.Parameter, nn.Buffer) do and are checked
        if t.device.type == "meta" or type(t).__torch_dispatch__ is not _PLAIN_DISPATCH:
            return False
        if torch._C._functorch.is_functorch_wrapped_tensor(t) or torch._is_functional_tensor(t):
            return False
    return True


def _shape(t: torch.Tensor) -> str:
    return "[" + ", ".join(str(s) for s in t.shape) + "]"


def _check_length_tensors(packed: bool, B: int, rows: tuple, other: tuple, **tensors) -> None:
    """``rows``: ``(name, tensor)`` of the per-row counts (``cu_q_lens`` ``[B+1]`` when
    ``packed``), ``other``: the ``[B]`` lengths; all on the device of ``tensors``."""
    rows = ("cu_q_lens", rows[1]) if packed else rows
    # decided by the Python bool, never `size > B` or `B + False`: with a symbolic B those
    # fold to sympy's false, which torch 2.11's guards cannot take (opcheck's dynamic test)
    for (name, t), offsets in ((rows, packed), (other, False)):
        size, what = (B + 1, "[B+1]") if offsets else (B, "[B]")
        if not isinstance(t, torch.Tensor):
            raise TypeError(
                f"{name} must be an int32 tensor of shape {what}, got {type(t).__name__}"
            )
        if t.dtype != LENGTH_DTYPE:
            raise TypeError(
                f"{name} must be int32 (got {t.dtype}); convert with {name}.to(torch.int32)"
            )
        if t.dim() != 1 or t.shape[0] != size:
            why = f" (row offsets, starting at 0; B = {B} rows in the cache)" if offsets else ""
            raise ValueError(f"{name} must have shape {what} = [{size}]{why}, got {_shape(t)}")
    tensors.update((rows, other))
    if len({t.device for t in tensors.values()}) > 1:
        listing = ", ".join(f"{n} on {t.device}" for n, t in tensors.items())
        raise ValueError(f"all tensors must be on one device, got {listing}")


def check_no_grad(op: str, **tensors: torch.Tensor) -> None:
    if not torch.is_grad_enabled():
        return
    needing = [n for n, t in tensors.items() if t.requires_grad]
    if needing:
        raise RuntimeError(
            f"{op} is inference-only and has no backward, but {', '.join(needing)} "
            f"require{'s' if len(needing) == 1 else ''} grad; call it under torch.no_grad() / "
            "torch.inference_mode() "
            "or pass detached tensors"
        )


def check_no_tangent(op: str, **tensors: torch.Tensor) -> None:
    """Forward-mode AD (``torch.func.jvp``, ``torch.autograd.forward_ad`` dual tensors)
    has no ``requires_grad`` to refuse: without this the op would run below it and drop
    the tangent, a silently wrong derivative."""
    peek = getattr(torch._C._functorch, "peek_interpreter_stack", None)
    top = peek() if peek is not None else None
    forward = top is not None and top.key() == torch._C._functorch.TransformType.Jvp
    if not forward and fwAD._current_level >= 0:  # inside a dual_level()
        forward = any(fwAD.unpack_dual(t).tangent is not None for t in tensors.values())
    if forward:
        raise RuntimeError(
            f"{op} is inference-only and has no forward-mode derivative (torch.func.jvp, "
            "forward-AD dual tensors): its tangent would be lost; call it on tensors "
            "without tangents (outside jvp) or differentiate a pure-PyTorch attention"
        )


def _check_floats(layouts: dict[str, str], **tensors) -> None:
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D {layouts[name]}, got shape {_shape(t)}")
        if t.dtype not in FLOAT_DTYPES:
            raise TypeError(f"{name} must be float16, bfloat16, float32 or float64, got {t.dtype}")


def check_attention(q, k, v, lens, kv_lens, scale, packed: bool) -> None:
    """The metadata checks of ``ragged_attention`` (``lens``: ``q_lens``) or, with
    ``packed``, ``ragged_attention_packed`` (``lens``: ``cu_q_lens``)."""
    q_layout = "[1, Hq, N, D] (packed)" if packed else "[B, Hq, T, D]"
    kv_layout = "[B, Hkv, S, D]"
    _check_floats({"q": q_layout, "k": kv_layout, "v": kv_layout}, q=q, k=k, v=v)
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {_shape(k)} and {_shape(v)}")
    Bq, Hq, _, D = q.shape
    B, Hkv, _, Dk = k.shape
    if packed and Bq != 1:
        raise ValueError(
            f"packed q must be [1, Hq, N, D] (every row's tokens in one flat batch), got "
            f"{_shape(q)}; padded [B, Hq, T, D] queries go to ragged_attention"
        )
    if not packed and Bq != B:
        raise ValueError(f"q has batch {Bq} but k/v have batch {B}")
    if Dk != D:
        raise ValueError(f"q has head dim {D} but k/v have head dim {Dk}")
    if D == 0:
        raise ValueError(f"the head dim D must be >= 1, got q {_shape(q)}")
    if Hkv == 0 or Hq == 0 or Hq % Hkv != 0:
        raise ValueError(
            f"query heads ({Hq}) must be a positive multiple of KV heads ({Hkv}) "
            f"(GQA/MQA): q is {q_layout}, k/v are {kv_layout}"
        )
    _check_length_tensors(packed, B, ("q_lens", lens), ("kv_lens", kv_lens), q=q, k=k, v=v)
    if not isinstance(scale, (int, float)) or not abs(scale) <= _FLOAT32_MAX:  # NaN too
        raise ValueError(f"scale must be a finite float within float32's range, got {scale!r}")


def check_append(
    k_cache, v_cache, k_new, v_new, lens, cache_lens, packed: bool, memory: bool = False
) -> None:
    """The metadata checks of ``kv_append`` (``lens``: ``new_lens``; ``cache_lens`` is
    ``cache_lens``) or, with ``packed``, ``kv_append_packed`` (``lens``: ``cu_q_lens``).
    ``memory``: the device kernels' (fake tensors have none to compare): two views of one
    memory from the same element are one cache too."""
    new = "[1, Hkv, N, D] (packed)" if packed else "[B, Hkv, T, D]"
    layouts = {"k_cache": "[B, Hkv, S, D]", "v_cache": "[B, Hkv, S, D]", "k_new": new, "v_new": new}
    tensors = {"k_cache": k_cache, "v_cache": v_cache, "k_new": k_new, "v_new": v_new}
    _check_floats(layouts, **tensors)
    same = k_cache is v_cache or (  # the schema declares two caches written in place
        memory
        and k_cache.data_ptr() == v_cache.data_ptr() != 0
        and k_cache.device == v_cache.device
    )
    if same:
        raise ValueError("k_cache and v_cache are the same memory; pass two caches")
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        if any(s == 0 and n > 1 for s, n in zip(cache.stride(), cache.shape)):
            raise ValueError(
                f"{name} has stride 0 along a dimension of size > 1 (an expanded tensor): a "
                "row's append would write the others' too; pass a cache of its own memory "
                "(.contiguous() or torch.zeros)"
            )
    # values may be narrower than keys (multi-head latent attention), each pair must fit
    if k_cache.shape[:-1] != v_cache.shape[:-1] or k_cache.dtype != v_cache.dtype:
        raise ValueError(
            f"k_cache and v_cache must match (but in D), got {_shape(k_cache)} "
            f"{k_cache.dtype} and {_shape(v_cache)} {v_cache.dtype}"
        )
    if not (k_new.dtype == v_new.dtype == k_cache.dtype):  # no silent cast (1e6 -> inf)
        raise TypeError(
            f"k_new and v_new must have the caches' dtype {k_cache.dtype}, got {k_new.dtype} "
            f"and {v_new.dtype}; convert them with .to({k_cache.dtype}) first"
        )
    if k_new.shape[:-1] != v_new.shape[:-1] or v_new.shape[-1] != v_cache.shape[-1]:
        raise ValueError(
            f"k_new and v_new must match (but in D, each its cache's), got {_shape(k_new)} "
            f"and {_shape(v_new)} for caches {_shape(k_cache)} and {_shape(v_cache)}"
        )
    B, H, S, D = k_cache.shape
    Bn, Hn, T, Dn = k_new.shape
    if (Bn, Hn, Dn) != (1 if packed else B, H, D):
        want = f"[1, Hkv={H}, N, D={D}]" if packed else f"[B={B}, Hkv={H}, T, D={D}]"
        which = "packed new keys" if packed else "new keys"
        raise ValueError(
            f"{which} {_shape(k_new)} must be {want} to fit the cache {_shape(k_cache)}"
        )
    if not packed and T > S:
        raise ValueError(f"cannot append T={T} tokens to a cache of S={S} slots")
    _check_length_tensors(packed, B, ("new_lens", lens), ("cache_lens", cache_lens), **tensors)


def q_lens_of_cu(op: str, cu: Sequence[int], N: int, n_name: str = "q.shape[2]") -> list[int]:
    """Each row's token count from host offsets ``cu`` (``[B+1]``), checked against the
    packed convention: starts at 0, non-decreasing, ends within the pass's ``N`` tokens."""
    if cu[0] != 0:
        raise ValueError(
            f"{op}: cu_q_lens[0] must be 0 (row 0's tokens start the pass), got {cu[0]}"
        )
    q_lens = [e - a for a, e in itertools.pairwise(cu)]
    for b, n in enumerate(q_lens):
        if n < 0:
            raise ValueError(
                f"{op}: cu_q_lens must be non-decreasing, but cu_q_lens[{b + 1}] = "
                f"{cu[b + 1]} < cu_q_lens[{b}] = {cu[b]}"
            )
    if cu[-1] > N:
        raise ValueError(
            f"{op}: cu_q_lens[B] = {cu[-1]} tokens but the pass has N = {N} ({n_name}); "
            "tokens past cu_q_lens[B] are padding, the rows' tokens must fit in N"
        )
    return q_lens


def check_rows(op: str, q_lens: Sequence[int], lens: Sequence[int], S: int, *, T=None,
               append: bool = False, cu: Sequence[int] | None = None) -> None:  # fmt: skip
    """Per-row range checks on host lists. Attention (``lens``: kv_lens): ``0 <= q_len <=
    kv_len <= S`` (and ``q_len <= T``); append (``lens``: cache_lens): ``0 <= cache_len``,
    ``cache_len + q_len <= S``. ``cu``: the packed ops' offsets, quoted in errors."""
    q_name = "q_len" if cu is not None else ("new_lens" if append else "q_lens")
    l_name = "cache_lens" if append else "kv_lens"
    rules = [
        (lambda n, x: n < 0, f"{q_name}[b] >= 0"),
        (lambda n, x: x < 0, f"{l_name}[b] >= 0"),
        (lambda n, x: T is not None and n > T,
         f"{q_name}[b] <= T = {T} ({'k_new' if append else 'q'}.shape[2])"),
        *([(lambda n, x: x + n > S,
            f"cache_lens[b] + {q_name}[b] <= S = {S}: the cache is full; allocate a larger one")]
          if append else
          [(lambda n, x: x > S, f"kv_lens[b] <= S = {S} (the cache size, k.shape[2])"),
           (lambda n, x: n > x, f"{q_name}[b] <= kv_lens[b] (the new tokens are the last keys "
            "of their row; append them first)")]),
    ]  # fmt: skip
    for test, what in rules:
        for b, (n, x) in enumerate(zip(q_lens, lens)):
            if test(n, x):
                where = "" if cu is None else f" (cu_q_lens[{b}:{b + 2}] = {list(cu[b : b + 2])})"
                raise ValueError(
                    f"{op}: row {b} has {q_name}={n}{where}, {l_name}={x}; expected {what}"
                )


# --------------------------------------------------------------------------- fakes
# Shapes only; the packed op's output token-major, as every implementation returns it.


@torch.library.register_fake("bass::ragged_attention", lib=lib)
def _attention_fake(q, k, v, q_lens, kv_lens, scale, impl="auto"):
    check_attention(q, k, v, q_lens, kv_lens, scale, packed=False)
    return q.new_empty(q.shape)


@torch.library.register_fake("bass::ragged_attention_packed", lib=lib)
def _packed_fake(q, k, v, cu_q_lens, kv_lens, scale, impl="auto"):
    check_attention(q, k, v, cu_q_lens, kv_lens, scale, packed=True)
    return token_major(q, zero=False)


@torch.library.register_fake("bass::kv_append", lib=lib)
def _append_fake(k_cache, v_cache, k_new, v_new, cache_lens, new_lens):
    check_append(k_cache, v_cache, k_new, v_new, new_lens, cache_lens, packed=False)


@torch.library.register_fake("bass::kv_append_packed", lib=lib)
def _append_packed_fake(k_cache, v_cache, k_new, v_new, cu_q_lens, cache_lens):
    check_append(k_cache, v_cache, k_new, v_new, cu_q_lens, cache_lens, packed=True)


def token_major(q: torch.Tensor, zero: bool) -> torch.Tensor:
    """A ``[1, Hq, N, D]`` output in q's dtype stored token-major (``out.transpose(1, 2)``
    is contiguous: the transpose back to ``[1, N, Hq, D]`` is free)."""
    _, Hq, N, D = q.shape
    out = q.new_zeros(1, N, Hq, D) if zero else q.new_empty(1, N, Hq, D)
    return out.transpose(1, 2)
