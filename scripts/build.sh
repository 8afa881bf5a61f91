#!/usr/bin/env bash
# Configures and builds dtrain into build/ (binaries in build/bin).
# Extra arguments go to cmake's configure step, e.g. -DDTRAIN_SANITIZE=ON.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build build -j "$(nproc)"
