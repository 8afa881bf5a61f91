#!/usr/bin/env bash
# The GPU check, for a machine with an NVIDIA GPU and the CUDA toolkit:
#   1. configures a CUDA build in build-gpu/ (DTRAIN_WITH_CUDA=ON, sm_90 and
#      sm_100) and builds the targets below;
#   2. runs the kernel parity tests (tests/unit/test_cuda_kernels.cpp: every
#      nn/cuda kernel against its CPU counterpart within stated tolerances)
#      and the NCCL collectives at world size 1 (test_comm_nccl);
#   3. runs `dtrain-bench train` on lm-small and cls-seed for reference. The
#      trainer has no `device: cuda` path yet (nn/cuda/ holds kernels only, see
#      docs/ARCHITECTURE.md), so these training figures are CPU figures, the
#      baseline a GPU trainer will be compared with.
# Prints a summary; exits non-zero when a step fails. Tests that skip (no GPU
# visible) are reported as skipped, not passed. Budget: 5 minutes in all
# (BUDGET_S), each step gets what is left.
# Environment: BUILD_DIR (default build-gpu), STEPS (timed training steps, 10),
# JOBS (build parallelism, nproc), BUDGET_S (300).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

build=${BUILD_DIR:-build-gpu}
steps=${STEPS:-10}
jobs=${JOBS:-$(nproc)}
budget=${BUDGET_S:-300}
start=$SECONDS
log_dir=$build/gpu-check
declare -a summary=()
failed=0

left() { echo $((budget - (SECONDS - start))); }

# run_step NAME COMMAND...: runs within the remaining budget, logs to $log_dir/NAME.log.
run_step() {
  local name=$1
  shift
  local t0=$SECONDS remaining
  remaining=$(left)
  if ((remaining <= 0)); then
    summary+=("$(printf '%-22s %-8s %s' "$name" "TIMEOUT" "no time left in the ${budget} s budget")")
    failed=1
    return 1
  fi
  timeout "$remaining" "$@" >"$log_dir/$name.log" 2>&1
  local rc=$?
  local status=PASS detail="" passed skipped
  passed=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$log_dir/$name.log")
  skipped=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' "$log_dir/$name.log")
  if ((rc == 124)); then
    status=TIMEOUT failed=1
  elif ((rc != 0)); then
    status=FAIL failed=1
    detail=$(grep -m1 -E 'FAILED|error' "$log_dir/$name.log")
  elif [[ -n $passed ]]; then
    detail="$passed passed, ${skipped:-0} skipped"
    if ((passed == 0 && ${skipped:-0} > 0)); then
      status=SKIPPED
      detail="$detail: $(grep -m1 -A1 'Skipped$' "$log_dir/$name.log" | tail -n1)"
    fi
  else
    detail=$(grep -E '^(tokens_per_s|mfu):' "$log_dir/$name.log" | tr '\n' ' ')
  fi
  summary+=("$(printf '%-22s %-8s %4d s  %s' "$name" "$status" $((SECONDS - t0)) "$detail")")
  [[ $status != FAIL && $status != TIMEOUT ]]
}

mkdir -p "$log_dir"
echo "gpu-check: build $build, budget ${budget} s, logs in $log_dir/"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
else
  echo "nvidia-smi not found: the GPU tests will skip"
fi

if run_step configure cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDTRAIN_WITH_CUDA=ON &&
  run_step build cmake --build "$build" -j "$jobs" --target test_cuda_kernels test_comm_nccl dtrain-bench; then
  run_step cuda-kernels "$build/tests/test_cuda_kernels"
  run_step nccl-world-of-one "$build/tests/test_comm_nccl"
  for config in lm-small cls-seed; do
    run_step "cpu-train-$config" env OMP_NUM_THREADS="$(nproc)" "$build/bin/dtrain-bench" train \
      --config "examples/configs/$config.json" --steps "$steps" --warmup 2 --peak-seconds 0.5
  done
fi

echo
echo "gpu-check summary ($((SECONDS - start)) s of ${budget} s; training rows are CPU: no device: cuda trainer yet)"
printf '%s\n' "${summary[@]}"
if ((failed)); then
  echo "gpu-check: FAILED (see $log_dir/)"
  exit 1
fi
echo "gpu-check: ok"
