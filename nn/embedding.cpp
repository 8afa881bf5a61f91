#include "nn/embedding.h"

#include "core/error.h"
#include "nn/linear.h"

namespace dtrain::nn {

void token_embedding_forward(const std::int32_t* tokens, const float* table, const float* pos,
                             float* out, std::int64_t batch, std::int64_t seq, std::int64_t d,
                             std::int64_t vocab) {
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t t = 0; t < seq; ++t) {
      const std::int32_t tok = tokens[b * seq + t];
      if (tok < 0 || tok >= vocab) {
        throw Error(fmt::format(
            "token {} at batch row {}, position {} is outside the vocabulary [0, {}); "
            "check model.vocab_size against the data",
            tok, b, t, vocab));
      }
      const float* e = table + static_cast<std::int64_t>(tok) * d;
      float* o = out + (b * seq + t) * d;
      if (pos == nullptr) {
        for (std::int64_t j = 0; j < d; ++j) o[j] = e[j];
        continue;
      }
      const float* p = pos + t * d;
      for (std::int64_t j = 0; j < d; ++j) o[j] = e[j] + p[j];
    }
  }
}

void token_embedding_backward(const std::int32_t* tokens, const float* d_out, float* d_table,
                              float* d_pos, std::int64_t batch, std::int64_t seq,
                              std::int64_t d) {
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t t = 0; t < seq; ++t) {
      const float* g = d_out + (b * seq + t) * d;
      float* e = d_table + static_cast<std::int64_t>(tokens[b * seq + t]) * d;
      if (d_pos == nullptr) {
        for (std::int64_t j = 0; j < d; ++j) e[j] += g[j];
        continue;
      }
      float* p = d_pos + t * d;
      for (std::int64_t j = 0; j < d; ++j) {
        e[j] += g[j];
        p[j] += g[j];
      }
    }
  }
}

void patch_embedding_forward(const float* patches, const float* weight, const float* bias,
                             const float* pos, float* out, std::int64_t batch, std::int64_t seq,
                             std::int64_t d, std::int64_t patch_dim) {
  linear_forward(patches, weight, bias, out, batch * seq, patch_dim, d);
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t t = 0; t < seq; ++t) {
      float* o = out + (b * seq + t) * d;
      const float* p = pos + t * d;
      for (std::int64_t j = 0; j < d; ++j) o[j] += p[j];
    }
  }
}

void patch_embedding_backward(const float* patches, const float* d_out, float* d_weight,
                              float* d_bias, float* d_pos, std::int64_t batch, std::int64_t seq,
                              std::int64_t d, std::int64_t patch_dim) {
  linear_backward(d_out, patches, nullptr, nullptr, d_weight, d_bias, batch * seq, patch_dim, d);
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t t = 0; t < seq; ++t) {
      const float* g = d_out + (b * seq + t) * d;
      float* p = d_pos + t * d;
      for (std::int64_t j = 0; j < d; ++j) p[j] += g[j];
    }
  }
}

void mean_pool_forward(const float* x, float* out, std::int64_t batch, std::int64_t seq,
                       std::int64_t d) {
  const float inv = 1.0f / static_cast<float>(seq);
  for (std::int64_t b = 0; b < batch; ++b) {
    float* o = out + b * d;
    for (std::int64_t j = 0; j < d; ++j) o[j] = 0.0f;
    for (std::int64_t t = 0; t < seq; ++t) {
      const float* xi = x + (b * seq + t) * d;
      for (std::int64_t j = 0; j < d; ++j) o[j] += xi[j];
    }
    for (std::int64_t j = 0; j < d; ++j) o[j] *= inv;
  }
}

void mean_pool_backward(const float* d_out, float* d_x, std::int64_t batch, std::int64_t seq,
                        std::int64_t d) {
  const float inv = 1.0f / static_cast<float>(seq);
  for (std::int64_t b = 0; b < batch; ++b) {
    const float* g = d_out + b * d;
    for (std::int64_t t = 0; t < seq; ++t) {
      float* dx = d_x + (b * seq + t) * d;
      for (std::int64_t j = 0; j < d; ++j) dx[j] = g[j] * inv;
    }
  }
}

}  // namespace dtrain::nn
