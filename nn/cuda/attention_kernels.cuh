// Kernels shared by the fp32 and 16-bit attention cores (attention.cu,
// attention_half.cu); include from .cu only. F is a detail:: load/store policy.
#pragma once

#include <cstdint>

#include "nn/attention.h"
#include "nn/cuda/device_math.cuh"

namespace dtrain::nn::cuda::detail {

constexpr int kWarpsPerBlock = kBlock / 32;  // softmax: one warp per row

// Part `part` of interleaved [B, T, parts, H, hd] <-> head-major [B, H, T, hd];
// one thread per head-major element.
template <bool kToHeads, class T>
__global__ void copy_heads_kernel(AttentionShape s, T* interleaved, std::int64_t parts,
                                  std::int64_t part, T* heads) {
  const std::int64_t hd = s.head_dim, d_model = s.heads * hd;
  const std::int64_t total = s.batch * s.heads * s.seq * hd;
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < total;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t e = i % hd, t = (i / hd) % s.seq, h = (i / (hd * s.seq)) % s.heads;
    const std::int64_t b = i / (hd * s.seq * s.heads);
    T* inter = interleaved + (b * s.seq + t) * parts * d_model + part * d_model + h * hd + e;
    if (kToHeads) {
      heads[i] = *inter;
    } else {
      *inter = heads[i];
    }
  }
}

// p = softmax(scores) per row of [B*H*T, T]; causal rows keep columns <= (row
// mod T), the rest are 0. p may alias scores (fp32): scores are only read
// before the last pass, which writes each column from its own score.
template <class F, class T>
__global__ void softmax_rows_kernel(AttentionShape s, const float* scores, T* p) {
  const std::int64_t cols = s.seq, rows = s.batch * s.heads * cols;
  const std::int64_t r = blockIdx.x * std::int64_t{kWarpsPerBlock} + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;  // whole warps leave together
  const float* in = scores + r * cols;
  T* row = p + r * cols;
  const std::int64_t valid = s.causal ? (r % cols) + 1 : cols;
  float mx = -INFINITY;
  for (std::int64_t j = lane; j < valid; j += 32) mx = fmaxf(mx, in[j]);
  mx = warp_max(mx);
  float sum = 0.0f;
  for (std::int64_t j = lane; j < valid; j += 32) sum += fast_exp(in[j] - mx);
  const float inv = 1.0f / warp_sum(sum);
  for (std::int64_t j = lane; j < cols; j += 32) {
    row[j] = F::store(j < valid ? fast_exp(in[j] - mx) * inv : 0.0f);
  }
}

// ds = P * (dP - rowsum(P * dP)) per row; ds may alias dp (fp32).
template <class F, class T>
__global__ void softmax_backward_rows_kernel(AttentionShape s, const T* p, const float* dp, T* ds) {
  const std::int64_t cols = s.seq, rows = s.batch * s.heads * cols;
  const std::int64_t r = blockIdx.x * std::int64_t{kWarpsPerBlock} + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  const T* pr = p + r * cols;
  const float* dr = dp + r * cols;
  T* out = ds + r * cols;
  float dot = 0.0f;
  for (std::int64_t j = lane; j < cols; j += 32) dot += F::load(pr[j]) * dr[j];
  dot = warp_sum(dot);
  for (std::int64_t j = lane; j < cols; j += 32) out[j] = F::store(F::load(pr[j]) * (dr[j] - dot));
}

inline unsigned softmax_grid(const AttentionShape& s) {
  const std::int64_t rows = s.batch * s.heads * s.seq;
  return static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

inline unsigned heads_grid(const AttentionShape& s) {
  return grid_for(s.batch * s.heads * s.seq * s.head_dim);
}

}  // namespace dtrain::nn::cuda::detail
