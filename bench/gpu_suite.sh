#!/usr/bin/env bash
# The whole GPU verdict in ONE call of at most 8 minutes (docs/gpu.md), from a fresh
# checkout on the GPU machine (torch, Triton, transformers, pytest, hypothesis preinstalled;
# no network; bass runs from src/):
#
#   bash bench/gpu_suite.sh          # results under $OUT (else bench/results/gpu_<UTC time>)
#   bash bench/gpu_suite.sh followup # sent at once after the first, while the machine is warm
#   bash bench/gpu_suite.sh second   # a second call, if the lease has time left (below)
#   (rerun, graphs: the follow-up calls of the first lease, bench/results/gpu/2026-11-26-h100)
#
# Stages, ordered by value, each under its own time cap (`timeout`): a stage that hangs or
# runs long costs only itself, and the next ones still run. The caps, the kill grace and
# the reserve for bundling add up to at most CALL_LIMIT (tests/gpu/test_gpu_suite.py checks).
#   env     device, capability, versions, what impl="auto" runs on CUDA per pass kind
#   smoke   the CUDA default against the reference: one verify pass eager, compiled and
#           under CUDA graphs; the engine's greedy rows through it
#   tests   the CUDA tests (-m gpu), at most 6 hypothesis examples each (HYPOTHESIS_PROFILE=gpu),
#           40 s each where pytest-timeout is installed; quick files first, flex's last
#   grid    every implementation that runs on CUDA on verify-pass shapes: time per layer and
#           its share of the measured copy bandwidth (written after every case)
#   e2e     a random 7B Llama-shaped bf16 main model and a ~0.3B draft, FORCED ACCEPTANCE
#           p=0.7 (a systems measurement, not quality): regular decoding vs BASS at batch 8
#           beside transformers' generate, eager, then with CUDA graphs; the paper's batch-8
#           headline and the weight-bandwidth floor printed beside
# After every stage the results are bundled again, so a call cut off keeps what ran. What
# comes back (at most 8 files): summary.md (the table, printed last), gpu_suite.tar.gz
# (every log, JSON and JUnit file), env.json, smoke.json, gpu_kernels.json, gpu_e2e.json.
# CUTLASS (pad, split): never built in a call (9 units at 30-80 s each); they run when the
# library built on the CPU machine travels with the checkout (.gpu_cache/libbass_cutlass.so,
# or $BASS_CUTLASS_LIB; carry: [".gpu_cache"]): see docs/gpu.md.
# The second call, under the same limit: pad and split's tests, fused's compiled path and
# opcheck, flex's property tests, the grid of the one-launch implementations,
# compute-sanitizer over every CUDA implementation, and e2e rows the first call leaves out
# (batches 1 and 32 eager and with CUDA graphs, the adaptive policy).
# GPU_SUITE_DRY_RUN=1 runs nothing: each stage's cap and command go to <work>/<stage>.cmd
# (tests/gpu/test_gpu_suite.py checks that way, on a CPU, every script, flag and test file).
set -uo pipefail
cd "$(dirname "$0")/.."
CALL_LIMIT=480  # seconds: the whole call
KILL_GRACE=5    # seconds a stage gets after its cap before SIGKILL
RESERVE=5       # seconds for bundling and the table
dry=${GPU_SUITE_DRY_RUN:-}
plan=${1:-first}
if [[ ! $plan =~ ^(first|second|followup|rerun|graphs)$ ]]; then
  echo "gpu_suite.sh: unknown call '$plan'; calls: first (default), second, followup, rerun, graphs" >&2
  exit 2
fi
# followup: sent within the 30 s the machine stays warm after the first call, in what is
# left of the lease then (the second lease had 419 s left: a call of 4 minutes fits)
[[ $plan == followup ]] && CALL_LIMIT=240
out="${OUT:-bench/results/gpu_$(date -u +%Y%m%dT%H%M)}"
work="${GPU_SUITE_WORK:-$(mktemp -d)}"
mkdir -p "$out" "$work"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
cuda_bin="${CUDA_HOME:-/usr/local/cuda}/bin"
[[ -d $cuda_bin ]] && export PATH="$PATH:$cuda_bin"
# the GPU machine's torch lives in its `python3`; a bare `python` may be missing or another one
if [[ -z $dry ]] && ! python -c 'import torch' 2>/dev/null; then
  mkdir -p "$work/bin" && ln -sf "$(command -v python3)" "$work/bin/python"
  export PATH="$work/bin:$PATH"
fi
if [[ -z ${BASS_CUTLASS_LIB:-} && -f .gpu_cache/libbass_cutlass.so ]]; then
  export BASS_CUTLASS_LIB="$PWD/.gpu_cache/libbass_cutlass.so"
fi
: >"$work/stages.tsv"
export BASS_TEST_FAILURES="$work/test_failures.txt"  # each failure's reason, as it happens
# one test's time cap where pytest-timeout is there (the GPU machine's image has it): a
# test that runs long fails alone, and the stage goes on
per_test=()
if [[ -n $dry ]] || python -c 'import pytest_timeout' 2>/dev/null; then per_test=(--timeout=40); fi

bundle() {  # the table and the bundle, from whatever has run so far
  python bench/gpu_summary.py "$work" >"$out/summary.md" 2>"$work/summary.err"
  for f in env.json smoke.json gpu_kernels.json gpu_e2e.json flex_probe.json; do
    [[ -f $work/$f ]] && cp "$work/$f" "$out/"
  done
  tar -czf "$out/gpu_suite.tar.gz" -C "$work" . 2>/dev/null
}

stage() {  # stage NAME CAP CMD...: CMD under a time cap, logged to <work>/NAME.log
  local name=$1 cap=$2
  shift 2
  if [[ -n $dry ]]; then
    { echo "$cap"; printf '%q ' "$@"; echo; } >"$work/$name.cmd"
    printf '%s\t%s\t0\tdry run\n' "$name" "$cap" >>"$work/stages.tsv"
    return
  fi
  local t0=$SECONDS rc verdict
  timeout --kill-after="$KILL_GRACE" "$cap" "$@" >"$work/$name.log" 2>&1
  rc=$?
  case $rc in
    0) verdict=ok ;;
    124 | 137) verdict="timed out at ${cap} s" ;;
    *) verdict="failed (exit $rc)" ;;
  esac
  printf '%s\t%s\t%s\t%s\n' "$name" "$cap" "$((SECONDS - t0))" "$verdict" >>"$work/stages.tsv"
  echo "$name: $verdict in $((SECONDS - t0)) s" >&2
  bundle
}

# the stages of each call: name, cap in seconds, command
case $plan in
  first)
    stage env 15 python bench/gpu_smoke.py --env --out "$work"
    stage smoke 45 python bench/gpu_smoke.py --out "$work"
    # the engine's first (its CUDA-graph test, which failed in the third lease, leads); the
    # compiled steps (6 tests, 115 s there) late, as the follow-up runs them too; flex's
    # property tests (a compile per example: one ran past the whole stage in the second
    # lease) last
    stage tests 110 env HYPOTHESIS_PROFILE=gpu python -m pytest -m gpu -v -p no:cacheprovider \
      "${per_test[@]}" --junitxml="$work/gpu_tests.xml" --durations=15 \
      tests/gpu/test_engine_gpu.py tests/ops/test_ops_contract.py \
      tests/ops/test_triton_fused_gpu.py tests/ops/test_cutlass.py tests/ops/test_ops_packed.py \
      tests/ops/test_ops_reference.py tests/ops/test_ops_compile.py \
      tests/ops/test_ops_beyond_contract.py tests/ops/test_ops_flex.py
    # the whole grid took about 80 s at 0.05 s a case in the third lease: 45 s gets the first
    stage grid 45 python bench/bench_kernels.py --mode gpu --min-run-time 0.05 --out "$work"
    # batch 8 only (batches 1 and 32 ran in the first two leases): eager rows, then CUDA
    # graphs, BASS's row first (its warm-up compiles both models: never finished so far;
    # drafting off's took 157 s in the third lease), then drafting off's
    stage e2e 230 python bench/bench_e2e.py --gpu --batches 8 --max-new 32 \
      --forced-acceptance 0.7 --policies constant --graph-batches 8 --assisted-upto 0 \
      --no-plots --out "$work"
    ;;
  followup)  # right after the first call, while the machine is warm (docs/gpu.md)
    stage e2e 60 python bench/bench_e2e.py --gpu --batches 8 --max-new 32 \
      --forced-acceptance 0.7 --policies adaptive --graph-batches "" --assisted-upto 0 \
      --no-plots --out "$work"
    stage tests 165 env HYPOTHESIS_PROFILE=gpu python -m pytest -m gpu -v -p no:cacheprovider \
      "${per_test[@]}" --junitxml="$work/gpu_tests.xml" tests/ops/test_ops_flex.py \
      tests/ops/test_ops_contract.py tests/ops/test_triton_fused_gpu.py \
      tests/ops/test_ops_compile.py
    ;;
  rerun)  # after a first call whose flex lowering failed at head dim 128 (docs/gpu.md)
    stage probe 60 python bench/gpu_flex_probe.py --out "$work"
    stage smoke 60 python bench/gpu_smoke.py --out "$work"
    stage tests 110 env HYPOTHESIS_PROFILE=gpu python -m pytest -m gpu -v -p no:cacheprovider \
      --junitxml="$work/gpu_tests.xml" tests/ops/test_triton_fused_gpu.py \
      tests/gpu/test_engine_gpu.py tests/ops/test_ops_contract.py tests/ops/test_ops_compile.py
    stage e2e 90 python bench/bench_e2e.py --gpu --batches 8,1 --max-new 32 \
      --forced-acceptance 0.7 --policies constant --graph-batches "" --assisted-upto 0 \
      --attention fused --no-plots --out "$work"
    ;;
  graphs)  # the third call of the first lease: the fixes of the rerun, then CUDA graphs
    stage smoke 40 python bench/gpu_smoke.py --out "$work"
    stage e2e 150 python bench/bench_e2e.py --gpu --batches 8 --max-new 32 \
      --forced-acceptance 0.7 --policies constant --graph-batches 8 --assisted-upto 0 \
      --no-plots --out "$work"
    stage tests 50 env HYPOTHESIS_PROFILE=gpu python -m pytest -m gpu -v -p no:cacheprovider \
      --junitxml="$work/gpu_tests.xml" tests/ops/test_triton_fused_gpu.py
    ;;
  second)
    stage env 15 python bench/gpu_smoke.py --env --out "$work"
    stage tests 150 env HYPOTHESIS_PROFILE=gpu python -m pytest -m gpu -v -p no:cacheprovider \
      "${per_test[@]}" --junitxml="$work/gpu_tests.xml" tests/ops/test_cutlass.py \
      tests/ops/test_triton_fused_gpu.py tests/ops/test_ops_contract.py \
      tests/ops/test_ops_compile.py tests/ops/test_ops_flex.py
    stage grid 50 python bench/bench_kernels.py --mode gpu --impls flex,fused,pad,split \
      --min-run-time 0.1 --out "$work"
    stage sanitize 60 env PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck \
      --error-exitcode 1 python bench/gpu_sanitize.py
    stage e2e 160 python bench/bench_e2e.py --gpu --batches 1,32 --max-new 32 \
      --forced-acceptance 0.7 --policies adaptive --graph-batches 1,32 --assisted-upto 0 \
      --no-plots --out "$work"
    ;;
esac

if [[ -n $dry ]]; then
  printf 'CALL_LIMIT=%s KILL_GRACE=%s RESERVE=%s\n' "$CALL_LIMIT" "$KILL_GRACE" "$RESERVE" \
    >"$work/limits.txt"
  echo "dry run: commands in $work" >&2
  exit 0
fi
bundle
cat "$out/summary.md"
! cut -f4 "$work/stages.tsv" | grep -qv '^ok$'  # exit 1 when a stage did not pass
