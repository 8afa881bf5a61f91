#!/usr/bin/env bash
# ONNX Runtime latency of an exported model, f32 against --quantize int8, on
# one thread: cls-seed (examples/configs/cls-seed.json: a 6-layer, d_model 512
# token classifier, sequence 64) at batch 32 by default. Trains one step to
# get a checkpoint (latency does not depend on the weights), exports both
# models, times RUNS runs of each after warm-up (tools/onnx_run.py --bench).
#   f32_ms, int8_ms   median latency of one batch
#   int8_speedup      f32_ms / int8_ms
#
#   bench/onnx-latency.sh [BUILD_DIR]           (default: build; needs scripts/setup.sh's .venv)
#   CONFIG=examples/configs/cls-seed.json BATCH=32 RUNS=30 THREADS=1 bench/onnx-latency.sh
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$repo/build}
config=${CONFIG:-$repo/examples/configs/cls-seed.json}
batch=${BATCH:-32}
runs=${RUNS:-30}
threads=${THREADS:-1}
python=$repo/.venv/bin/python
[[ -x $python ]] || { echo "onnx-latency: $python is missing: run scripts/setup.sh" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$build/bin/dtrain-worker" --config "$config" --set "train.out_dir=$work/run" --set train.steps=1 \
  --set schedule.warmup_steps=0 --set checkpoint.every_steps=1 --set train.eval_batches=1 > "$work/train.log" 2>&1 ||
  { cat "$work/train.log" >&2; exit 1; }
"$build/bin/dtrain-ckpt" export "$work/run/checkpoints" --format onnx --out "$work/f32.onnx" > /dev/null
"$build/bin/dtrain-ckpt" export "$work/run/checkpoints" --format onnx --out "$work/int8.onnx" --quantize int8 > /dev/null

# A random batch shaped for the graph's input (tokens or patches), as a TensorProto.
"$python" - "$work/f32.onnx" "$work/input.pb" "$batch" <<'PY'
import sys
import numpy as np
import onnx
from onnx import numpy_helper
model, out, batch = onnx.load(sys.argv[1], load_external_data=False), sys.argv[2], int(sys.argv[3])
meta = {p.key: p.value for p in model.metadata_props}
seq = int(meta["dtrain.max_seq_len"])
inp = model.graph.input[0]
rng = np.random.default_rng(0)
if inp.name == "tokens":
    vocab = next(i for i in model.graph.initializer if i.name == "tok_emb").dims[0]
    value = rng.integers(0, vocab, size=(batch, seq), dtype=np.int64)
else:
    patch_dim = inp.type.tensor_type.shape.dim[2].dim_value
    value = rng.standard_normal((batch, seq, patch_dim)).astype(np.float32)
onnx.save_tensor(numpy_helper.from_array(value, inp.name), out)
print(f"input {inp.name} {list(value.shape)}")
PY

bench() {
  "$python" "$repo/tools/onnx_run.py" "$1" --input "$2=$work/input.pb" --bench "$runs" --threads "$threads" |
    sed -n 's/^latency_ms_median: //p'
}
input_name=$("$python" -c "import onnx,sys; print(onnx.load(sys.argv[1]).graph.input[0].name)" "$work/f32.onnx")
f32=$(bench "$work/f32.onnx" "$input_name")
int8=$(bench "$work/int8.onnx" "$input_name")
echo "ONNX Runtime $("$python" -c 'import onnxruntime; print(onnxruntime.__version__)'), $(basename "$config"), batch $batch, $threads thread(s), median of $runs runs"
echo "command: $0 ${1:-} (CONFIG=$config BATCH=$batch RUNS=$runs THREADS=$threads)"
echo "f32_file_bytes: $(stat -c %s "$work/f32.onnx")"
echo "int8_file_bytes: $(stat -c %s "$work/int8.onnx")"
echo "f32_ms: $f32"
echo "int8_ms: $int8"
awk -v a="$f32" -v b="$int8" 'BEGIN {printf "int8_speedup: %.2f\n", a / b}'
