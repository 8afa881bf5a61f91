#!/usr/bin/env bash
# Sets up, builds and trains the example: a Transformer classifier on
# Fashion-MNIST (examples/configs/fashion-mnist.json), writing a fresh run
# directory under runs/. Extra arguments go to dtrain-worker (e.g. --set train.steps=200).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
out="runs/fashion-mnist-$(date +%Y%m%d-%H%M%S)"
build/bin/dtrain-worker --config examples/configs/fashion-mnist.json \
  --set "train.out_dir=$out" "$@"
echo "run directory: $out (config.json, metrics.jsonl)"
