#!/usr/bin/env bash
# dtrain on one GPU against PyTorch on the same GPU, in one run: for each
# config and precision, REPEATS interleaved rounds of `dtrain-bench train
# --set device=cuda` and bench/pytorch_gpu.py (eager, and torch.compile where
# MODES says), then the medians and dtrain / the fastest PyTorch.
#
#   bench/compare-pytorch-gpu.sh [DTRAIN_BENCH]
#   REPEATS=3 STEPS=30 CONFIGS="lm-small cls-seed" PRECISIONS="fp32 bf16" MODES="eager compile" \
#     PYTHON=python3 bench/compare-pytorch-gpu.sh build/bin/dtrain-bench
# PYTHON: an interpreter whose torch has CUDA (default python3).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$repo/bench/lib.sh"   # median, bench_failed
bench=${1:-$repo/build/bin/dtrain-bench}
python=${PYTHON:-python3}
repeats=${REPEATS:-3}
steps=${STEPS:-30}
read -r -a configs <<<"${CONFIGS:-lm-small cls-seed}"
read -r -a precisions <<<"${PRECISIONS:-fp32 bf16}"
read -r -a modes <<<"${MODES:-eager}"

# tokens_per_s of a run's output, or the run's failure.
figure() {
  local out
  out=$("$@" 2>&1) || bench_failed "$*" "$out"
  awk '$1 == "tokens_per_s:" { print $2 }' <<<"$out"
}

summary=()
for config in "${configs[@]}"; do
  for precision in "${precisions[@]}"; do
    declare -A runs=()
    for ((i = 0; i < repeats; i++)); do
      line="$config $precision round $((i + 1)):"
      runs[dtrain]+="$(figure "$bench" train --config "$repo/examples/configs/$config.json" --steps "$steps" \
        --set device=cuda "precision=$precision") "
      line+=" dtrain $(awk '{ print $NF }' <<<"${runs[dtrain]}")"
      for mode in "${modes[@]}"; do
        runs[$mode]+="$(figure "$python" "$repo/bench/pytorch_gpu.py" --config "$config" --precision "$precision" \
          --mode "$mode" --steps "$steps") "
        line+=", pytorch $mode $(awk '{ print $NF }' <<<"${runs[$mode]}")"
      done
      echo "$line tokens/s"
    done
    d=$(printf '%s\n' ${runs[dtrain]} | median)
    row=$(printf '%-10s %-5s dtrain %10.1f' "$config" "$precision" "$d")
    best=0
    for mode in "${modes[@]}"; do
      p=$(printf '%s\n' ${runs[$mode]} | median)
      row+=$(printf '  pytorch-%s %10.1f' "$mode" "$p")
      best=$(awk -v a="$p" -v b="$best" 'BEGIN { print (a > b ? a : b) }')
    done
    summary+=("$row$(printf '  dtrain/best %.2f' "$(awk -v a="$d" -v b="$best" 'BEGIN { print a / b }')")")
    unset runs
  done
done
echo "=== medians of $repeats interleaved rounds, $steps timed steps each, tokens/s"
printf '%s\n' "${summary[@]}"
echo "command: REPEATS=$repeats STEPS=$steps CONFIGS=\"${configs[*]}\" PRECISIONS=\"${precisions[*]}\" MODES=\"${modes[*]}\" bench/compare-pytorch-gpu.sh"
