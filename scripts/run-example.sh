#!/usr/bin/env bash
# Sets up, builds and trains the example: a Transformer classifier on
# Fashion-MNIST (examples/configs/fashion-mnist.json) on 2 local workers
# started and supervised by dtrain-launch, writing a fresh run directory under
# runs/ (per-rank logs in its logs/). Each worker takes micro-batch 64, so the
# 2 ranks train what one rank with the config's micro-batch 128 trains; rank 0
# prints the final accuracy. Extra arguments go to dtrain-worker
# (e.g. --set train.steps=200).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
out="runs/fashion-mnist-$(date +%Y%m%d-%H%M%S)"
build/bin/dtrain-launch --standalone --nproc-per-node 2 --log-dir "$out/logs" -- \
  build/bin/dtrain-worker --config examples/configs/fashion-mnist.json \
  --set "train.out_dir=$out" --set train.micro_batch_size=64 "$@"
echo "run directory: $out (config.json, metrics.jsonl, logs/)"
