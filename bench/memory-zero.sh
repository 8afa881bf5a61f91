#!/usr/bin/env bash
# Per-rank model-state memory of dtrain's data-parallel engine for ZeRO stages
# 0-3 at world sizes 1, 2 and 4 (lm-small by default; 4 ranks oversubscribe
# this machine's cores: only bytes are measured, a few steps each), next to
# the ZeRO paper's formulas for fp32 AdamW with P parameters on N ranks:
#   stage 0  16P           params 4P + grads 4P + moments 8P, all replicated
#   stage 1  8P + 8P/N     moments sharded
#   stage 2  4P + 12P/N    gradients sharded too
#   stage 3  16P/N         parameters sharded too
# measured = what `dtrain-bench train` reports from Engine::memory() on rank
# 0 (params + grads + AdamW moments kept across steps; shards are padded to a
# multiple of N, so ratios sit a hair above 1). Working buffers (gathered
# blocks, transient gradient slots) are listed apart: the formulas leave them out.
#
#   bench/memory-zero.sh
#   WORLDS="2 4" STAGES="3" BACKEND=gloo bench/memory-zero.sh examples/configs/cls-seed.json
#
# The first line printed is the command that reproduces the output; then a
# table and `stageS_worldN_ratio: 1.000`-style lines.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$repo/bench/lib.sh"
build=${BUILD_DIR:-$repo/build}
config=${1:-$repo/examples/configs/lm-small.json}
worlds=${WORLDS:-1 2 4}
stages=${STAGES:-0 1 2 3}
backend=${BACKEND:-mpi}
echo "# command: WORLDS=\"$worlds\" STAGES=\"$stages\" BACKEND=$backend BUILD_DIR=$build" \
  "bench/memory-zero.sh $config"

bench=$build/bin/dtrain-bench
[[ -x $bench ]] || { echo "memory-zero: $bench is not built" >&2; exit 1; }
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
args=(train --config "$config" --steps 1 --warmup 1 --peak-seconds 0.1)

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])'
}
field() { awk -v k="$1:" '$1 == k { print $2; exit }' <<<"$2"; }

# measure WORLD STAGE: dtrain-bench's output for one job.
measure() {
  local world=$1 stage=$2
  local set=(--set "parallel.zero_stage=$stage" --set "parallel.backend=$backend")
  if [[ $world == 1 ]]; then
    "$bench" "${args[@]}" "${set[@]}"
    return
  fi
  local store=()
  [[ $backend == gloo ]] && store=(-x "DTRAIN_STORE=127.0.0.1:$(free_port)")
  mpirun -np "$world" --oversubscribe --bind-to none -x OMP_NUM_THREADS -x OMP_WAIT_POLICY \
    "${store[@]}" "$bench" "${args[@]}" "${set[@]}"
}

# formula STAGE WORLD P: the ZeRO paper's fp32 bytes per rank.
formula() {
  awk -v s="$1" -v n="$2" -v p="$3" 'BEGIN {
    if (s == 0) b = 16 * p; else if (s == 1) b = 8 * p + 8 * p / n
    else if (s == 2) b = 4 * p + 12 * p / n; else b = 16 * p / n
    printf "%.0f", b }'
}
mib() { awk -v b="$1" 'BEGIN { printf "%.3f", b / 1048576 }'; }

rows=() lines=()
for world in $worlds; do
  for stage in $stages; do
    echo "# world $world, stage $stage" >&2
    out=$(measure "$world" "$stage" 2>&1) || bench_failed "world $world, stage $stage" "$out"
    p=$(field param_count "$out")
    got=$(field model_state_bytes "$out")
    want=$(formula "$stage" "$world" "$p")
    r=$(awk -v a="$got" -v b="$want" 'BEGIN { printf "%.4f", a / b }')
    rows+=("$(printf '%5s %5s %10s %9s %9s %9s %12s %12s %8s %10s' "$world" "$stage" "$p" \
      "$(field param_mb "$out")" "$(field grad_mb "$out")" "$(field optimizer_mb "$out")" \
      "$(mib "$got")" "$(mib "$want")" "$r" "$(field working_mb "$out")")")
    lines+=("stage${stage}_world${world}_model_state_mb: $(mib "$got")"
            "stage${stage}_world${world}_ratio: $r"
            "stage${stage}_world${world}_working_mb: $(field working_mb "$out")")
  done
done

printf '%5s %5s %10s %9s %9s %9s %12s %12s %8s %10s\n' world stage P param_MB grad_MB optim_MB \
  measured_MB formula_MB ratio working_MB
printf '%s\n' "${rows[@]}"
echo
printf '%s\n' "${lines[@]}"
