// GPU embeddings (nn/embedding.h gives the math): token + learned position,
// the positions of the patch embedding (the kernel set runs its projection as
// a linear layer) and the classifier's mean pool. Tokens are checked on the
// host before they are staged (nn::Graph), so the kernels trust them. Device
// pointers; asynchronous on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>


namespace dtrain::nn::cuda {

// tokens: [B, T], each < vocab; table: [vocab, d]; pos: [>= T, d]; out: [B, T, d].
void token_embedding_forward(const std::int32_t* tokens, const float* table, const float* pos, float* out,
                             std::int64_t batch, std::int64_t seq, std::int64_t d, cudaStream_t stream);
// d_out: [B, T, d]; d_table (rows of the tokens) and d_pos ([T, d]) are added
// to. d_pos sums over B in order; d_table uses atomics, so rows of repeated
// tokens are summed in no fixed order.
void token_embedding_backward(const std::int32_t* tokens, const float* d_out, float* d_table, float* d_pos,
                              std::int64_t batch, std::int64_t seq, std::int64_t d, cudaStream_t stream);

// out: [B, T, d] += pos: [>= T, d] broadcast over B.
void add_positions_forward(const float* pos, float* out, std::int64_t batch, std::int64_t seq, std::int64_t d,
                           cudaStream_t stream);
// d_pos: [T, d] += the sum over B of d_out: [B, T, d], B in order.
void add_positions_backward(const float* d_out, float* d_pos, std::int64_t batch, std::int64_t seq, std::int64_t d,
                            cudaStream_t stream);

// x: [B, T, d] -> out: [B, d], the mean over T (T in order).
void mean_pool_forward(const float* x, float* out, std::int64_t batch, std::int64_t seq, std::int64_t d,
                       cudaStream_t stream);
// d_out: [B, d] -> d_x: [B, T, d], written.
void mean_pool_backward(const float* d_out, float* d_x, std::int64_t batch, std::int64_t seq, std::int64_t d,
                        cudaStream_t stream);

}  // namespace dtrain::nn::cuda
