"""``pad`` and ``split``: the paper's BASS-PAD and BASS-SPLIT (arXiv 2404.15778, Fig. 4b/4c)
on CUTLASS, by name only: two GEMMs per (row, KV head) with a Triton :func:`masked_softmax`
between, from ``libbass_cutlass.so`` (:func:`library_path`). Design: docs/reference/ops.md,
"pad and split"."""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import json
import os
from pathlib import Path

import torch

from . import reference
from .fused import _jit, _next_pow2, tl, triton  # triton None: masked_softmax raises

__all__ = ["available", "library_path", "masked_softmax", "unavailable_reason"]

ABI_VERSION = 1  # cutlass_kernels/glue.cu's BASS_CUTLASS_ABI_VERSION
KERNELS_DIR = Path(__file__).resolve().parents[3] / "cutlass_kernels"
BUILD_HINT = (
    "build it with `python cutlass_kernels/build.py` (needs nvcc and "
    "`pip install --no-deps nvidia-cutlass`; see cutlass_kernels/README.md)"
)
_DTYPE_CODE = {torch.float16: 0, torch.bfloat16: 1}
_QK, _PV = 0, 1
_i64, _i32, _f32, _vp = ctypes.c_int64, ctypes.c_int, ctypes.c_float, ctypes.c_void_p


# --------------------------------------------------------------------------- finding & loading


def library_path() -> tuple[Path | None, str]:
    """The library this process would load, or ``None`` and the reason there is none.

    ``$BASS_CUTLASS_LIB`` wins; otherwise the newest build in ``$BASS_CUTLASS_CACHE``
    (default ``~/.cache/bass/cutlass``) whose ABI and arch match, and, in a source
    checkout, whose sources match the checkout's.
    """
    env = os.environ.get("BASS_CUTLASS_LIB")
    if env:
        path = Path(env).expanduser()
        return (path, "from $BASS_CUTLASS_LIB") if path.is_file() else (None, f"{env} missing")
    # sm_90a unless the current GPU is an sm_8x one (then sm_80)
    sm8 = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 8
    arch = "80" if sm8 else "90"
    build = KERNELS_DIR / "build.py"  # a source checkout's (absent when bass is installed)
    try:
        want = None
        if build.is_file():
            spec = importlib.util.spec_from_file_location("bass_cutlass_build", build)
            builder = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(builder)
            want = builder.source_hash(arch)
    except (OSError, ValueError) as e:  # pragma: no cover - broken checkout
        return None, f"cannot hash cutlass_kernels/: {e}"
    env = os.environ.get("BASS_CUTLASS_CACHE")
    root = Path(env).expanduser() if env else Path.home() / ".cache" / "bass" / "cutlass"
    builds = sorted(root.glob("*/build.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    for info_path in builds:
        try:
            info = json.loads(info_path.read_text())
        except (OSError, ValueError):
            continue
        lib = info_path.parent / "libbass_cutlass.so"
        if info.get("abi") != ABI_VERSION or info.get("arch") != arch or not lib.is_file():
            continue
        if want is not None and info.get("source_hash") != want:
            continue
        return lib, f"cached build {info_path.parent.name}"
    stale = " (only builds of other sources)" if builds else ""
    return None, f"libbass_cutlass.so for sm_{arch} not built in {root}{stale}; {BUILD_HINT}"


@functools.lru_cache(maxsize=1)
def _load() -> tuple[ctypes.CDLL | None, str]:
    path, why = library_path()
    if path is None:
        return None, why
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as e:
        return None, f"cannot load {path}: {e}"
    version = lib.bass_cutlass_abi_version()
    if version != ABI_VERSION:
        return None, f"{path} has C ABI {version}, this bass needs {ABI_VERSION}; {BUILD_HINT}"
    lib.bass_cutlass_abi_version.restype = _i32
    lib.bass_cutlass_last_error.restype = ctypes.c_char_p
    lib.bass_cutlass_build_info.restype = ctypes.c_char_p
    lib.bass_cutlass_split_workspace_bytes.restype = ctypes.c_size_t
    lib.bass_cutlass_split_workspace_bytes.argtypes = [_i32]
    batched = [_i32] * 6 + [_vp, _i64, _i64] * 3 + [_f32, _i32, _vp]
    lib.bass_cutlass_gemm_batched.argtypes = batched
    lib.bass_cutlass_gemm_grouped.argtypes = [_i32] * 3 + [_vp] * 7 + [_f32, _i32, _vp]
    setup = [_i32] * 7 + [_vp, _vp] + [_vp, _i64, _i64, _i64] * 3
    # scores, probs, sp_slab, ld_sp, out, out_slab, ld_out, workspace, stream
    tail = [_vp, _vp, _i64, _i64, _vp, _i64, _i64, _vp, _vp]
    lib.bass_cutlass_split_setup.argtypes = setup + tail
    lib.bass_cutlass_split_gemm.argtypes = [_i32, _i32, _i32, _vp, _f32, _i32, _vp]
    for name in ("gemm_batched", "gemm_grouped", "split_setup", "split_gemm"):
        getattr(lib, f"bass_cutlass_{name}").restype = _i32
    return lib, f"{path} ({lib.bass_cutlass_build_info().decode()})"


@functools.lru_cache(maxsize=1)
def _status() -> tuple[bool, str]:
    if not torch.cuda.is_available():
        return False, "no CUDA device (torch.cuda.is_available() is False)"
    major, minor = torch.cuda.get_device_capability()
    if major not in (8, 9):
        return False, f"no kernels for sm_{major}{minor} (built for sm_80 and sm_90a only)"
    lib, why = _load()
    if lib is None:
        return False, why
    if importlib.util.find_spec("triton") is None:
        return False, "triton is not installed (the masked softmax is a Triton kernel)"
    return True, why


def available() -> bool:
    """True when CUDA is present and ``libbass_cutlass.so`` loads (cached per process)."""
    return _status()[0]


def unavailable_reason() -> str | None:
    """Why :func:`available` is False (``None`` when it is True)."""
    ok, why = _status()
    return None if ok else why


# --------------------------------------------------------------------------- masked softmax
# Between the two GEMMs: scores^T[p, s, r] (float32) to P^T[p, s, r] (the input dtype); the
# layout and masking rule: docs/reference/ops.md, "pad and split".


@_jit
def _masked_softmax_kernel(
    scores_ptr,  # float32 [P, rows, ld]
    probs_ptr,  # fp16/bf16 [P, rows, ld]
    q_lens_ptr,  # int32 [B]
    kv_lens_ptr,  # int32 [B]
    n_keys,  # keys written per problem when not PER_ROW_KEYS
    slab,  # elements between problems (rows * ld)
    ld,  # elements between keys (row stride)
    n_rows,  # G * T query rows per problem
    heads_kv,
    T,
    scale,
    PER_ROW_KEYS: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    p = tl.program_id(0)
    b = p // heads_kv
    ql = tl.load(q_lens_ptr + b)
    kl = tl.load(kv_lens_ptr + b)
    r = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    t = r % T
    valid = (r < n_rows) & (t < ql)
    pos = kl - ql + t  # last key each query row sees
    if PER_ROW_KEYS:
        limit = tl.minimum(kl, n_keys)
    else:
        limit = n_keys
    base = p.to(tl.int64) * slab
    in_cols = r < ld

    # pass 1: running max and normaliser per query row (online softmax)
    m = tl.full([BLOCK_R], float("-inf"), tl.float32)
    den = tl.zeros([BLOCK_R], tl.float32)
    for s0 in range(0, limit, BLOCK_S):
        s = s0 + tl.arange(0, BLOCK_S)
        seen = valid[None, :] & (s[:, None] <= pos[None, :]) & (s[:, None] < limit)
        offs = base + s[:, None].to(tl.int64) * ld + r[None, :]
        x = tl.load(scores_ptr + offs, mask=seen, other=0.0)
        x = tl.where(seen, x * scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(x, axis=0))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        e = tl.where(seen, tl.exp(x - m_safe[None, :]), 0.0)
        den = den * tl.exp(m - m_safe) + tl.sum(e, axis=0)
        m = m_new

    # pass 2: write P (0 wherever a key is not seen)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    inv = tl.where(den > 0.0, 1.0 / tl.where(den > 0.0, den, 1.0), 0.0)
    for s0 in range(0, limit, BLOCK_S):
        s = s0 + tl.arange(0, BLOCK_S)
        inside = (s[:, None] < limit) & in_cols[None, :]
        seen = valid[None, :] & (s[:, None] <= pos[None, :]) & (s[:, None] < limit)
        offs = base + s[:, None].to(tl.int64) * ld + r[None, :]
        x = tl.load(scores_ptr + offs, mask=seen, other=0.0)
        prob = tl.where(seen, tl.exp(x * scale - m_safe[None, :]) * inv[None, :], 0.0)
        tl.store(probs_ptr + offs, prob.to(probs_ptr.dtype.element_ty), mask=inside)


def masked_softmax(scores: torch.Tensor, probs: torch.Tensor, q_lens: torch.Tensor,
                   kv_lens: torch.Tensor, *, heads_kv: int, q_len: int, group: int, scale: float,
                   n_keys: int, per_row_keys: bool) -> None:  # fmt: skip
    """Write ``probs`` (``[P, rows, ld]``, fp16/bf16) from ``scores`` (same, float32).

    ``P = B * heads_kv``; query rows ``r < group * q_len`` are ``r = g * q_len + t``.
    Without ``per_row_keys`` keys ``s < n_keys`` are written; with it, keys
    ``s < min(kv_lens[b], n_keys)`` (the rest of ``probs`` is left as it was), and
    ``n_keys`` must bound every ``kv_lens[b]`` (the cache length).
    """
    if triton is None:
        raise RuntimeError("the masked softmax needs triton (pip install triton)")
    n_problems, rows, ld = scores.shape
    if probs.shape != scores.shape or scores.dtype != torch.float32:
        raise ValueError("scores must be float32 and probs the same shape")
    if not (scores.is_contiguous() and probs.is_contiguous()):
        raise ValueError("scores and probs must be contiguous")
    n_rows = group * q_len
    if n_problems == 0 or n_rows == 0 or rows == 0:
        return
    q_lens, kv_lens = q_lens.contiguous(), kv_lens.contiguous()  # indexed as flat [B]
    block_r = min(64, max(8, _next_pow2(ld)))
    block_s = max(16, 4096 // block_r)
    grid = (n_problems, triton.cdiv(ld, block_r))
    _masked_softmax_kernel[grid](scores, probs, q_lens, kv_lens, n_keys, rows * ld, ld, n_rows,
                                 heads_kv, q_len, float(scale), PER_ROW_KEYS=per_row_keys,
                                 BLOCK_S=block_s, BLOCK_R=block_r)  # fmt: skip


# --------------------------------------------------------------------------- the computation


def _call(lib: ctypes.CDLL, name: str, *args) -> None:
    status = getattr(lib, f"bass_cutlass_{name}")(*args)
    if status != 0:
        message = lib.bass_cutlass_last_error().decode(errors="replace")
        raise RuntimeError(f"bass_cutlass_{name} failed (status {status}): {message}")


def _gemm_ready(t: torch.Tensor) -> tuple[torch.Tensor, int]:
    """``t`` ([B, H, S, D]) laid out for the kernels (unit stride along D, strides multiples
    of 8, a 16-byte aligned base, (b, h) slabs one stride apart; else a copy), and its
    per-(b, h) slab stride."""
    B, H = t.shape[0], t.shape[1]
    # the fallback is a fresh (aligned) copy: .contiguous() would hand back a contiguous
    # tensor that is misaligned by its storage offset unchanged
    for attempt in (t, t.clone(memory_format=torch.contiguous_format)):
        s0, s1, s2, s3 = attempt.stride()
        slab = s0 if H == 1 else s1
        uniform = (H == 1 or B == 1 or s0 == H * s1) and attempt.data_ptr() % 16 == 0
        if s3 == 1 and s2 % 8 == s0 % 8 == slab % 8 == 0 and uniform:
            return attempt, slab
    raise AssertionError("a fresh contiguous tensor with D % 8 == 0 qualifies")  # pragma: no cover


def _aligned(t: torch.Tensor) -> torch.Tensor:
    """``t`` contiguous with a 16-byte aligned base (TMA and vector loads need both)."""
    t = t.contiguous()
    return t if t.data_ptr() % 16 == 0 else t.clone()


def _shapes(q, k) -> tuple:
    """The library and a call's sizes: ``B, Hq, T, D, Hkv, S, G``, problems ``P = B *
    Hkv`` of ``R = G * T`` query rows (``ld``: R rounded up to 8), dtype code, device
    index, stream."""
    B, Hq, T, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    G = Hq // Hkv
    stream = torch.cuda.current_stream(q.device).cuda_stream
    ok, why = _status()
    if not ok:
        raise RuntimeError(f"bass CUTLASS kernels unavailable: {why}")
    return (_load()[0], B, Hq, T, D, Hkv, S, G, B * Hkv, G * T, (G * T + 7) // 8 * 8,
            _DTYPE_CODE.get(q.dtype), q.device.index, stream)  # fmt: skip


def _pad(q, k, v, q_lens, kv_lens, scale: float) -> torch.Tensor:
    lib, B, Hq, T, D, Hkv, S, G, P, R, ld, dt, dev, stream = _shapes(q, k)
    # Host read (one sync): PAD pads every row to the batch's longest cache.
    s_eff = min(int(kv_lens.max()), S) if B else 0
    if P == 0 or T == 0 or s_eff <= 0:
        return torch.zeros(B, Hq, T, D, dtype=q.dtype, device=q.device)
    # ld: 3.x TMA wants contiguous extents and strides that are multiples of 8
    q3 = _aligned(q).view(P, R, D)
    if ld != R:
        q_pad = q3.new_zeros(P, ld, D)
        q_pad[:, :R] = q3
        q3 = q_pad
    k, k_slab = _gemm_ready(k)
    v, v_slab = _gemm_ready(v)
    q_lens, kv_lens = q_lens.contiguous(), kv_lens.contiguous()
    scores = torch.empty(P, s_eff, ld, dtype=torch.float32, device=q.device)
    _call(lib, "gemm_batched", _QK, dt, s_eff, ld, D, P,
          k.data_ptr(), k.stride(2), k_slab, q3.data_ptr(), D, ld * D,
          scores.data_ptr(), ld, s_eff * ld, 1.0, dev, stream)  # fmt: skip
    probs = torch.empty(P, s_eff, ld, dtype=q.dtype, device=q.device)
    masked_softmax(scores, probs, q_lens, kv_lens, heads_kv=Hkv, q_len=T, group=G,
                   scale=scale, n_keys=s_eff, per_row_keys=False)  # fmt: skip
    out = torch.empty(P, ld, D, dtype=q.dtype, device=q.device)
    _call(lib, "gemm_batched", _PV, dt, ld, D, s_eff, P,
          probs.data_ptr(), ld, s_eff * ld, v.data_ptr(), v.stride(2), v_slab,
          out.data_ptr(), D, ld * D, 1.0, dev, stream)  # fmt: skip
    return out[:, :R].reshape(B, Hq, T, D)


def _split(q, k, v, q_lens, kv_lens, scale: float) -> torch.Tensor:
    lib, B, Hq, T, D, Hkv, S, G, P, R, ld, dt, dev, stream = _shapes(q, k)
    # Rows past each problem's last valid query row are never written: start from zeros.
    out = torch.zeros(B, Hq, T, D, dtype=q.dtype, device=q.device)
    if P == 0 or T == 0 or S == 0:
        return out
    q = _aligned(q)
    k, _ = _gemm_ready(k)
    v, _ = _gemm_ready(v)
    scores = torch.empty(P, S, ld, dtype=torch.float32, device=q.device)
    probs = torch.empty(P, S, ld, dtype=q.dtype, device=q.device)
    workspace = torch.empty(
        lib.bass_cutlass_split_workspace_bytes(P), dtype=torch.uint8, device=q.device
    )
    q_lens, kv_lens = q_lens.contiguous(), kv_lens.contiguous()
    _call(lib, "split_setup", dt, B, Hkv, G, T, D, S, q_lens.data_ptr(), kv_lens.data_ptr(),
          q.data_ptr(), Hq * T * D, R * D, D,
          k.data_ptr(), k.stride(0), k.stride(1), k.stride(2),
          v.data_ptr(), v.stride(0), v.stride(1), v.stride(2),
          scores.data_ptr(), probs.data_ptr(), S * ld, ld,
          out.data_ptr(), R * D, D, workspace.data_ptr(), stream)  # fmt: skip
    _call(lib, "split_gemm", _QK, dt, P, workspace.data_ptr(), 1.0, dev, stream)
    masked_softmax(scores, probs, q_lens, kv_lens, heads_kv=Hkv, q_len=T, group=G,
                   scale=scale, n_keys=S, per_row_keys=True)  # fmt: skip
    _call(lib, "split_gemm", _PV, dt, P, workspace.data_ptr(), 1.0, dev, stream)
    return out


# The kernels as opaque ops (ctypes launches) on padded rows [B, Hq, T, D], contiguous out
def _define(kind: str) -> None:
    def kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_lens: torch.Tensor,
               kv_lens: torch.Tensor, scale: float) -> torch.Tensor:  # fmt: skip
        with torch.cuda.device(q.device):
            out = (_pad if kind == "pad" else _split)(q, k, v, q_lens, kv_lens, float(scale))
        return out.contiguous()

    op = torch.library.custom_op(f"bass::ragged_attention_{kind}", kernel, mutates_args=(),
                                 device_types="cuda")  # fmt: skip
    op.register_fake(lambda q, k, v, q_lens, kv_lens, scale: q.new_empty(q.shape))


_define("pad")
_define("split")


def prepare(plan) -> tuple:
    """The gather into padded rows (the longest row's width) and the lengths."""
    src, back = reference.row_slots(plan.starts, plan.q_lens, plan.width, plan.num_tokens)
    return src, back, plan.starts, plan.q_lens, plan.kv_lens


def runner(kind: str):
    """``run`` of ``pad`` or ``split``: queries gathered into rows, the kernels, back."""
    op = getattr(torch.ops.bass, f"ragged_attention_{kind}")

    def run(state, q, k, v, scale: float) -> torch.Tensor:
        src, back, starts, q_lens, kv_lens = state
        D = q.shape[-1]
        if q.dtype not in _DTYPE_CODE or D == 0 or D % 8 != 0:  # the kernels' inputs only
            return reference.attention(q, k, v, starts, q_lens, kv_lens, scale)
        rows = reference.to_rows(q, src).contiguous()  # [B, Hq, T, D]
        return reference.from_rows(op(rows, k, v, q_lens, kv_lens, scale), back)

    return run
