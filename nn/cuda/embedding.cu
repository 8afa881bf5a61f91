#include "nn/cuda/embedding.h"

#include "core/cuda/check.h"
#include "nn/cuda/device_math.cuh"

namespace dtrain::nn::cuda {
namespace {

using detail::for_each_index;
using detail::launch;

// One thread per element of [B, T, d].
__global__ void token_embedding_forward_kernel(const std::int32_t* tokens, const float* table, const float* pos,
                                               float* out, std::int64_t seq, std::int64_t d, std::int64_t total) {
  for_each_index(total, [=](std::int64_t i) {
    const std::int64_t row = i / d, j = i % d;
    out[i] = table[static_cast<std::int64_t>(tokens[row]) * d + j] + (pos != nullptr ? pos[(row % seq) * d + j] : 0.0f);
  });
}

__global__ void token_embedding_backward_kernel(const std::int32_t* tokens, const float* d_out, float* d_table,
                                                std::int64_t d, std::int64_t total) {
  for_each_index(total, [=](std::int64_t i) {
    atomicAdd(d_table + static_cast<std::int64_t>(tokens[i / d]) * d + i % d, d_out[i]);
  });
}

// One thread per element of [T, d]: d_pos += the sum over b, b in order.
__global__ void sum_over_batch_kernel(const float* d_out, float* d_pos, std::int64_t batch, std::int64_t seq_d) {
  for_each_index(seq_d, [=](std::int64_t i) {
    float s = 0.0f;
    for (std::int64_t b = 0; b < batch; ++b) s += d_out[b * seq_d + i];
    d_pos[i] += s;
  });
}

__global__ void add_positions_kernel(const float* pos, float* out, std::int64_t seq_d, std::int64_t total) {
  for_each_index(total, [=](std::int64_t i) { out[i] += pos[i % seq_d]; });
}

// One thread per element of [B, d]: the mean over t, t in order.
__global__ void mean_pool_forward_kernel(const float* x, float* out, std::int64_t seq, std::int64_t d,
                                         std::int64_t total) {
  for_each_index(total, [=](std::int64_t i) {
    const std::int64_t b = i / d, j = i % d;
    float s = 0.0f;
    for (std::int64_t t = 0; t < seq; ++t) s += x[(b * seq + t) * d + j];
    out[i] = s * (1.0f / static_cast<float>(seq));
  });
}

__global__ void mean_pool_backward_kernel(const float* d_out, float* d_x, std::int64_t seq, std::int64_t d,
                                          std::int64_t total) {
  const float inv = 1.0f / static_cast<float>(seq);
  for_each_index(total, [=](std::int64_t i) { d_x[i] = d_out[(i / (seq * d)) * d + i % d] * inv; });
}

}  // namespace

void token_embedding_forward(const std::int32_t* tokens, const float* table, const float* pos, float* out,
                             std::int64_t batch, std::int64_t seq, std::int64_t d, cudaStream_t stream) {
  const std::int64_t total = batch * seq * d;
  launch(token_embedding_forward_kernel, total, stream, tokens, table, pos, out, seq, d, total);
}

void token_embedding_backward(const std::int32_t* tokens, const float* d_out, float* d_table, float* d_pos,
                              std::int64_t batch, std::int64_t seq, std::int64_t d, cudaStream_t stream) {
  const std::int64_t total = batch * seq * d;
  launch(token_embedding_backward_kernel, total, stream, tokens, d_out, d_table, d, total);
  if (d_pos != nullptr) add_positions_backward(d_out, d_pos, batch, seq, d, stream);
}

void add_positions_forward(const float* pos, float* out, std::int64_t batch, std::int64_t seq, std::int64_t d,
                           cudaStream_t stream) {
  const std::int64_t total = batch * seq * d;
  launch(add_positions_kernel, total, stream, pos, out, seq * d, total);
}

void add_positions_backward(const float* d_out, float* d_pos, std::int64_t batch, std::int64_t seq, std::int64_t d,
                            cudaStream_t stream) {
  launch(sum_over_batch_kernel, seq * d, stream, d_out, d_pos, batch, seq * d);
}

void mean_pool_forward(const float* x, float* out, std::int64_t batch, std::int64_t seq, std::int64_t d,
                       cudaStream_t stream) {
  launch(mean_pool_forward_kernel, batch * d, stream, x, out, seq, d, batch * d);
}

void mean_pool_backward(const float* d_out, float* d_x, std::int64_t batch, std::int64_t seq, std::int64_t d,
                        cudaStream_t stream) {
  const std::int64_t total = batch * seq * d;
  launch(mean_pool_backward_kernel, total, stream, d_out, d_x, seq, d, total);
}

}  // namespace dtrain::nn::cuda
