#!/usr/bin/env bash
# The GPU check, for a machine with an NVIDIA GPU and the CUDA toolkit:
#   1. configures a CUDA build in build-gpu/ (DTRAIN_WITH_CUDA=ON, for the
#      GPU present: CMAKE_CUDA_ARCHITECTURES=native when nvidia-smi finds one)
#      and builds the CUDA plugin (build-gpu/lib/libdtrain_cuda.so) and the
#      targets below;
#   2. runs the kernel parity tests (tests/unit/test_cuda_kernels.cpp: every
#      member of the CUDA kernel set against the CPU's, f32/bf16/f16, within
#      stated tolerances; again under compute-sanitizer's memcheck where it
#      is installed; test_cuda_device.cpp: the device's memory, fences
#      and engine kernels), the NCCL collectives and fences at world size 1
#      (test_comm_nccl) and the `device: cuda` trainer against the CPU one
#      (tests/unit/test_cuda_training.cpp: 20 steps per precision and model,
#      ZeRO stages 0-3 with accumulation 1 and 3 at world size 1, stage 3 in
#      bf16 and fp16, an nccl world of one with 16-bit gradients,
#      checkpoints crossing between cuda and cpu both ways);
#   3. runs `dtrain-bench train --set device=cuda` on lm-small and cls-seed in
#      fp32, bf16 and fp16: tokens/s and MFU against the GPU's dense peak
#      (dtrain-bench's default is H100/H200's: 989e12 FLOP/s bf16/fp16, 67e12
#      fp32 without TF32; PEAK_FLOPS overrides it for another GPU).
# Prints a summary; exits non-zero when a step fails. Tests that skip (no GPU
# visible) are reported as skipped, not passed. Budget: 5 minutes in all
# (BUDGET_S), each step gets what is left.
# With BUNDLE=ARCHIVE (made by scripts/gpu-bundle.sh on a machine with the
# build dependencies), steps 1's configure and build are replaced by unpacking
# the archive into BUILD_DIR; the libraries it carries are put on
# LD_LIBRARY_PATH, with the folders that hold this machine's cuBLAS and NCCL
# (the CUDA toolkit's, or the nvidia-* Python wheels').
# Environment: BUILD_DIR (default build-gpu), STEPS (timed training steps, 10),
# JOBS (build parallelism, nproc), BUDGET_S (300), PEAK_FLOPS (the GPU's peak
# FLOP/s for MFU; default: dtrain-bench's H100/H200 figure per precision),
# CUDA_ARCHS (CMAKE_CUDA_ARCHITECTURES; default native with a GPU, else the
# project's 90;100).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

build=${BUILD_DIR:-build-gpu}
steps=${STEPS:-10}
jobs=${JOBS:-$(nproc)}
budget=${BUDGET_S:-300}
peak_flops=${PEAK_FLOPS:-}
archs=${CUDA_ARCHS:-}
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

# cuda_library_dirs: the folders holding cuBLAS and NCCL here, where the
# dynamic loader does not already know them.
cuda_library_dirs() {
  local lib dir
  for lib in libcublas.so.13 libcublasLt.so.13 libnccl.so.2 libcudart.so.13; do
    ldconfig -p 2>/dev/null | grep -q "$lib" && continue
    dir=$(find /usr/local/cuda*/ /usr/lib /opt /usr/local/lib -name "$lib" -print -quit 2>/dev/null)
    [[ -n $dir ]] && dirname "$dir"
  done | sort -u | paste -sd:
}

if [[ -n ${BUNDLE:-} ]]; then
  rm -rf "$build" && mkdir -p "$build" && tar -C "$build" -xJf "$BUNDLE" || {
    echo "gpu-check: cannot unpack BUNDLE=$BUNDLE into $build" >&2
    exit 1
  }
  extra=$(cuda_library_dirs)
  export LD_LIBRARY_PATH=$PWD/$build/deps${extra:+:$extra}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export DTRAIN_TEST_BIN_DIR=$PWD/$build/bin DTRAIN_TEST_SOURCE_DIR=$PWD  # not where they were built
  echo "gpu-check: unpacked $BUNDLE; LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  missing=$(for f in "$build"/bin/* "$build"/lib/* "$build"/tests/*; do ldd "$f"; done | grep 'not found' | sort -u)
  [[ -z $missing ]] || echo "gpu-check: libraries still missing:"$'\n'"$missing"
fi

mkdir -p "$log_dir"
echo "gpu-check: build $build, budget ${budget} s, logs in $log_dir/"
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi --query-gpu=name,memory.total,driver_version \
  --format=csv,noheader; then
  archs=${archs:-native}  # only the GPU present: half the nvcc time of the default pair
else
  echo "no GPU visible (nvidia-smi): the GPU tests will skip"
fi

if [[ -n ${BUNDLE:-} ]]; then
  built=true
elif run_step configure cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDTRAIN_WITH_CUDA=ON \
  ${archs:+-DCMAKE_CUDA_ARCHITECTURES="$archs"} &&
  run_step build cmake --build "$build" -j "$jobs" --target dtrain_cuda dtrain-worker dtrain-bench \
    test_cuda_kernels test_cuda_device test_comm_nccl test_cuda_training; then
  built=true
else
  built=false
fi
if $built; then
  run_step cuda-kernels "$build/tests/test_cuda_kernels"
  sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -n1)
  if [[ -n $sanitizer ]]; then  # out-of-bounds and misaligned accesses of every kernel the parity tests run
    run_step cuda-kernels-memcheck "$sanitizer" --tool memcheck --error-exitcode 1 "$build/tests/test_cuda_kernels"
  fi
  run_step cuda-device "$build/tests/test_cuda_device"
  run_step nccl-world-of-one "$build/tests/test_comm_nccl"
  run_step cuda-training "$build/tests/test_cuda_training"
  for config in lm-small cls-seed; do
    for precision in fp32 bf16 fp16; do
      run_step "cuda-train-$config-$precision" "$build/bin/dtrain-bench" train \
        --config "examples/configs/$config.json" --steps "$steps" --warmup 2 \
        ${peak_flops:+--peak-flops "$peak_flops"} --set device=cuda precision="$precision"
    done
  done
fi

echo
echo "gpu-check summary ($((SECONDS - start)) s of ${budget} s; training rows: device cuda, MFU against the GPU peak)"
printf '%s\n' "${summary[@]}"
if ((failed)); then
  echo "gpu-check: FAILED (see $log_dir/)"
  exit 1
fi
echo "gpu-check: ok"
