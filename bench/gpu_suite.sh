#!/usr/bin/env bash
# Everything the GPU machine should run, in stages that each fit one 10-minute call:
#   bash bench/gpu_suite.sh all|env|build|test|sanitize|kernels|e2e [OUT_DIR]
# Full outputs go to OUT_DIR (default: $OUT if set, else bench/results/gpu_<UTC date>);
# a short summary is printed last. The GPU machine has torch, triton, transformers,
# pytest, hypothesis and nvcc preinstalled and no network: bass runs from src/. The
# CUTLASS headers come from the nvidia-cutlass wheel, carried in .gpu_wheels/ (prepare it
# here with: pip download --no-deps -d .gpu_wheels nvidia-cutlass==4.2.0.0).
set -uo pipefail
cd "$(dirname "$0")/.."
stage="${1:-all}"
out="${2:-${OUT:-bench/results/gpu_$(date -u +%Y%m%dT%H%M)}}"
mkdir -p "$out"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
status=0
run() {  # run NAME CMD...: log to $out/NAME.log, remember failures
  local name=$1; shift
  local t0=$(date +%s)
  "$@" >"$out/$name.log" 2>&1
  local rc=$?
  echo "$name: rc=$rc in $(( $(date +%s) - t0 )) s" | tee -a "$out/summary.txt"
  [ $rc -eq 0 ] || status=1
}

if [[ $stage == all || $stage == env ]]; then
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
  cp "$out/env.log" "$out/env.json"
fi
if [[ $stage == all || $stage == build ]]; then
  if ls .gpu_wheels/*.whl >/dev/null 2>&1; then
    python -m pip install --quiet --no-deps .gpu_wheels/*.whl
  fi
  run build python cutlass_kernels/build.py --jobs 8
fi
if [[ $stage == all || $stage == test ]]; then
  run test python -m pytest -m gpu -q -p no:cacheprovider --junitxml="$out/gpu_tests.xml"
fi
if [[ $stage == all || $stage == sanitize ]]; then
  run sanitize compute-sanitizer --tool memcheck --error-exitcode 1 python bench/gpu_sanitize.py
fi
if [[ $stage == all || $stage == kernels ]]; then
  run kernels python bench/bench_kernels.py --mode gpu --out "$out"
fi
if [[ $stage == all || $stage == e2e ]]; then
  run e2e python bench/bench_e2e.py --gpu --out "$out"
fi
echo "---- summary ($out)"
cat "$out/summary.txt"
tail -n 5 "$out/test.log" 2>/dev/null
exit $status
