"""Build (or compile-check) libbass_cutlass.so from the generated CUTLASS sources.

Usage::

    python cutlass_kernels/build.py                 # build for sm_90a into the cache
    python cutlass_kernels/build.py --check         # compile every unit, link nothing
    python cutlass_kernels/build.py --check --only grouped_qk_f16   # one unit (CI)
    python cutlass_kernels/build.py --arch 80       # the sm_80 (A100) variant

Needs nvcc (``$BASS_NVCC``, ``$CUDA_HOME/bin/nvcc``, ``/usr/local/cuda/bin/nvcc`` or
``PATH``) and the CUTLASS headers of the ``nvidia-cutlass`` package (or ``$CUTLASS_PATH``
pointing at a CUTLASS checkout). No GPU is needed. Units compile one at a time (each
takes about a minute and up to 3 GB on 2 cores).

The library lands in ``$BASS_CUTLASS_CACHE`` (default ``~/.cache/bass/cutlass``) as
``<key>/libbass_cutlass.so`` next to ``build.json``; ``<key>`` hashes the sources, the
flags and the nvcc version, so an unchanged build is never redone. Object files are
cached too (``obj/<hash>.o``), so editing one unit recompiles only that unit.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
GENERATED = HERE / "generated"
ABI_VERSION = 1  # must match BASS_CUTLASS_ABI_VERSION in glue.cu
LIB_NAME = "libbass_cutlass.so"
HEADERS = ("launch.h", "generated/kernels.h")
ARCHES = {
    "90": ("-gencode=arch=compute_90a,code=sm_90a", "sm90_pad"),
    "80": ("-gencode=arch=compute_80,code=sm_80", "sm80_pad"),
}
BASE_FLAGS = (
    "-std=c++17",
    "-O3",
    "-DNDEBUG",
    "--expt-relaxed-constexpr",
    "-Xcompiler",
    "-fPIC",
)


# Export only the C API: every other symbol (CUTLASS instantiations, the static cudart)
# stays local, so nothing in the process can interpose on it (torch ships its own cudart
# and CUTLASS code).
EXPORTS_MAP = "{ global: bass_cutlass_*; local: *; };\n"
LINK_FLAGS = ("-shared", "-cudart", "static")


def cache_root() -> Path:
    """Where built libraries live: ``$BASS_CUTLASS_CACHE`` or ``~/.cache/bass/cutlass``."""
    env = os.environ.get("BASS_CUTLASS_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "bass" / "cutlass"


def units(arch: str = "90") -> list[Path]:
    """The translation units of one build: the glue, then the generated kernels."""
    if arch not in ARCHES:
        raise ValueError(f"arch must be one of {sorted(ARCHES)}, got {arch!r}")
    family = ARCHES[arch][1]
    kernels = sorted(GENERATED.glob(f"{family}_*.cu")) + sorted(GENERATED.glob("grouped_*.cu"))
    return [HERE / "glue.cu", *kernels]


def flags(arch: str = "90") -> list[str]:
    """nvcc flags of every unit (include dirs excluded: they do not change the output)."""
    return [*BASE_FLAGS, ARCHES[arch][0], f"-DBASS_CUTLASS_ARCH={arch}"]


def source_hash(arch: str = "90") -> str:
    """Hash of the sources, headers and flags of a build (not of the compiler)."""
    h = hashlib.sha256()
    for path in [*units(arch), *(HERE / p for p in HEADERS)]:
        h.update(path.relative_to(HERE).as_posix().encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    h.update(" ".join([*flags(arch), *LINK_FLAGS, EXPORTS_MAP]).encode())
    h.update(_cutlass_version().encode())
    return h.hexdigest()


def find_nvcc() -> str:
    """Path of nvcc, or raise FileNotFoundError saying where it was looked for."""
    candidates = [
        os.environ.get("BASS_NVCC"),
        os.environ.get("CUDA_HOME") and os.path.join(os.environ["CUDA_HOME"], "bin", "nvcc"),
        "/usr/local/cuda/bin/nvcc",
        shutil.which("nvcc"),
    ]
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    raise FileNotFoundError(
        "nvcc not found ($BASS_NVCC, $CUDA_HOME/bin/nvcc, /usr/local/cuda/bin/nvcc, PATH)"
    )


@functools.cache
def nvcc_version(nvcc: str) -> str:
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True)
    return out.stdout.strip().splitlines()[-1]


def _cutlass_version() -> str:
    try:
        from importlib.metadata import version

        return "nvidia-cutlass " + version("nvidia-cutlass")
    except Exception:
        return "CUTLASS_PATH " + os.environ.get("CUTLASS_PATH", "?")


def include_dirs() -> list[str]:
    """CUTLASS include folders: ``$CUTLASS_PATH`` or the nvidia-cutlass package's copy."""
    root = os.environ.get("CUTLASS_PATH")
    if not root:
        try:
            import cutlass_library
        except ImportError as e:
            raise FileNotFoundError(
                "CUTLASS headers not found: pip install --no-deps nvidia-cutlass "
                "(or set CUTLASS_PATH to a CUTLASS checkout)"
            ) from e
        root = cutlass_library.source_path
    dirs = [os.path.join(root, "include"), os.path.join(root, "tools", "util", "include")]
    for d in dirs:
        if not os.path.isdir(d):
            raise FileNotFoundError(f"CUTLASS include folder {d} is missing")
    return [*dirs, str(HERE)]


def build_key(arch: str, nvcc: str) -> str:
    h = hashlib.sha256((source_hash(arch) + "\0" + nvcc_version(nvcc)).encode())
    return h.hexdigest()[:20]


def _compile(nvcc: str, arch: str, src: Path, obj: Path, log) -> float:
    cmd = [nvcc, "-c", *flags(arch), *(f"-I{d}" for d in include_dirs()), str(src), "-o", str(obj)]
    log(f"  nvcc {src.relative_to(HERE)} ...")
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    elapsed = time.monotonic() - start
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr)[-6000:]
        raise RuntimeError(f"nvcc failed on {src.name} ({elapsed:.0f} s):\n{tail}")
    log(f"    ok in {elapsed:.0f} s")
    return elapsed


def _compile_all(nvcc: str, arch: str, tasks: list[tuple[Path, Path]], jobs: int, log):
    """Compile (source, object) pairs, ``jobs`` nvcc processes at a time."""
    if jobs <= 1:
        return {src.stem: _compile(nvcc, arch, src, obj, log) for src, obj in tasks}
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {src.stem: pool.submit(_compile, nvcc, arch, src, obj, log) for src, obj in tasks}
        return {stem: f.result() for stem, f in futures.items()}


def _object_path(nvcc: str, arch: str, src: Path) -> Path:
    h = hashlib.sha256()
    for p in [src, *(HERE / q for q in HEADERS)]:
        h.update(p.read_bytes() + b"\0")
    h.update((" ".join(flags(arch)) + nvcc_version(nvcc) + _cutlass_version()).encode())
    return cache_root() / "obj" / f"{src.stem}-{h.hexdigest()[:16]}.o"


def check(
    arch: str = "90", only: list[str] | None = None, jobs: int = 1, log=print
) -> dict[str, float]:
    """Compile units into a temporary folder (no cache, no link); return seconds per unit."""
    nvcc = find_nvcc()
    selected = [u for u in units(arch) if not only or u.stem in only]
    if only and len(selected) != len(set(only)):
        known = ", ".join(u.stem for u in units(arch))
        raise ValueError(f"unknown unit in {only}; units for sm_{arch}: {known}")
    log(f"checking {len(selected)} unit(s) for sm_{arch} with {nvcc_version(nvcc)}")
    with tempfile.TemporaryDirectory(prefix="bass-cutlass-check-") as tmp:
        tasks = [(src, Path(tmp) / f"{src.stem}.o") for src in selected]
        return _compile_all(nvcc, arch, tasks, jobs, log)


def build(arch: str = "90", force: bool = False, jobs: int = 1, log=print) -> Path:
    """Build ``libbass_cutlass.so`` for ``arch`` unless the cache already has it."""
    nvcc = find_nvcc()
    out_dir = cache_root() / build_key(arch, nvcc)
    lib = out_dir / LIB_NAME
    if lib.exists() and not force:
        log(f"up to date: {lib}")
        return lib
    log(f"building {lib} for sm_{arch} with {nvcc_version(nvcc)}")
    objs, pending, started = [], [], time.monotonic()
    for src in units(arch):
        obj = _object_path(nvcc, arch, src)
        if force or not obj.exists():
            obj.parent.mkdir(parents=True, exist_ok=True)
            pending.append((src, obj.with_name(f".{obj.stem}.tmp{os.getpid()}.o"), obj))
        else:
            log(f"  cached {obj.name}")
        objs.append(obj)
    _compile_all(nvcc, arch, [(src, tmp) for src, tmp, _ in pending], jobs, log)
    for _, tmp, obj in pending:
        tmp.replace(obj)
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp_lib = out_dir / f".{LIB_NAME}.tmp{os.getpid()}"
    exports = out_dir / "exports.map"
    exports.write_text(EXPORTS_MAP)
    link = [nvcc, *LINK_FLAGS, ARCHES[arch][0], f"-Xlinker=--version-script={exports}"]
    proc = subprocess.run(
        [*link, *map(str, objs), "-o", str(tmp_lib)], capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise RuntimeError(f"link failed:\n{(proc.stdout + proc.stderr)[-6000:]}")
    info = {
        "abi": ABI_VERSION,
        "arch": arch,
        "source_hash": source_hash(arch),
        "nvcc": nvcc_version(nvcc),
        "cutlass": _cutlass_version(),
        "flags": flags(arch),
        "units": [u.relative_to(HERE).as_posix() for u in units(arch)],
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    (out_dir / "build.json").write_text(json.dumps(info, indent=2) + "\n")
    tmp_lib.replace(lib)
    log(f"built {lib} in {time.monotonic() - started:.0f} s")
    return lib


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build libbass_cutlass.so (see module doc).")
    parser.add_argument("--arch", choices=sorted(ARCHES), default="90")
    parser.add_argument("--check", action="store_true", help="compile only (CI): no link")
    parser.add_argument("--only", nargs="+", metavar="UNIT", help="with --check: these units")
    parser.add_argument("--force", action="store_true", help="rebuild even if cached")
    parser.add_argument(
        "--jobs", type=int, default=1, help="nvcc processes at a time (~3 GB each; default 1)"
    )
    parser.add_argument("--list", action="store_true", help="list the units and exit")
    args = parser.parse_args(argv)
    if args.list:
        for u in units(args.arch):
            print(u.stem)
        return 0
    try:
        if args.check:
            times = check(args.arch, args.only, jobs=args.jobs)
            print(f"check ok: {len(times)} unit(s), {sum(times.values()):.0f} s")
        else:
            print(build(args.arch, force=args.force, jobs=args.jobs))
    except (FileNotFoundError, RuntimeError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
