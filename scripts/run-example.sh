#!/usr/bin/env bash
# Sets up, builds and trains the example: a Transformer classifier on
# Fashion-MNIST (examples/configs/fashion-mnist.json) on 2 local workers
# started and supervised by dtrain-launch, writing a fresh run directory under
# runs/ (per-rank logs in its logs/). Each worker takes micro-batch 64, so the
# 2 ranks train what one rank with the config's micro-batch 128 trains; rank 0
# prints the final accuracy. It saves a checkpoint at the last step, and at
# the end prints the run's folders and the command lines that evaluate it,
# export it to ONNX and run that in ONNX Runtime. Extra arguments go to
# dtrain-worker (e.g. --set train.steps=200).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
out="runs/fashion-mnist-$(date +%Y%m%d-%H%M%S)"
build/bin/dtrain-launch --standalone --nproc-per-node 2 --log-dir "$out/logs" -- \
  build/bin/dtrain-worker --config examples/configs/fashion-mnist.json \
  --set "train.out_dir=$out" --set train.micro_batch_size=64 "$@"
cat <<EOF
run directory: $out (config.json, metrics.jsonl, logs/, tensorboard/)
checkpoints:   $out/checkpoints
next:
  build/bin/dtrain-worker --config $out/config.json --eval-only       # score the checkpoint again
  build/bin/dtrain-ckpt export $out/checkpoints --format onnx --out $out/fashion.onnx
  .venv/bin/python tools/onnx_run.py $out/fashion.onnx --check --from-config $out/config.json
  .venv/bin/tensorboard --logdir $out/tensorboard                      # the curves in TensorBoard
EOF
