#!/usr/bin/env bash
# Activation recompute against keeping activations: for each model.recompute
# mode (none, selective, full), the dry run's activation memory and the
# measured step time of `dtrain-bench train`, interleaved in rounds (none,
# selective, full; again REPEATS times) so the machine's drift reaches every
# mode alike. Prints per mode the activations (MiB, and none's over the
# mode's), the median tokens/s and the step time over none's.
#
#   bench/recompute.sh                                    # GPT-2 124M at 8 x 256, 3 steps, 3 rounds
#   CONFIG=llama-fortunes MICRO_BATCH=16 SEQ=128 bench/recompute.sh
#   STEPS=2 REPEATS=1 MICRO_BATCH=8 SEQ=1024 bench/recompute.sh   # the issue's shape (minutes a step here)
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$repo/bench/lib.sh"   # median, bench_failed
build=${BUILD_DIR:-$repo/build}
config=${CONFIG:-gpt2-124m}   # a name in examples/configs, or a config file's path
config_file=$config
[[ -f $config_file ]] || config_file="$repo/examples/configs/$config.json"
micro=${MICRO_BATCH:-8}
seq=${SEQ:-256}
steps=${STEPS:-3}
repeats=${REPEATS:-3}
modes=(none selective full)
[[ -x $build/bin/dtrain-bench ]] || { echo "recompute: $build/bin/dtrain-bench is not built (scripts/build.sh)" >&2; exit 2; }
out_dir=$(mktemp -d)
trap 'rm -rf "$out_dir"' EXIT
sets=(--set "train.micro_batch_size=$micro" --set "data.seq_len=$seq" --set "train.out_dir=$out_dir/run")

declare -A activations tokens
for mode in "${modes[@]}"; do
  out=$("$build/bin/dtrain-worker" --config "$config_file" "${sets[@]}" \
        --set "model.recompute=$mode" --dry-run 2>&1) || bench_failed "the dry run ($mode)" "$out"
  activations[$mode]=$(awk '$1 == "activations" { print $2; exit }' <<<"$out")
done
for ((round = 1; round <= repeats; round++)); do
  for mode in "${modes[@]}"; do
    out=$("$build/bin/dtrain-bench" train --config "$config_file" --steps "$steps" \
          --warmup 1 --peak-seconds 0.2 "${sets[@]}" --set "model.recompute=$mode" 2>&1) ||
      bench_failed "dtrain-bench ($mode)" "$out"
    value=$(awk '$1 == "tokens_per_s:" { print $2; exit }' <<<"$out")
    tokens[$mode]+="$value "
    echo "round $round/$repeats $mode: $value tokens/s"
  done
done

cpu=$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)
echo
echo "config $config, micro-batch $micro x $seq tokens, ${OMP_NUM_THREADS:-default} threads, CPU: $cpu"
printf '%-10s %16s %14s %12s %16s\n' mode activations_MiB none/mode tokens/s step_time/none
base_tokens=$(tr ' ' '\n' <<<"${tokens[none]}" | grep . | median)
for mode in "${modes[@]}"; do
  t=$(tr ' ' '\n' <<<"${tokens[$mode]}" | grep . | median)
  printf '%-10s %16s %14s %12s %16s\n' "$mode" "${activations[$mode]}" \
    "$(awk -v a="${activations[none]}" -v b="${activations[$mode]}" 'BEGIN { printf "%.2fx", a / b }')" "$t" \
    "$(awk -v a="$base_tokens" -v b="$t" 'BEGIN { printf "%.3fx", a / b }')"
done
echo "command: CONFIG=$config MICRO_BATCH=$micro SEQ=$seq STEPS=$steps REPEATS=$repeats bench/recompute.sh"
