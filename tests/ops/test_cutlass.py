"""The CUTLASS implementations ``pad`` and ``split`` (bass.ops.cutlass, cutlass_kernels/).

Three tiers:

* CPU (default run): the generator is deterministic and the committed sources are its
  output (needs ``nvidia-cutlass``, skipped otherwise); the build plan and cache key; the
  loader says why it is unavailable; the ops' schemas, registrations and fake impls; the
  masked-softmax Triton kernel in the Triton interpreter (a ``TRITON_INTERPRET=1``
  subprocess, needs ``triton``).
* ``cutlass_compile``: ``cutlass_kernels/build.py --check`` compiles every unit with nvcc
  (about ten minutes on 2 cores; needs nvcc and ``nvidia-cutlass``).
* ``gpu``: pad and split against the reference on ragged GQA inputs, opcheck, compile;
  skipped without CUDA or without a built ``libbass_cutlass.so``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import bass
from bass.ops import cutlass as bc

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ROOT / "cutlass_kernels"
GENERATED = KERNELS / "generated"
SCHEMA = "(Tensor q, Tensor k, Tensor v, Tensor q_lens, Tensor kv_lens, float scale) -> Tensor"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"bass_test_{name}", KERNELS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --------------------------------------------------------------------------- generator & build


def _emit(out: Path, seed: str) -> None:
    env = {**os.environ, "PYTHONHASHSEED": seed}
    subprocess.run(
        [sys.executable, str(KERNELS / "generate.py"), "--out", str(out)],
        check=True,
        capture_output=True,
        env=env,
        cwd=out.parent,
    )


def _tree(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_generated_sources_are_reproducible_and_committed(tmp_path):
    # find_spec, not importorskip: importing cutlass_cppgen writes compiled_cache.db into
    # the working directory (generate.py runs it in a temporary one).
    if importlib.util.find_spec("cutlass_cppgen") is None:
        pytest.skip("needs nvidia-cutlass (pip install --no-deps nvidia-cutlass numpy networkx)")
    first, second = tmp_path / "a", tmp_path / "b"
    _emit(first, "1")
    _emit(second, "12345")  # the library's default tile pick depends on the hash seed
    assert _tree(first) == _tree(second), "generate.py output depends on the hash seed"
    committed = _tree(GENERATED)
    assert sorted(committed) == sorted(_tree(first)), "generated/ has extra or missing files"
    stale = [name for name, text in _tree(first).items() if committed[name] != text]
    assert not stale, f"re-run python cutlass_kernels/generate.py; stale: {stale}"
    assert not list(tmp_path.glob("compiled_cache.db")), "cutlass_cppgen cache leaked"


def test_generated_kernels_are_the_ones_glue_dispatches():
    manifest = json.loads((GENERATED / "manifest.json").read_text())
    names = {k["name"] for k in manifest["kernels"]}
    glue = (KERNELS / "glue.cu").read_text()
    for family in ("sm90_pad", "sm80_pad", "grouped"):
        for product in ("qk", "pv"):
            for dtype in ("f16", "bf16"):
                name = f"{family}_{product}_{dtype}"
                assert name in names and name in glue
                assert (GENERATED / f"{name}.cu").is_file()
    for entry in manifest["kernels"]:
        a, b, c = entry["layouts"]
        # the key dimension is never the contiguous one of a 16-bit operand
        qk = entry["product"] == "qk"
        assert (a, b) == (("RowMajor", "ColumnMajor") if qk else ("ColumnMajor", "RowMajor"))
        assert c == "RowMajor"
        assert entry["arch"] == (90 if entry["family"] == "sm90_pad" else 80)


def test_build_plan_and_cache_key(tmp_path, monkeypatch):
    build = _load("build")
    monkeypatch.setenv("BASS_CUTLASS_CACHE", str(tmp_path))
    assert build.cache_root() == tmp_path
    units = [u.stem for u in build.units("90")]
    assert units[0] == "glue" and len(units) == 9
    assert {u for u in units if u.startswith("sm")} == {
        f"sm90_pad_{p}_{d}" for p in ("qk", "pv") for d in ("f16", "bf16")
    }
    assert "-gencode=arch=compute_90a,code=sm_90a" in build.flags("90")
    assert build.source_hash("90") == build.source_hash("90") != build.source_hash("80")
    assert build.ABI_VERSION == bc.ABI_VERSION
    assert f"#define BASS_CUTLASS_ABI_VERSION {bc.ABI_VERSION}" in (KERNELS / "glue.cu").read_text()
    with pytest.raises(ValueError, match="arch must be one of"):
        build.units("75")


# --------------------------------------------------------------------------- loader & ops (CPU)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA path")
def test_loader_says_why_it_is_unavailable(tmp_path, monkeypatch):
    assert not bc.available()
    assert "no CUDA device" in bc.unavailable_reason()
    monkeypatch.setenv("BASS_CUTLASS_CACHE", str(tmp_path))
    monkeypatch.delenv("BASS_CUTLASS_LIB", raising=False)
    path, why = bc.library_path()
    assert path is None and "not built" in why and "python cutlass_kernels/build.py" in why
    monkeypatch.setenv("BASS_CUTLASS_LIB", str(tmp_path / "nope.so"))
    assert bc.library_path() == (None, f"{tmp_path / 'nope.so'} missing")
    assert "pad" not in bass.ops.implementations()
    with pytest.raises(RuntimeError, match=r"'split' is not available here \(no CUDA device"):
        bass.ops.resolve("split", torch.device("cuda"))


def test_ops_are_registered_with_schemas():
    for name in ("pad", "split"):
        op = getattr(torch.ops.bass, f"ragged_attention_{name}").default
        assert str(op._schema) == f"bass::ragged_attention_{name}{SCHEMA}"
        impl = bass.ops.plan.IMPLEMENTATIONS[name]
        assert impl.devices == ("cuda",) and impl.unavailable is bc.unavailable_reason
        # what the second GPU lease showed (bench/results/gpu/2026-11-27-h100)
        assert not impl.single_launch and "matched the reference on an H100" in impl.description
        for kind in bass.ops.PASS_KINDS:  # named explicitly only
            assert bass.ops.resolve("auto", torch.device("cuda"), kind)[0].name != name


@pytest.mark.parametrize("name", ["pad", "split"])
@pytest.mark.parametrize("transposed_q", [False, True])
def test_fake_impls_on_cuda_like_tensors(name, transposed_q):
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    op = getattr(torch.ops.bass, f"ragged_attention_{name}")
    with FakeTensorMode():
        q = torch.empty(2, 8, 3, 64, dtype=torch.bfloat16, device="cuda")
        if transposed_q:
            q = torch.empty(2, 3, 8, 64, dtype=torch.bfloat16, device="cuda").transpose(1, 2)
        k = torch.empty(2, 2, 40, 64, dtype=torch.bfloat16, device="cuda")
        lens = torch.empty(2, dtype=torch.int32, device="cuda")
        out = op(q, k, k, lens, lens, 0.125)
    assert isinstance(out, FakeTensor)
    assert out.shape == q.shape and out.dtype == q.dtype and out.device.type == "cuda"
    assert out.is_contiguous()  # the contract, whatever q's strides


def test_ops_have_no_cpu_kernel():
    q = torch.zeros(1, 1, 1, 8, dtype=torch.float16)
    lens = torch.ones(1, dtype=torch.int32)
    with pytest.raises(NotImplementedError):
        torch.ops.bass.ragged_attention_split(q, q, q, lens, lens, 1.0)


# --------------------------------------------------------------------------- softmax (interpreter)

SOFTMAX_CASES = [
    # B, Hkv, G, T, rows, per_row_keys
    (3, 2, 2, 3, 13, False),
    (2, 1, 1, 1, 5, True),
    (3, 2, 3, 4, 20, True),
    (2, 2, 1, 8, 70, False),
    (1, 1, 4, 2, 600, True),
]


def masked_softmax_reference(
    scores: torch.Tensor,
    q_lens: torch.Tensor,
    kv_lens: torch.Tensor,
    *,
    heads_kv: int,
    q_len: int,
    group: int,
    scale: float,
    n_keys: int,
) -> torch.Tensor:
    """What :func:`masked_softmax` writes (keys ``< n_keys``, every column), in torch.

    The kernel's twin (in the Triton interpreter on CPU, or on a GPU).
    """
    n_problems, rows, ld = scores.shape
    b = torch.arange(n_problems, device=scores.device) // heads_kv
    ql = q_lens.to(torch.long)[b][:, None, None]
    kl = kv_lens.to(torch.long)[b][:, None, None]
    s = torch.arange(rows, device=scores.device)[None, :, None]
    r = torch.arange(ld, device=scores.device)[None, None, :]
    t = r % q_len
    seen = (r < group * q_len) & (t < ql) & (s <= kl - ql + t) & (s < n_keys)
    x = torch.where(seen, scores * scale, torch.tensor(float("-inf"), device=scores.device))
    probs = torch.softmax(x, dim=1)
    return torch.where(seen, probs, torch.zeros((), device=scores.device))


def softmax_interpreter_check() -> None:
    """Run the masked softmax kernel on CPU tensors (call under TRITON_INTERPRET=1)."""
    import numpy as np
    from triton.runtime import interpreter

    if np.lib.NumpyVersion(np.__version__) >= "2.4.0":  # see test_triton_fused.py
        original = interpreter._patch_lang_tensor

        def patched(tensor, scope):
            original(tensor, scope)
            scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

        interpreter._patch_lang_tensor = patched

    from bass.ops.cutlass import masked_softmax

    g = torch.Generator().manual_seed(0)
    for B, Hkv, G, T, rows, per_row in SOFTMAX_CASES:
        R = G * T
        ld, P = (R + 7) // 8 * 8, B * Hkv
        kv = torch.randint(0, rows + 1, (B,), dtype=torch.int32, generator=g)
        kv[0] = rows
        ql = torch.minimum(torch.randint(0, T + 1, (B,), dtype=torch.int32, generator=g), kv)
        ql[-1] = 0 if B > 1 else ql[-1]
        scores = torch.randn(P, rows, ld, generator=g) * 4
        scores[:, :, R:] = float("nan")  # columns past the query rows are never read
        for b in range(B):  # neither are keys past kv_len
            scores[b * Hkv : (b + 1) * Hkv, int(kv[b]) :] = float("nan")
        for dtype in (torch.float16, torch.bfloat16):
            probs = torch.full((P, rows, ld), 7.0, dtype=dtype)
            kw = dict(heads_kv=Hkv, q_len=T, group=G, scale=0.3, n_keys=rows)
            masked_softmax(scores, probs, ql, kv, per_row_keys=per_row, **kw)
            expected = masked_softmax_reference(scores, ql, kv, **kw)
            written = torch.ones(P, rows, ld, dtype=torch.bool)
            if per_row:  # only keys < kv_len[b] are written
                b = torch.arange(P) // Hkv
                written = torch.arange(rows)[None, :, None] < kv.long()[b][:, None, None]
                written = written.expand(P, rows, ld)
                assert bool((probs[~written] == 7).all()), "wrote past kv_len"
            got, expected = probs[written].float(), expected[written]
            assert not got.isnan().any()
            tol = 2**-10 if dtype == torch.float16 else 2**-7
            torch.testing.assert_close(got, expected, rtol=tol, atol=tol)
            # each valid query row sums to 1 over the keys it sees; padding rows are all 0
            sums = torch.where(written, probs.float(), 0.0).sum(dim=1)  # [P, ld]
            t = torch.arange(ld) % T
            valid = (torch.arange(ld) < R) & (t[None, :] < ql.long()[torch.arange(P) // Hkv, None])
            torch.testing.assert_close(sums[valid], torch.ones_like(sums[valid]), atol=0.02, rtol=0)
            assert bool((sums[~valid] == 0).all())


def test_masked_softmax_in_triton_interpreter():
    pytest.importorskip("triton", reason="needs triton (pip install triton==3.6.0)")
    code = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(ROOT / "tests" / "ops")!r})
        import test_cutlass
        test_cutlass.softmax_interpreter_check()
        print("softmax ok")
        """
    )
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600
    )
    assert proc.returncode == 0 and "softmax ok" in proc.stdout, proc.stdout + proc.stderr


# --------------------------------------------------------------------------- nvcc compile check


@pytest.mark.cutlass_compile
def test_cutlass_sources_compile():
    """Every unit of the sm_90a build compiles (minutes; run with ``-m cutlass_compile``)."""
    build = _load("build")
    try:
        build.find_nvcc()
        build.include_dirs()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    proc = subprocess.run(
        [sys.executable, str(KERNELS / "build.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=3600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "check ok: 9 unit(s)" in proc.stdout


# --------------------------------------------------------------------------- GPU


@pytest.fixture
def gpu_kernels():
    """Skip unless CUDA is present and libbass_cutlass.so loads."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    if not bc.available():
        pytest.skip(f"CUTLASS kernels unavailable: {bc.unavailable_reason()}")


def gpu_test(fn):
    return pytest.mark.gpu(pytest.mark.usefixtures("gpu_kernels")(fn))


GPU_CASES = {
    # B, Hkv, G, T, S, D, q_lens, kv_lens
    "gqa-ragged": (3, 2, 4, 4, 37, 64, (4, 0, 2), (37, 5, 2)),
    "decode": (4, 1, 1, 1, 300, 128, (1, 1, 1, 0), (300, 1, 150, 0)),
    "t8-aligned": (2, 4, 2, 8, 130, 128, (8, 3), (8, 130)),
    "g3-t5": (5, 2, 3, 5, 64, 96, (5, 1, 0, 3, 5), (64, 1, 0, 33, 5)),
    "long": (2, 8, 4, 8, 2048, 128, (8, 6), (2048, 1000)),
    "all-empty": (2, 2, 2, 2, 16, 64, (0, 0), (0, 7)),
}
GPU_TOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def _gpu_case(name, dtype, seed=0):
    B, Hkv, G, T, S, D, q_lens, kv_lens = GPU_CASES[name]
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(B, Hkv * G, T, D, generator=g, device="cuda").to(dtype)
    k = torch.randn(B, Hkv, S, D, generator=g, device="cuda").to(dtype)
    v = torch.randn(B, Hkv, S, D, generator=g, device="cuda").to(dtype)
    ql = torch.tensor(q_lens, dtype=torch.int32, device="cuda")
    kl = torch.tensor(kv_lens, dtype=torch.int32, device="cuda")
    return q, k, v, ql, kl, D**-0.5


def _check(out, args):
    q, k, v, ql, kl, scale = args
    expected = torch.ops.bass.ragged_attention(q, k, v, ql, kl, scale, "reference")
    assert out.shape == q.shape and out.dtype == q.dtype and not out.isnan().any()
    tol = GPU_TOL[q.dtype] * max(1.0, float(v.abs().max()))
    torch.testing.assert_close(out.float(), expected.float(), rtol=GPU_TOL[q.dtype], atol=tol)
    T = q.shape[2]
    padding = torch.arange(T, device=q.device)[None, :] >= ql[:, None]  # [B, T]
    assert bool((out.transpose(1, 2)[padding] == 0).all()), "padding query slots must be 0"


@pytest.mark.parametrize("name", ["pad", "split"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", list(GPU_CASES))
@gpu_test
def test_gpu_matches_reference(name, dtype, case):
    args = _gpu_case(case, dtype)
    out = torch.ops.bass.ragged_attention(*args, impl=name)
    _check(out, args)
    torch.cuda.synchronize()


@pytest.mark.parametrize("name", ["pad", "split"])
@pytest.mark.parametrize("seed", range(12))
@gpu_test
def test_gpu_random_ragged_batches(name, seed):
    """Random shapes and lengths: GQA groups, odd query counts, empty and full rows."""
    g = torch.Generator().manual_seed(seed)

    def pick(options):
        return options[int(torch.randint(len(options), (1,), generator=g))]

    B, Hkv, G = pick([1, 2, 3, 6]), pick([1, 2, 4]), pick([1, 2, 4, 8])
    T, S, D = pick([1, 2, 3, 4, 8, 16]), pick([1, 17, 64, 255, 600]), pick([64, 128])
    kv = torch.randint(0, S + 1, (B,), generator=g)
    kv[0] = S
    ql = torch.minimum(torch.randint(0, T + 1, (B,), generator=g), kv)
    dtype = pick([torch.float16, torch.bfloat16])
    q = torch.randn(B, Hkv * G, T, D, generator=g).to(dtype).cuda()
    k, v = (torch.randn(B, Hkv, S, D, generator=g).to(dtype).cuda() for _ in range(2))
    args = (q, k, v, ql.int().cuda(), kv.int().cuda(), D**-0.5)
    _check(torch.ops.bass.ragged_attention(*args, impl=name), args)


@pytest.mark.parametrize("name", ["pad", "split"])
@gpu_test
def test_gpu_strided_inputs_and_fallback(name):
    q, k, v, ql, kl, scale = _gpu_case("gqa-ragged", torch.float16)
    qt = q.transpose(1, 2).contiguous().transpose(1, 2)  # HF's layout: [B, T, H, D] storage
    big_k = torch.zeros(k.shape[0], k.shape[1], 64, k.shape[3], dtype=k.dtype, device="cuda")
    big_v = big_k.clone()
    big_k[:, :, : k.shape[2]], big_v[:, :, : k.shape[2]] = k, v
    args = (qt, big_k[:, :, : k.shape[2]], big_v[:, :, : k.shape[2]], ql, kl, scale)
    out = torch.ops.bass.ragged_attention(*args, impl=name)
    assert out.is_contiguous()  # the op's contract: contiguous whatever q's strides
    _check(out, args)
    f32 = (q.float(), k.float(), v.float(), ql, kl, scale)
    assert torch.equal(
        torch.ops.bass.ragged_attention(*f32, impl=name),
        torch.ops.bass.ragged_attention(*f32, impl="reference"),
    )


@pytest.mark.parametrize("name", ["pad", "split"])
@gpu_test
def test_gpu_cache_slots_past_kv_len_are_ignored(name):
    q, k, v, ql, kl, scale = _gpu_case("gqa-ragged", torch.bfloat16)
    out = torch.ops.bass.ragged_attention(q, k, v, ql, kl, scale, impl=name)
    k2, v2 = k.clone(), v.clone()
    for b, n in enumerate(kl.tolist()):
        k2[b, :, n:] = float("nan")
        # pad multiplies value slots up to the longest row by exact zeros: finite garbage
        # is harmless there, NaN is not (documented); split never reads them.
        v2[b, :, n:] = float("nan") if name == "split" else 1e3
    again = torch.ops.bass.ragged_attention(q, k2, v2, ql, kl, scale, impl=name)
    assert torch.equal(again, out)


@pytest.mark.parametrize("name", ["pad", "split"])
@gpu_test
def test_gpu_opcheck_and_compile(name):
    args = _gpu_case("gqa-ragged", torch.float16)
    op = getattr(torch.ops.bass, f"ragged_attention_{name}").default
    torch.library.opcheck(op, args)
    eager = op(*args)
    compiled = torch.compile(
        lambda *a: torch.ops.bass.ragged_attention(*a, impl=name), fullgraph=True
    )(*args)
    assert torch.equal(compiled, eager)
