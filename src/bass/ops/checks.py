"""Input validation for the bass ops: clear errors in eager mode, nothing under tracing.

Shape, dtype and device checks read only metadata and always run. Length checks read the
length tensors back to the host (a sync on CUDA), so they run only on real tensors in
eager mode and can be switched off with :func:`length_checks` by callers that build
valid lengths themselves (the engine's hot loop does).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
LENGTH_DTYPE = torch.int32

_CHECK_LENGTHS = True


@contextlib.contextmanager
def length_checks(enabled: bool) -> Iterator[None]:
    """Turn the host-side range checks of length tensors on or off within a block."""
    global _CHECK_LENGTHS
    old, _CHECK_LENGTHS = _CHECK_LENGTHS, enabled
    try:
        yield
    finally:
        _CHECK_LENGTHS = old


def _is_concrete(t: torch.Tensor) -> bool:
    """True for plain eager tensors holding data (not fake, meta, functional or traced)."""
    if type(t) is not torch.Tensor or t.device.type == "meta":
        return False
    if torch._C._functorch.is_functorch_wrapped_tensor(t) or torch._is_functional_tensor(t):
        return False
    return not torch.compiler.is_compiling()


def _shape(t: torch.Tensor) -> str:
    return "[" + ", ".join(str(s) for s in t.shape) + "]"


def check_lengths_tensor(name: str, t: torch.Tensor, batch: int) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(
            f"{name} must be an int32 tensor of shape [{batch}], got {type(t).__name__}"
        )
    if t.dtype != LENGTH_DTYPE:
        raise TypeError(
            f"{name} must be int32 (got {t.dtype}); convert with {name}.to(torch.int32)"
        )
    if t.dim() != 1 or t.shape[0] != batch:
        raise ValueError(f"{name} must have shape [B] = [{batch}], got {_shape(t)}")


def check_same_device(**tensors: torch.Tensor) -> None:
    devices = {name: t.device for name, t in tensors.items()}
    if len(set(devices.values())) > 1:
        listing = ", ".join(f"{n} on {d}" for n, d in devices.items())
        raise ValueError(f"all tensors must be on one device, got {listing}")


def check_no_grad(op: str, **tensors: torch.Tensor) -> None:
    if not torch.is_grad_enabled():
        return
    needing = [n for n, t in tensors.items() if t.requires_grad]
    if needing:
        raise RuntimeError(
            f"{op} is inference-only and has no backward, but {', '.join(needing)} "
            "require grad; call it under torch.no_grad() / torch.inference_mode() "
            "or pass detached tensors"
        )


def check_attention_inputs(q, k, v, q_lens, kv_lens, scale) -> None:
    """Validate ``ragged_attention``'s arguments against its documented contract."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a tensor, got {type(t).__name__}")
        if t.dim() != 4:
            layout = "[B, Hq, T, D]" if name == "q" else "[B, Hkv, S, D]"
            raise ValueError(f"{name} must be 4-D {layout}, got shape {_shape(t)}")
        if t.dtype not in FLOAT_DTYPES:
            raise TypeError(f"{name} must be float16, bfloat16, float32 or float64, got {t.dtype}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    B, Hq, T, D = q.shape
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {_shape(k)} and {_shape(v)}")
    Bk, Hkv, S, Dk = k.shape
    if Bk != B:
        raise ValueError(f"q has batch {B} but k/v have batch {Bk}")
    if Dk != D:
        raise ValueError(f"q has head dim {D} but k/v have head dim {Dk}")
    if Hkv == 0 or Hq == 0 or Hq % Hkv != 0:
        raise ValueError(
            f"query heads ({Hq}) must be a positive multiple of KV heads ({Hkv}) "
            "(GQA/MQA): q is [B, Hq, T, D], k/v are [B, Hkv, S, D]"
        )
    check_lengths_tensor("q_lens", q_lens, B)
    check_lengths_tensor("kv_lens", kv_lens, B)
    check_same_device(q=q, k=k, v=v, q_lens=q_lens, kv_lens=kv_lens)
    if not isinstance(scale, (int, float)) or scale != scale or abs(scale) == float("inf"):
        raise ValueError(f"scale must be a finite float, got {scale!r}")
    if _CHECK_LENGTHS and _is_concrete(q_lens) and _is_concrete(kv_lens):
        _check_attention_lengths(q_lens, kv_lens, T, S)


def _first_bad(mask: torch.Tensor) -> int | None:
    bad = mask.nonzero()
    return int(bad[0, 0]) if bad.numel() else None


def _check_attention_lengths(q_lens, kv_lens, T: int, S: int) -> None:
    ql, kl = q_lens.cpu(), kv_lens.cpu()  # the one host read of the lengths
    for cond, what in (
        (ql < 0, "q_lens[b] >= 0"),
        (kl < 0, "kv_lens[b] >= 0"),
        (kl > S, f"kv_lens[b] <= S = {S} (the cache size, k.shape[2])"),
        (ql > T, f"q_lens[b] <= T = {T} (q.shape[2])"),
        (ql > kl, "q_lens[b] <= kv_lens[b] (the new queries are the last q_lens[b] cached keys)"),
    ):
        b = _first_bad(cond)
        if b is not None:
            raise ValueError(
                f"ragged_attention: row {b} has q_lens={int(ql[b])}, kv_lens={int(kl[b])}; "
                f"expected {what}"
            )


def check_append_inputs(k_cache, v_cache, k_new, v_new, cache_lens, new_lens) -> None:
    """Validate ``kv_append``'s arguments against its documented contract."""
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache), ("k_new", k_new), ("v_new", v_new)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D [B, Hkv, S or T, D], got shape {_shape(t)}")
        if t.dtype not in FLOAT_DTYPES:
            raise TypeError(f"{name} must be a float tensor, got {t.dtype}")
    if k_cache.shape != v_cache.shape or k_cache.dtype != v_cache.dtype:
        raise ValueError(
            f"k_cache and v_cache must match, got {_shape(k_cache)} {k_cache.dtype} and "
            f"{_shape(v_cache)} {v_cache.dtype}"
        )
    if k_new.shape != v_new.shape:
        raise ValueError(f"k_new and v_new must match, got {_shape(k_new)} and {_shape(v_new)}")
    B, H, S, D = k_cache.shape
    Bn, Hn, T, Dn = k_new.shape
    if (Bn, Hn, Dn) != (B, H, D):
        raise ValueError(
            f"new keys {_shape(k_new)} must be [B={B}, Hkv={H}, T, D={D}] to fit the cache "
            f"{_shape(k_cache)}"
        )
    if T > S:
        raise ValueError(f"cannot append T={T} tokens to a cache of S={S} slots")
    check_lengths_tensor("cache_lens", cache_lens, B)
    check_lengths_tensor("new_lens", new_lens, B)
    check_same_device(
        k_cache=k_cache,
        v_cache=v_cache,
        k_new=k_new,
        v_new=v_new,
        cache_lens=cache_lens,
        new_lens=new_lens,
    )
    if _CHECK_LENGTHS and _is_concrete(cache_lens) and _is_concrete(new_lens):
        cl, nl = cache_lens.cpu(), new_lens.cpu()
        for cond, what in (
            (cl < 0, "cache_lens[b] >= 0"),
            (nl < 0, "new_lens[b] >= 0"),
            (nl > T, f"new_lens[b] <= T = {T} (k_new.shape[2])"),
            (
                cl + nl > S,
                f"cache_lens[b] + new_lens[b] <= S = {S}: the cache is full; allocate a larger one",
            ),
        ):
            b = _first_bad(cond)
            if b is not None:
                raise ValueError(
                    f"kv_append: row {b} has cache_lens={int(cl[b])}, new_lens={int(nl[b])}; "
                    f"expected {what}"
                )


# --------------------------------------------------------------------------- packed
#
# The packed ops split their checks in two, so that their kernels can decide the first
# part once per signature (shapes, dtypes, devices) and skip it on later calls:
# ``check_packed_*_metadata`` reads only metadata; ``check_packed_*_lengths`` reads the
# lengths back (one host read) and runs only when length checks are on and the tensors
# are concrete.


def _check_cu(cu_q_lens, batch: int) -> None:
    if not isinstance(cu_q_lens, torch.Tensor):
        raise TypeError(f"cu_q_lens must be an int32 tensor of shape [B+1], got {cu_q_lens!r}")
    if cu_q_lens.dtype != LENGTH_DTYPE:
        raise TypeError(
            f"cu_q_lens must be int32 (got {cu_q_lens.dtype}); convert with "
            "cu_q_lens.to(torch.int32)"
        )
    if cu_q_lens.dim() != 1 or cu_q_lens.shape[0] != batch + 1:
        raise ValueError(
            f"cu_q_lens must have shape [B+1] = [{batch + 1}] (offsets of each row's tokens, "
            f"starting at 0; B = {batch} rows in the cache), got {_shape(cu_q_lens)}"
        )


def check_scale(scale) -> None:
    if not isinstance(scale, (int, float)) or scale != scale or abs(scale) == float("inf"):
        raise ValueError(f"scale must be a finite float, got {scale!r}")


def check_packed_attention_metadata(q, k, v, cu_q_lens, kv_lens, scale) -> None:
    """``ragged_attention_packed``'s checks that read no tensor data."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a tensor, got {type(t).__name__}")
        if t.dim() != 4:
            layout = "[1, Hq, N, D] (packed)" if name == "q" else "[B, Hkv, S, D]"
            raise ValueError(f"{name} must be 4-D {layout}, got shape {_shape(t)}")
        if t.dtype not in FLOAT_DTYPES:
            raise TypeError(f"{name} must be float16, bfloat16, float32 or float64, got {t.dtype}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    one, Hq, _, D = q.shape
    if one != 1:
        raise ValueError(
            f"packed q must be [1, Hq, N, D] (every row's tokens in one flat batch), got "
            f"{_shape(q)}; padded [B, Hq, T, D] queries go to ragged_attention"
        )
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {_shape(k)} and {_shape(v)}")
    B, Hkv, _, Dk = k.shape
    if Dk != D:
        raise ValueError(f"q has head dim {D} but k/v have head dim {Dk}")
    if Hkv == 0 or Hq == 0 or Hq % Hkv != 0:
        raise ValueError(
            f"query heads ({Hq}) must be a positive multiple of KV heads ({Hkv}) "
            "(GQA/MQA): q is [1, Hq, N, D], k/v are [B, Hkv, S, D]"
        )
    _check_cu(cu_q_lens, B)
    check_lengths_tensor("kv_lens", kv_lens, B)
    check_same_device(q=q, k=k, v=v, cu_q_lens=cu_q_lens, kv_lens=kv_lens)
    check_scale(scale)


def check_packed_append_metadata(k_cache, v_cache, k_new, v_new, cu_q_lens, cache_lens) -> None:
    """``kv_append_packed``'s checks that read no tensor data."""
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache), ("k_new", k_new), ("v_new", v_new)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a tensor, got {type(t).__name__}")
        if t.dim() != 4:
            layout = "[B, Hkv, S, D]" if "cache" in name else "[1, Hkv, N, D] (packed)"
            raise ValueError(f"{name} must be 4-D {layout}, got shape {_shape(t)}")
        if t.dtype not in FLOAT_DTYPES:
            raise TypeError(f"{name} must be a float tensor, got {t.dtype}")
    if k_cache.shape != v_cache.shape or k_cache.dtype != v_cache.dtype:
        raise ValueError(
            f"k_cache and v_cache must match, got {_shape(k_cache)} {k_cache.dtype} and "
            f"{_shape(v_cache)} {v_cache.dtype}"
        )
    if k_new.shape != v_new.shape:
        raise ValueError(f"k_new and v_new must match, got {_shape(k_new)} and {_shape(v_new)}")
    B, H, _, D = k_cache.shape
    one, Hn, _, Dn = k_new.shape
    if (one, Hn, Dn) != (1, H, D):
        raise ValueError(
            f"packed new keys {_shape(k_new)} must be [1, Hkv={H}, N, D={D}] to fit the cache "
            f"{_shape(k_cache)}"
        )
    _check_cu(cu_q_lens, B)
    check_lengths_tensor("cache_lens", cache_lens, B)
    check_same_device(
        k_cache=k_cache,
        v_cache=v_cache,
        k_new=k_new,
        v_new=v_new,
        cu_q_lens=cu_q_lens,
        cache_lens=cache_lens,
    )


def _packed_lengths(
    op: str, cu_q_lens, lens, N: int, S: int, lens_name: str, concrete: bool
) -> None:
    if not _CHECK_LENGTHS:
        return
    if not (concrete or (_is_concrete(cu_q_lens) and _is_concrete(lens))):
        return
    cu, ln = cu_q_lens.tolist(), lens.tolist()  # the one host read of the lengths
    if cu[0] != 0:
        raise ValueError(
            f"{op}: cu_q_lens[0] must be 0 (row 0's tokens start the pass), got {cu[0]}"
        )
    q_lens = [e - a for a, e in itertools.pairwise(cu)]
    if min(q_lens, default=0) < 0:
        b = next(b for b, n in enumerate(q_lens) if n < 0)
        raise ValueError(
            f"{op}: cu_q_lens must be non-decreasing, but cu_q_lens[{b + 1}] = "
            f"{cu[b + 1]} < cu_q_lens[{b}] = {cu[b]}"
        )
    if cu[-1] > N:
        raise ValueError(
            f"{op}: cu_q_lens[B] = {cu[-1]} tokens but the pass has N = {N} "
            f"({'q' if lens_name == 'kv_lens' else 'k_new'}.shape[2]); tokens past "
            "cu_q_lens[B] are padding, the rows' tokens must fit in N"
        )
    if lens_name == "kv_lens":  # the common case first: one pass, no error
        if max(ln, default=0) <= S and all(n <= x for n, x in zip(q_lens, ln)):
            return
        conds = (
            (lambda n, x: x > S, f"kv_lens[b] <= S = {S} (the cache size, k.shape[2])"),
            (
                lambda n, x: n > x,
                "q_len[b] <= kv_lens[b] (the new tokens are the last keys of their row; "
                "append them first)",
            ),
        )
    else:
        if min(ln, default=0) >= 0 and all(n + x <= S for n, x in zip(q_lens, ln)):
            return
        conds = (
            (lambda n, x: x < 0, "cache_lens[b] >= 0"),
            (
                lambda n, x: x + n > S,
                f"cache_lens[b] + q_len[b] <= S = {S}: the cache is full; allocate a larger one",
            ),
        )
    for cond, what in conds:
        for b, (n, x) in enumerate(zip(q_lens, ln)):
            if cond(n, x):
                raise ValueError(
                    f"{op}: row {b} has q_len={n} (cu_q_lens[{b}:{b + 2}] = "
                    f"{cu[b : b + 2]}), {lens_name}={x}; expected {what}"
                )


def check_packed_attention_lengths(cu_q_lens, kv_lens, N: int, S: int, concrete=False) -> None:
    """Range checks of ``ragged_attention_packed``'s lengths (one host read), when length
    checks are on and the tensors are concrete (``concrete=True``: the caller knows, as a
    backend kernel does)."""
    _packed_lengths("ragged_attention_packed", cu_q_lens, kv_lens, N, S, "kv_lens", concrete)


def check_packed_append_lengths(cu_q_lens, cache_lens, N: int, S: int, concrete=False) -> None:
    """Range checks of ``kv_append_packed``'s lengths, as
    :func:`check_packed_attention_lengths`."""
    _packed_lengths("kv_append_packed", cu_q_lens, cache_lens, N, S, "cache_lens", concrete)


def check_packed_attention_inputs(q, k, v, cu_q_lens, kv_lens, scale) -> None:
    """Validate ``ragged_attention_packed``'s arguments against its documented contract."""
    check_packed_attention_metadata(q, k, v, cu_q_lens, kv_lens, scale)
    check_packed_attention_lengths(cu_q_lens, kv_lens, q.shape[2], k.shape[2])


def check_packed_append_inputs(k_cache, v_cache, k_new, v_new, cu_q_lens, cache_lens) -> None:
    """Validate ``kv_append_packed``'s arguments against its documented contract."""
    check_packed_append_metadata(k_cache, v_cache, k_new, v_new, cu_q_lens, cache_lens)
    check_packed_append_lengths(cu_q_lens, cache_lens, k_new.shape[2], k_cache.shape[2])
