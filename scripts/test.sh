#!/usr/bin/env bash
# Sets up, builds and runs every test (ctest), printing the output of failures.
# Extra arguments go to ctest, e.g. scripts/test.sh -L unit.
#
# Then the tests labelled `isa` (matmul, kernels, training equivalence) run
# again on the CPU path this machine does not take by itself, so that CI on
# any CPU covers both: on a CPU with AVX-512, capped at AVX2
# (ONEDNN_MAX_CPU_ISA=AVX2: oneDNN's sgemm, dtrain's own AVX2 GEMM, bf16
# widened to f32, as on a CPU with AVX2 alone; nn/cpu/isa.h); on a CPU with
# AVX2 alone, with dtrain's own GEMM off (DTRAIN_CPU_GEMM=onednn).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
cd build
ctest --output-on-failure --timeout 600 -j "$(nproc)" "$@"

if grep -qw avx512bw /proc/cpuinfo; then
  echo "test: the isa tests again as on a CPU with AVX2 alone (ONEDNN_MAX_CPU_ISA=AVX2)"
  other=(ONEDNN_MAX_CPU_ISA=AVX2)
else
  echo "test: the isa tests again with oneDNN for every product (DTRAIN_CPU_GEMM=onednn)"
  other=(DTRAIN_CPU_GEMM=onednn)
fi
env "${other[@]}" ctest --output-on-failure --timeout 600 -j "$(nproc)" -L isa "$@"
