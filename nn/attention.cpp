#include "nn/attention.h"

#include <cmath>
#include <cstring>

#include "nn/cpu/matmul.h"
#include "nn/cpu/vec_math.h"
#include "nn/cpu/parallel.h"

namespace dtrain::nn {

using cpu::Gemm;

namespace {

// Copies part `part` of an interleaved [B, T, parts, H, hd] buffer to or from
// a head-major [B, H, T, hd] one (dense operands keep oneDNN on brgemm).
enum class Direction : bool { to_heads, from_heads };

void copy_heads(const AttentionShape& s, Direction dir, float* interleaved, std::int64_t parts,
                std::int64_t part, float* heads) {
  const std::int64_t hd = s.head_dim;
  const std::int64_t row = parts * s.d_model();
  const auto bytes = static_cast<std::size_t>(hd) * sizeof(float);
#pragma omp parallel for collapse(2) schedule(static) if (s.head_elems() >= kParallelMin)
  for (std::int64_t b = 0; b < s.batch; ++b) {
    for (std::int64_t h = 0; h < s.heads; ++h) {
      for (std::int64_t t = 0; t < s.seq; ++t) {
        float* inter = interleaved + (b * s.seq + t) * row + part * s.d_model() + h * hd;
        float* head = heads + ((b * s.heads + h) * s.seq + t) * hd;
        if (dir == Direction::to_heads) {
          std::memcpy(head, inter, bytes);
        } else {
          std::memcpy(inter, head, bytes);
        }
      }
    }
  }
}

void to_heads(const AttentionShape& s, const float* src, std::int64_t parts, std::int64_t part,
              float* dst) {
  // Only read in this direction.
  copy_heads(s, Direction::to_heads, const_cast<float*>(src), parts, part, dst);
}

void from_heads(const AttentionShape& s, const float* src, std::int64_t parts, std::int64_t part,
                float* dst) {
  copy_heads(s, Direction::from_heads, dst, parts, part, const_cast<float*>(src));
}

Gemm batched(const AttentionShape& s, std::int64_t m, std::int64_t n, std::int64_t k) {
  Gemm g;
  g.m = m;
  g.n = n;
  g.k = k;
  g.batch = s.batch * s.heads;
  return g;
}

// Row-wise softmax of p [rows, T] in place; causal rows keep columns <= i.
void softmax_rows(const AttentionShape& s, float* p) {
  const std::int64_t T = s.seq;
  const std::int64_t rows = s.batch * s.heads * T;
#pragma omp parallel for schedule(static) if (rows * T >= kParallelMin)
  for (std::int64_t r = 0; r < rows; ++r) {
    float* row = p + r * T;
    const std::int64_t valid = s.causal ? (r % T) + 1 : T;
    float mx = row[0];
    for (std::int64_t j = 1; j < valid; ++j) mx = row[j] > mx ? row[j] : mx;
    float sum = 0.0f;
    for (std::int64_t j = 0; j < valid; ++j) {
      row[j] = cpu::fast_exp(row[j] - mx);
      sum += row[j];
    }
    const float inv = 1.0f / sum;
    for (std::int64_t j = 0; j < valid; ++j) row[j] *= inv;
    for (std::int64_t j = valid; j < T; ++j) row[j] = 0.0f;
  }
}

// dS = P * (dP - rowsum(P * dP)), in place over dP.
void softmax_backward_rows(const AttentionShape& s, const float* p, float* dp) {
  const std::int64_t T = s.seq;
  const std::int64_t rows = s.batch * s.heads * T;
#pragma omp parallel for schedule(static) if (rows * T >= kParallelMin)
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* pr = p + r * T;
    float* dr = dp + r * T;
    float dot = 0.0f;
    for (std::int64_t j = 0; j < T; ++j) dot += pr[j] * dr[j];
    for (std::int64_t j = 0; j < T; ++j) dr[j] = pr[j] * (dr[j] - dot);
  }
}

}  // namespace

void attention_forward(const AttentionShape& s, const float* qkv, float* out,
                       const AttentionSaved& saved, const AttentionScratch& scratch) {
  const std::int64_t T = s.seq, hd = s.head_dim;
  to_heads(s, qkv, 3, 0, saved.q);
  to_heads(s, qkv, 3, 1, saved.k);
  to_heads(s, qkv, 3, 2, saved.v);
  // S[T, T] = Q K^T / sqrt(hd)
  Gemm scores = batched(s, T, T, hd);
  scores.trans_b = true;
  scores.alpha = 1.0f / std::sqrt(static_cast<float>(hd));
  cpu::gemm(scores, saved.q, saved.k, saved.probs);
  softmax_rows(s, saved.probs);
  // O[T, hd] = P V
  cpu::gemm(batched(s, T, hd, T), saved.probs, saved.v, scratch.d_out);
  from_heads(s, scratch.d_out, 1, 0, out);
}

void attention_backward(const AttentionShape& s, const float* d_out, float* d_qkv,
                        const AttentionSaved& saved, const AttentionScratch& scratch) {
  const std::int64_t T = s.seq, hd = s.head_dim;
  to_heads(s, d_out, 1, 0, scratch.d_out);
  // dP[T, T] = dO V^T ; dV[T, hd] = P^T dO
  Gemm dp = batched(s, T, T, hd);
  dp.trans_b = true;
  cpu::gemm(dp, scratch.d_out, saved.v, scratch.d_probs);
  Gemm dv = batched(s, T, hd, T);
  dv.trans_a = true;
  cpu::gemm(dv, saved.probs, scratch.d_out, scratch.dv);
  softmax_backward_rows(s, saved.probs, scratch.d_probs);
  // dQ = dS K / sqrt(hd) ; dK = dS^T Q / sqrt(hd)
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  Gemm dq = batched(s, T, hd, T);
  dq.alpha = scale;
  cpu::gemm(dq, scratch.d_probs, saved.k, scratch.dq);
  Gemm dk = batched(s, T, hd, T);
  dk.trans_a = true;
  dk.alpha = scale;
  cpu::gemm(dk, scratch.d_probs, saved.q, scratch.dk);
  from_heads(s, scratch.dq, 3, 0, d_qkv);
  from_heads(s, scratch.dk, 3, 1, d_qkv);
  from_heads(s, scratch.dv, 3, 2, d_qkv);
}

}  // namespace dtrain::nn
