#!/usr/bin/env bash
# Sets up, builds and runs every test (ctest), printing the output of failures.
# Extra arguments go to ctest, e.g. scripts/test.sh -L unit.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
cd build
ctest --output-on-failure --timeout 600 -j "$(nproc)" "$@"
