#!/usr/bin/env bash
# Time and memory of `dtrain-ckpt export --format onnx` of lm-small
# (examples/configs/lm-small.json, 3.3 M parameters) from a checkpoint of one
# training step.
#   export_s            wall time of the export, median of REPEATS (the whole command)
#   peak_rss_mb         the export's peak resident set (GNU time's %M)
#   baseline_rss_mb     the same command exporting a tiny lm: the binary, its
#                       libraries and ONNX's operator registry, without a model
#   export_rss_mb       peak_rss_mb - baseline_rss_mb: what the model's export adds
#   model_mb, block_mb  the model's f32 parameters and its largest block
#   bound_mb            model_mb + block_mb, the memory target the export stays under
#   heap_peak_mb        heaptrack's peak heap of the export, when heaptrack is installed
#
#   bench/onnx-export.sh [BUILD_DIR]        (default: build)
#   CONFIG=examples/configs/lm-small.json REPEATS=5 QUANTIZE=int8 bench/onnx-export.sh
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$repo/build}
config=${CONFIG:-$repo/examples/configs/lm-small.json}
repeats=${REPEATS:-5}
quantize=()
[[ -n ${QUANTIZE:-} ]] && quantize=(--quantize "$QUANTIZE")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

train() {  # train CONFIG OUT_DIR: one step, checkpointed
  "$build/bin/dtrain-worker" --config "$1" --set "train.out_dir=$2" --set train.steps=1 --set schedule.warmup_steps=0 \
    --set checkpoint.every_steps=1 --set train.eval_batches=1 > "$2.log" 2>&1 || { cat "$2.log" >&2; exit 1; }
}
cat > "$work/tiny.json" <<'JSON'
{"model": {"kind": "lm", "vocab_size": 64, "d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32, "max_seq_len": 8},
 "data": {"kind": "synthetic", "seq_len": 8}, "train": {"micro_batch_size": 2}}
JSON
train "$config" "$work/model"
train "$work/tiny.json" "$work/tiny"

# export DIR OUT -> prints "seconds max_rss_kb"
export_once() {
  rm -f "$2"
  local start=$EPOCHREALTIME
  /usr/bin/time -f "%M" -o "$work/rss" "$build/bin/dtrain-ckpt" export "$1" --format onnx --out "$2" "${quantize[@]}" > /dev/null
  awk -v a="$start" -v b="$EPOCHREALTIME" -v m="$(cat "$work/rss")" 'BEGIN {printf "%.4f %d\n", b - a, m}'
}
for _ in $(seq "$repeats"); do export_once "$work/model/checkpoints" "$work/model.onnx"; done > "$work/runs"
baseline_kb=$(for _ in 1 2 3; do export_once "$work/tiny/checkpoints" "$work/tiny.onnx"; done | awk '{print $2}' | sort -n | tail -1)
export_s=$(awk '{print $1}' "$work/runs" | sort -n | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}')
peak_kb=$(awk '{print $2}' "$work/runs" | sort -n | tail -1)
# Parameters and the largest block from the manifest, as dtrain-ckpt inspect prints them.
read -r params block < <("$build/bin/dtrain-ckpt" inspect "$work/model/checkpoints" |
  awk '/^blocks/ {b = 1; next} /^model/ {print $(NF - 1), max; exit} b && $2 > max {max = $2}')

echo "dtrain-ckpt export --format onnx ${quantize[*]} of $(basename "$config") ($params parameters), $(nproc) cores"
echo "command: $0 ${1:-} (CONFIG=$config REPEATS=$repeats QUANTIZE=${QUANTIZE:-})"
echo "onnx_bytes: $(stat -c %s "$work/model.onnx")"
echo "export_s: $export_s"
awk -v p="$peak_kb" -v b="$baseline_kb" -v n="$params" -v k="$block" 'BEGIN {
  printf "peak_rss_mb: %.2f\nbaseline_rss_mb: %.2f\nexport_rss_mb: %.2f\n", p / 1024, b / 1024, (p - b) / 1024
  printf "model_mb: %.2f\nblock_mb: %.2f\nbound_mb: %.2f\n", n * 4 / 1048576, k * 4 / 1048576, (n + k) * 4 / 1048576 }'
if command -v heaptrack > /dev/null && command -v heaptrack_print > /dev/null; then
  rm -f "$work/model.onnx"
  heaptrack -o "$work/heap" "$build/bin/dtrain-ckpt" export "$work/model/checkpoints" --format onnx \
    --out "$work/model.onnx" "${quantize[@]}" > /dev/null 2>&1
  heaptrack_print "$work"/heap.* 2> /dev/null | sed -n 's/^peak heap memory consumption: \(.*\)$/heap_peak: \1/p'
fi
