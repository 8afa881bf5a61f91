#!/usr/bin/env bash
# dtrain-generate with the key/value cache against recomputing the whole
# prefix for every new token, on lm-small (examples/configs/lm-small.json,
# max_seq_len raised so NEW tokens fit after the prompt), one thread, in the
# same run. Trains one step to have a checkpoint; the weights do not matter
# for speed. Prints both figures and cache/recompute.
#
#   bench/generate-speed.sh                 # 256 new tokens
#   NEW=512 BUILD_DIR=build bench/generate-speed.sh
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$repo/bench/lib.sh"
build=${BUILD_DIR:-$repo/build}
new=${NEW:-256}
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The prompt and NEW tokens must fit, and so must the training data's
# sequences (lm-small's data.seq_len, 128).
max_seq_len=$((new + 8 > 128 ? new + 8 : 128))
"$build/bin/dtrain-worker" --config "$repo/examples/configs/lm-small.json" --set train.steps=1 \
  --set train.eval_every=0 --set schedule.warmup_steps=0 --set checkpoint.every_steps=1 \
  --set "model.max_seq_len=$max_seq_len" --set "train.out_dir=$work/run" >/dev/null

# tokens/s of one generation.
speed() {
  local stats
  stats=$("$build/bin/dtrain-generate" --checkpoint "$work/run/checkpoints" --prompt "1 2 3 4" \
            --max-new-tokens "$new" --temperature 0 --stats "$@" 2>&1 >/dev/null) ||
    bench_failed "dtrain-generate $*" "$stats"
  awk '$1 == "tokens_per_s:" { print $2 }' <<<"$stats"
}

cached=$(speed)
recompute=$(speed --recompute)
echo "new tokens: $new (lm-small, one thread)"
echo "tokens_per_s_cached: $cached"
echo "tokens_per_s_recompute: $recompute"
echo "cache_speedup: $(awk -v a="$cached" -v b="$recompute" 'BEGIN { printf "%.2f", a / b }')"
echo "command: NEW=$new $0"
