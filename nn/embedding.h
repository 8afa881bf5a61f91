// Input embeddings and pooling: token embedding + learned positions for token
// inputs, a linear patch projection + learned positions for image patches,
// and the classifier's mean pool over the sequence.
#pragma once

#include <cstdint>

namespace dtrain::nn {

// tokens: [B, T] (each < vocab); table: [vocab, d]; pos: [>= T, d], or null
// (rotary positions: the embedding alone); out: [B, T, d].
// Throws dtrain::Error naming the token and position if a token is out of range.
void token_embedding_forward(const std::int32_t* tokens, const float* table, const float* pos,
                             float* out, std::int64_t batch, std::int64_t seq, std::int64_t d,
                             std::int64_t vocab);

// d_out: [B, T, d]; d_table (rows of the tokens) and d_pos ([T, d], unless null) are added to.
void token_embedding_backward(const std::int32_t* tokens, const float* d_out, float* d_table,
                              float* d_pos, std::int64_t batch, std::int64_t seq, std::int64_t d);

// patches: [B, T, patch_dim]; weight: [d, patch_dim]; bias, pos as above; out: [B, T, d].
void patch_embedding_forward(const float* patches, const float* weight, const float* bias,
                             const float* pos, float* out, std::int64_t batch, std::int64_t seq,
                             std::int64_t d, std::int64_t patch_dim);

void patch_embedding_backward(const float* patches, const float* d_out, float* d_weight,
                              float* d_bias, float* d_pos, std::int64_t batch, std::int64_t seq,
                              std::int64_t d, std::int64_t patch_dim);

// x: [B, T, d] -> out: [B, d], the mean over T.
void mean_pool_forward(const float* x, float* out, std::int64_t batch, std::int64_t seq,
                       std::int64_t d);
// d_out: [B, d] -> d_x: [B, T, d], written.
void mean_pool_backward(const float* d_out, float* d_x, std::int64_t batch, std::int64_t seq,
                        std::int64_t d);

}  // namespace dtrain::nn
