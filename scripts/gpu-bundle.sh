#!/usr/bin/env bash
# Packs a CUDA build's GPU check into one archive, for a GPU machine that has
# the NVIDIA driver and CUDA's libraries but not dtrain's build dependencies:
#   scripts/gpu-bundle.sh [BUILD_DIR] [ARCHIVE]
# BUILD_DIR (default build) must be a DTRAIN_WITH_CUDA build whose
# CMAKE_CUDA_ARCHITECTURES include the GPU's (the default 90;100 covers
# H100/H200 and B200). The archive (default gpu-bundle.tar.xz) holds
# bin/, lib/ and tests/ as gpu-check.sh runs them, and deps/: every shared
# library those binaries load from this machine except the C library's own,
# the compiler runtime's, cuBLAS's and NCCL's, which the GPU machine's CUDA
# installation provides (the CUDA runtime, libcudart, travels: it is small and
# is the one the kernels were built against). Run it there with
#   BUNDLE=gpu-bundle.tar.xz scripts/gpu-check.sh
set -euo pipefail
cd "$(dirname "$0")/.."

build=${1:-build}
archive=${2:-gpu-bundle.tar.xz}
programs=(bin/dtrain-bench bin/dtrain-worker lib/libdtrain_cuda.so
  tests/test_cuda_kernels tests/test_cuda_device tests/test_comm_nccl tests/test_cuda_training)

for program in "${programs[@]}"; do
  [[ -x $build/$program || -f $build/$program ]] || {
    echo "gpu-bundle: $build/$program is missing; build it first (scripts/build.sh, with nvcc present)" >&2
    exit 1
  }
done

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/deps"
for program in "${programs[@]}"; do
  mkdir -p "$stage/$(dirname "$program")"
  cp "$build/$program" "$stage/$program"
done
# The libraries to carry: what ldd resolves, less glibc's, the compiler
# runtime's (the GPU machine's are as new or newer), cuBLAS's and NCCL's.
for program in "${programs[@]}"; do ldd "$build/$program"; done |
  awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u |
  grep -Ev '/(libc|libm|libdl|librt|libpthread|libgcc_s|libstdc\+\+)\.so|/libcublas|/libnccl' |
  while read -r lib; do cp -L "$lib" "$stage/deps/"; done

tar -C "$stage" -cJf "$archive" .
echo "gpu-bundle: $archive ($(du -h "$archive" | cut -f1)): ${programs[*]} and $(ls "$stage/deps" | wc -l) libraries"
