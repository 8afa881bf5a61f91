#!/usr/bin/env bash
# Two dtrain builds on the same models, one CPU thread, interleaved in one
# run (old, new, old, new, ...) so both see the same machine: the check that
# a change costs no speed. Prints each run's tokens/s, then per config and
# precision the median of each side and new/old.
#
#   bench/compare-builds.sh OLD_DTRAIN_BENCH NEW_DTRAIN_BENCH
#   REPEATS=5 STEPS=10 CONFIGS="lm-small" PRECISIONS="fp32 bf16" bench/compare-builds.sh old/dtrain-bench build/bin/dtrain-bench
# SETTINGS adds config settings to every run (on a GPU: SETTINGS="device=cuda";
# longer sequences: SETTINGS="model.max_seq_len=1024 data.seq_len=1024").
# OLD_ENV and NEW_ENV add environment variables to one side's runs, so one
# build can be compared with itself (oneDNN's sgemm against dtrain's AVX2 GEMM:
# OLD_ENV="DTRAIN_CPU_GEMM=onednn" bench/compare-builds.sh build/bin/dtrain-bench build/bin/dtrain-bench).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$repo/bench/lib.sh"   # median
[[ $# -eq 2 ]] || { echo "usage: $0 OLD_DTRAIN_BENCH NEW_DTRAIN_BENCH" >&2; exit 2; }
old=$1 new=$2
repeats=${REPEATS:-3}
steps=${STEPS:-8}
read -r -a configs <<<"${CONFIGS:-lm-small cls-seed}"
read -r -a precisions <<<"${PRECISIONS:-fp32 bf16}"
read -r -a settings <<<"${SETTINGS:-}"
read -r -a old_env <<<"${OLD_ENV:-}"
read -r -a new_env <<<"${NEW_ENV:-}"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE

# tokens_per_s of one run.
run() {
  local -n extra=$4
  env "${extra[@]}" "$1" train --config "$repo/examples/configs/$2.json" --steps "$steps" --set "precision=$3" "${settings[@]}" |
    awk '$1 == "tokens_per_s:" { print $2 }'
}

summary=()
for config in "${configs[@]}"; do
  for precision in "${precisions[@]}"; do
    olds=() news=()
    for ((i = 0; i < repeats; i++)); do
      olds+=("$(run "$old" "$config" "$precision" old_env)")
      news+=("$(run "$new" "$config" "$precision" new_env)")
      echo "$config $precision run $((i + 1)): old ${olds[-1]} tokens/s, new ${news[-1]} tokens/s"
    done
    o=$(printf '%s\n' "${olds[@]}" | median)
    n=$(printf '%s\n' "${news[@]}" | median)
    summary+=("$(printf '%-10s %-5s old %9.1f  new %9.1f  new/old %.3f' "$config" "$precision" "$o" "$n" \
      "$(awk -v a="$n" -v b="$o" 'BEGIN { print a / b }')")")
  done
done
echo "=== medians of $repeats interleaved runs, $steps timed steps each, one thread"
printf '%s\n' "${summary[@]}"
echo "command: REPEATS=$repeats STEPS=$steps CONFIGS=\"${configs[*]}\" PRECISIONS=\"${precisions[*]}\" OLD_ENV=\"${old_env[*]}\" NEW_ENV=\"${new_env[*]}\" $0 $old $new"
