// GPU embeddings (nn/embedding.h gives the math): token + learned position,
// the position add of the patch embedding (its projection is a cuda::gemm),
// and the classifier's mean pool. Pointers are device memory; every call is
// asynchronous on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace dtrain::nn::cuda {

// tokens: [B, T]; table: [vocab, d]; pos: [>= T, d]; out: [B, T, d].
// A token outside [0, vocab) cannot throw from the device: its row gets only
// the position, and when bad_index is not null the flat index b*T+t of one
// such token is stored there (the caller sets it to -1 first and checks it
// once the stream has run; the CPU kernel throws instead).
void token_embedding_forward(const std::int32_t* tokens, const float* table, const float* pos,
                             float* out, std::int64_t batch, std::int64_t seq, std::int64_t d,
                             std::int64_t vocab, std::int32_t* bad_index, cudaStream_t stream);

// d_out: [B, T, d]; d_table (rows of the tokens) and d_pos ([T, d]) are added
// to. d_pos sums over B in order; d_table uses atomics, so rows of repeated
// tokens are summed in no fixed order. REQUIRES: every token < vocab.
void token_embedding_backward(const std::int32_t* tokens, const float* d_out, float* d_table,
                              float* d_pos, std::int64_t batch, std::int64_t seq, std::int64_t d,
                              cudaStream_t stream);

// out: [B, T, d] += pos: [>= T, d] broadcast over B (patch embedding's positions).
void add_positions_forward(const float* pos, float* out, std::int64_t batch, std::int64_t seq,
                           std::int64_t d, cudaStream_t stream);
// d_pos: [T, d] += sum over B of d_out: [B, T, d].
void add_positions_backward(const float* d_out, float* d_pos, std::int64_t batch, std::int64_t seq,
                            std::int64_t d, cudaStream_t stream);

// x: [B, T, d] -> out: [B, d], the mean over T.
void mean_pool_forward(const float* x, float* out, std::int64_t batch, std::int64_t seq,
                       std::int64_t d, cudaStream_t stream);
// d_out: [B, d] -> d_x: [B, T, d], written.
void mean_pool_backward(const float* d_out, float* d_x, std::int64_t batch, std::int64_t seq,
                        std::int64_t d, cudaStream_t stream);

}  // namespace dtrain::nn::cuda
