// Device-side helpers shared by the kernels of nn/cuda/ (include from .cu only):
// the CPU's exp/erf approximations, loads and stores per storage format, the
// grid-stride loop, block reductions and grid sizing.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "core/cuda/check.h"
#include "nn/cuda/format.h"

namespace dtrain::nn::cuda::detail {

constexpr int kBlock = 256;  // threads per block of the elementwise and row kernels

inline unsigned grid_for(std::int64_t n, int block = kBlock) {
  std::int64_t blocks = (n + block - 1) / block;
  if (blocks > 65535 * 32) blocks = 65535 * 32;  // grid-stride loops cover the rest
  return static_cast<unsigned>(blocks < 1 ? 1 : blocks);
}

// Launches kernel(args...) with a thread per element of `threads` (none when
// it is 0) on `stream`, then checks the launch. For the grid-stride kernels.
template <class... Params, class... Args>
void launch(void (*kernel)(Params...), std::int64_t threads, cudaStream_t stream, Args... args) {
  if (threads == 0) return;
  kernel<<<grid_for(threads), kBlock, 0, stream>>>(args...);
  DTRAIN_CUDA_LAUNCHED();
}

// The same operations as nn/cpu/vec_math.h's fast_exp, so GPU and CPU results
// agree to an ulp or two (libm's expf differs by more in GELU's tails).
// __fmul_rn / __fadd_rn keep nvcc from contracting into FMAs the CPU code does not use.
__device__ __forceinline__ float fast_exp(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  const float n =
      __fadd_rn(__fadd_rn(__fmul_rn(x, 1.44269504088896341f), 12582912.0f), -12582912.0f);
  float r = __fsub_rn(x, __fmul_rn(n, 0.693359375f));
  r = __fsub_rn(r, __fmul_rn(n, -2.12194440e-4f));
  float p = 1.9875691500e-4f;
  p = __fadd_rn(__fmul_rn(p, r), 1.3981999507e-3f);
  p = __fadd_rn(__fmul_rn(p, r), 8.3334519073e-3f);
  p = __fadd_rn(__fmul_rn(p, r), 4.1665795894e-2f);
  p = __fadd_rn(__fmul_rn(p, r), 1.6666665459e-1f);
  p = __fadd_rn(__fmul_rn(p, r), 5.0000001201e-1f);
  p = __fadd_rn(__fadd_rn(__fmul_rn(__fmul_rn(p, r), r), r), 1.0f);
  const float scale = __uint_as_float(static_cast<unsigned>(static_cast<int>(n) + 127) << 23);
  return x <= -87.0f ? 0.0f : __fmul_rn(p, scale);
}

// nn/cpu/vec_math.h's fast_erf (x P(x^2) / Q(x^2) on [-4, 4]), op for op.
__device__ __forceinline__ float fast_erf(float x) {
  x = fminf(fmaxf(x, -4.0f), 4.0f);
  const float x2 = __fmul_rn(x, x);
  const float pc[] = {2.77068142495902e-08f, -2.10102402082508e-06f, -5.69250639462346e-05f,
                      -7.34990630326855e-04f, -2.95459980854025e-03f, -1.60960333262415e-02f};
  const float qc[] = {-2.13374055278905e-04f, -1.68282697438203e-03f, -7.37332916720468e-03f,
                      -1.42647390514189e-02f};
  float p = -2.72614225801306e-10f;
#pragma unroll
  for (float c : pc) p = __fadd_rn(__fmul_rn(p, x2), c);
  float q = -1.45660718464996e-05f;
#pragma unroll
  for (float c : qc) q = __fadd_rn(__fmul_rn(q, x2), c);
  return fminf(fmaxf(__fdiv_rn(__fmul_rn(x, p), q), -1.0f), 1.0f);
}

// Format<D>: loads and stores of storage format D (format.h) in f32; 16-bit
// formats round to nearest even, as on the CPU.
template <DType D>
struct Format;
template <>
struct Format<DType::f32> {
  __device__ static float load(float f) { return f; }
  __device__ static float store(float f) { return f; }
};
template <>
struct Format<DType::bf16> {
  __device__ static float load(std::uint16_t h) { return __bfloat162float(__ushort_as_bfloat16(h)); }
  __device__ static std::uint16_t store(float f) { return __bfloat16_as_ushort(__float2bfloat16_rn(f)); }
};
template <>
struct Format<DType::f16> {
  __device__ static float load(std::uint16_t h) { return __half2float(__ushort_as_half(h)); }
  __device__ static std::uint16_t store(float f) { return __half_as_ushort(__float2half_rn(f)); }
};

// for (i : grid-stride indices of [0, n)) body(i): the loop of the elementwise kernels.
template <class Body>
__device__ __forceinline__ void for_each_index(std::int64_t n, Body body) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    body(i);
  }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum (or max) of v over the block; every thread gets the result.
// REQUIRES: blockDim.x a multiple of 32, at most 1024; all threads call it.
template <bool kMax>
__device__ float block_reduce(float v) {
  __shared__ float partial[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = kMax ? warp_max(v) : warp_sum(v);
  __syncthreads();  // partial may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const int warps = blockDim.x / 32;
  float r = lane < warps ? partial[lane] : (kMax ? -INFINITY : 0.0f);
  return kMax ? warp_max(r) : warp_sum(r);
}

__device__ __forceinline__ float block_sum(float v) { return block_reduce<false>(v); }
__device__ __forceinline__ float block_max(float v) { return block_reduce<true>(v); }

// Column sums without atomics, in a fixed order: a block of kSumCols x
// kSumLanes threads owns kSumCols columns; thread row y sums rows i = y mod
// kSumLanes in order, and the kSumLanes partial sums are added in order.
// out[k][j] += sum over rows i of value(i, j)[k] for k < K, where value
// returns a float[K]-like array (Sums<K>). Launch on
// ceil(cols / kSumCols) blocks of dim3(kSumCols, kSumLanes).
constexpr int kSumCols = 32, kSumLanes = 8;
template <int K>
struct Sums {
  float v[K];
};
template <int K, class Value>
__device__ void add_column_sums(Value value, std::int64_t rows, std::int64_t cols, float* const* out) {
  __shared__ float part[K][kSumLanes][kSumCols];
  const std::int64_t j = blockIdx.x * std::int64_t{kSumCols} + threadIdx.x;
  Sums<K> s{};
  if (j < cols) {
    for (std::int64_t i = threadIdx.y; i < rows; i += kSumLanes) {
      const Sums<K> x = value(i, j);
      for (int k = 0; k < K; ++k) s.v[k] += x.v[k];
    }
  }
  for (int k = 0; k < K; ++k) part[k][threadIdx.y][threadIdx.x] = s.v[k];
  __syncthreads();
  if (threadIdx.y != 0 || j >= cols) return;
  for (int k = 0; k < K; ++k) {
    for (int r = 1; r < kSumLanes; ++r) s.v[k] += part[k][r][threadIdx.x];
    out[k][j] += s.v[k];
  }
}

inline unsigned column_sum_grid(std::int64_t cols) { return static_cast<unsigned>((cols + kSumCols - 1) / kSumCols); }

}  // namespace dtrain::nn::cuda::detail
