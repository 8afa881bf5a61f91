#include "nn/cuda/check.h"
#include "nn/cuda/device_math.cuh"
#include "nn/cuda/embedding.h"

namespace dtrain::nn::cuda {
namespace {

using detail::grid_for;
using detail::kBlock;

// One thread per output element of [B, T, d].
__global__ void token_embedding_forward_kernel(const std::int32_t* tokens, const float* table,
                                               const float* pos, float* out, std::int64_t seq,
                                               std::int64_t d, std::int64_t vocab,
                                               std::int64_t total, std::int32_t* bad_index) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < total;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t row = i / d, j = i % d, t = row % seq;
    const std::int32_t tok = tokens[row];
    const bool ok = tok >= 0 && tok < vocab;
    if (!ok && j == 0 && bad_index != nullptr) *bad_index = static_cast<std::int32_t>(row);
    out[i] = (ok ? table[static_cast<std::int64_t>(tok) * d + j] : 0.0f) + pos[t * d + j];
  }
}

__global__ void token_embedding_backward_kernel(const std::int32_t* tokens, const float* d_out,
                                                float* d_table, std::int64_t d,
                                                std::int64_t total) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < total;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t row = i / d, j = i % d;
    atomicAdd(d_table + static_cast<std::int64_t>(tokens[row]) * d + j, d_out[i]);
  }
}

// One thread per element of [T, d]: d_pos += sum over b, b in order.
__global__ void sum_over_batch_kernel(const float* d_out, float* d_pos, std::int64_t batch,
                                      std::int64_t seq_d) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < seq_d;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    float s = 0.0f;
    for (std::int64_t b = 0; b < batch; ++b) s += d_out[b * seq_d + i];
    d_pos[i] += s;
  }
}

__global__ void add_positions_kernel(const float* pos, float* out, std::int64_t seq_d,
                                     std::int64_t total) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < total;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    out[i] += pos[i % seq_d];
  }
}

// One thread per element of [B, d]: the mean over t, t in order.
__global__ void mean_pool_forward_kernel(const float* x, float* out, std::int64_t seq,
                                         std::int64_t d, std::int64_t total) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < total;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t b = i / d, j = i % d;
    float s = 0.0f;
    for (std::int64_t t = 0; t < seq; ++t) s += x[(b * seq + t) * d + j];
    out[i] = s * (1.0f / static_cast<float>(seq));
  }
}

__global__ void mean_pool_backward_kernel(const float* d_out, float* d_x, std::int64_t seq,
                                          std::int64_t d, std::int64_t total) {
  const float inv = 1.0f / static_cast<float>(seq);
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < total;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t b = i / (seq * d), j = i % d;
    d_x[i] = d_out[b * d + j] * inv;
  }
}

}  // namespace

void token_embedding_forward(const std::int32_t* tokens, const float* table, const float* pos,
                             float* out, std::int64_t batch, std::int64_t seq, std::int64_t d,
                             std::int64_t vocab, std::int32_t* bad_index, cudaStream_t stream) {
  const std::int64_t total = batch * seq * d;
  if (total == 0) return;
  token_embedding_forward_kernel<<<grid_for(total), kBlock, 0, stream>>>(
      tokens, table, pos, out, seq, d, vocab, total, bad_index);
  DTRAIN_CUDA_LAUNCH_CHECK();
}

void token_embedding_backward(const std::int32_t* tokens, const float* d_out, float* d_table,
                              float* d_pos, std::int64_t batch, std::int64_t seq, std::int64_t d,
                              cudaStream_t stream) {
  const std::int64_t total = batch * seq * d;
  if (total == 0) return;
  token_embedding_backward_kernel<<<grid_for(total), kBlock, 0, stream>>>(tokens, d_out, d_table, d,
                                                                          total);
  DTRAIN_CUDA_LAUNCH_CHECK();
  add_positions_backward(d_out, d_pos, batch, seq, d, stream);
}

void add_positions_forward(const float* pos, float* out, std::int64_t batch, std::int64_t seq,
                           std::int64_t d, cudaStream_t stream) {
  const std::int64_t total = batch * seq * d;
  if (total == 0) return;
  add_positions_kernel<<<grid_for(total), kBlock, 0, stream>>>(pos, out, seq * d, total);
  DTRAIN_CUDA_LAUNCH_CHECK();
}

void add_positions_backward(const float* d_out, float* d_pos, std::int64_t batch, std::int64_t seq,
                            std::int64_t d, cudaStream_t stream) {
  if (seq * d == 0) return;
  sum_over_batch_kernel<<<grid_for(seq * d), kBlock, 0, stream>>>(d_out, d_pos, batch, seq * d);
  DTRAIN_CUDA_LAUNCH_CHECK();
}

void mean_pool_forward(const float* x, float* out, std::int64_t batch, std::int64_t seq,
                       std::int64_t d, cudaStream_t stream) {
  if (batch * d == 0) return;
  mean_pool_forward_kernel<<<grid_for(batch * d), kBlock, 0, stream>>>(x, out, seq, d, batch * d);
  DTRAIN_CUDA_LAUNCH_CHECK();
}

void mean_pool_backward(const float* d_out, float* d_x, std::int64_t batch, std::int64_t seq,
                        std::int64_t d, cudaStream_t stream) {
  const std::int64_t total = batch * seq * d;
  if (total == 0) return;
  mean_pool_backward_kernel<<<grid_for(total), kBlock, 0, stream>>>(d_out, d_x, seq, d, total);
  DTRAIN_CUDA_LAUNCH_CHECK();
}

}  // namespace dtrain::nn::cuda
