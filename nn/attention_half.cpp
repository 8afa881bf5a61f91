#include "nn/attention_half.h"

#include <cmath>
#include <cstring>

#include "nn/cpu/convert.h"
#include "nn/cpu/matmul.h"
#include "nn/cpu/parallel.h"
#include "nn/cpu/vec_math.h"

namespace dtrain::nn {

using cpu::Gemm;

namespace {

using Half = std::uint16_t;

// Part `part` of an interleaved [B, T, parts, H, hd] buffer to head-major
// [B, H, T, hd] (to_heads) or back (from_heads); dense operands keep oneDNN
// on brgemm.
void copy_heads(const AttentionShape& s, bool to_heads, Half* interleaved, std::int64_t parts,
                std::int64_t part, Half* heads) {
  const std::int64_t hd = s.head_dim;
  const std::int64_t row = parts * s.d_model();
  const auto bytes = static_cast<std::size_t>(hd) * sizeof(Half);
#pragma omp parallel for collapse(2) schedule(static) if (s.head_elems() >= kParallelMin)
  for (std::int64_t b = 0; b < s.batch; ++b) {
    for (std::int64_t h = 0; h < s.heads; ++h) {
      for (std::int64_t t = 0; t < s.seq; ++t) {
        Half* inter = interleaved + (b * s.seq + t) * row + part * s.d_model() + h * hd;
        Half* head = heads + ((b * s.heads + h) * s.seq + t) * hd;
        if (to_heads) {
          std::memcpy(head, inter, bytes);
        } else {
          std::memcpy(inter, head, bytes);
        }
      }
    }
  }
}

Gemm batched(const AttentionShape& s, DType dtype, DType c_type, std::int64_t m, std::int64_t n,
             std::int64_t k) {
  Gemm g;
  g.m = m;
  g.n = n;
  g.k = k;
  g.batch = s.batch * s.heads;
  g.a_type = g.b_type = dtype;
  g.c_type = c_type;
  return g;
}

// p = softmax(scores) row-wise, stored 16-bit; causal rows keep columns <= i.
template <class F>
void softmax_rows(const AttentionShape& s, const float* scores, Half* p) {
  const std::int64_t T = s.seq;
  const std::int64_t rows = s.batch * s.heads * T;
#pragma omp parallel for schedule(static) if (rows * T >= kParallelMin)
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* in = scores + r * T;
    Half* row = p + r * T;
    const std::int64_t valid = s.causal ? (r % T) + 1 : T;
    float e[1024];  // T <= 1024 is checked by the caller; keeps the exps in f32
    float mx = in[0];
    for (std::int64_t j = 1; j < valid; ++j) mx = in[j] > mx ? in[j] : mx;
    float sum = 0.0f;
    for (std::int64_t j = 0; j < valid; ++j) {
      e[j] = cpu::fast_exp(in[j] - mx);
      sum += e[j];
    }
    const float inv = 1.0f / sum;
    for (std::int64_t j = 0; j < valid; ++j) row[j] = F::store(e[j] * inv);
    for (std::int64_t j = valid; j < T; ++j) row[j] = 0;
  }
}

// dS = P * (dP - rowsum(P * dP)), stored 16-bit.
template <class F>
void softmax_backward_rows(const AttentionShape& s, const Half* p, const float* dp, Half* ds) {
  const std::int64_t T = s.seq;
  const std::int64_t rows = s.batch * s.heads * T;
#pragma omp parallel for schedule(static) if (rows * T >= kParallelMin)
  for (std::int64_t r = 0; r < rows; ++r) {
    const Half* pr = p + r * T;
    const float* dr = dp + r * T;
    Half* out = ds + r * T;
    float dot = 0.0f;
    for (std::int64_t j = 0; j < T; ++j) dot += F::load(pr[j]) * dr[j];
    for (std::int64_t j = 0; j < T; ++j) out[j] = F::store(F::load(pr[j]) * (dr[j] - dot));
  }
}

}  // namespace

void attention_forward_half(const AttentionShape& s, DType dtype, const Half* qkv, Half* out,
                            const AttentionSavedHalf& saved,
                            const AttentionScratchHalf& scratch) {
  const std::int64_t T = s.seq, hd = s.head_dim;
  DTRAIN_CHECK(T <= 1024, "mixed-precision attention supports sequences up to 1024, got {}", T);
  auto* src = const_cast<Half*>(qkv);  // only read in this direction
  copy_heads(s, true, src, 3, 0, saved.q);
  copy_heads(s, true, src, 3, 1, saved.k);
  copy_heads(s, true, src, 3, 2, saved.v);
  Gemm scores = batched(s, dtype, DType::f32, T, T, hd);  // S = Q K^T / sqrt(hd)
  scores.trans_b = true;
  scores.alpha = 1.0f / std::sqrt(static_cast<float>(hd));
  cpu::gemm(scores, static_cast<const void*>(saved.q), saved.k, scratch.scores);
  cpu::with_half_format(dtype, [&](auto f) {
    softmax_rows<decltype(f)>(s, scratch.scores, saved.probs);
  });
  cpu::gemm(batched(s, dtype, dtype, T, hd, T), static_cast<const void*>(saved.probs), saved.v,
            scratch.heads);  // O = P V
  copy_heads(s, false, out, 1, 0, scratch.heads);
}

void attention_backward_half(const AttentionShape& s, DType dtype, const Half* d_out,
                             Half* d_qkv, const AttentionSavedHalf& saved,
                             const AttentionScratchHalf& scratch) {
  const std::int64_t T = s.seq, hd = s.head_dim;
  copy_heads(s, true, const_cast<Half*>(d_out), 1, 0, scratch.heads);
  Gemm dp = batched(s, dtype, DType::f32, T, T, hd);  // dP = dO V^T
  dp.trans_b = true;
  cpu::gemm(dp, static_cast<const void*>(scratch.heads), saved.v, scratch.scores);
  Gemm dv = batched(s, dtype, dtype, T, hd, T);  // dV = P^T dO
  dv.trans_a = true;
  cpu::gemm(dv, static_cast<const void*>(saved.probs), scratch.heads, scratch.dv);
  cpu::with_half_format(dtype, [&](auto f) {
    softmax_backward_rows<decltype(f)>(s, saved.probs, scratch.scores, scratch.d_scores);
  });
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  Gemm dq = batched(s, dtype, dtype, T, hd, T);  // dQ = dS K / sqrt(hd)
  dq.alpha = scale;
  cpu::gemm(dq, static_cast<const void*>(scratch.d_scores), saved.k, scratch.dq);
  Gemm dk = batched(s, dtype, dtype, T, hd, T);  // dK = dS^T Q / sqrt(hd)
  dk.trans_a = true;
  dk.alpha = scale;
  cpu::gemm(dk, static_cast<const void*>(scratch.d_scores), saved.q, scratch.dk);
  copy_heads(s, false, d_qkv, 3, 0, scratch.dq);
  copy_heads(s, false, d_qkv, 3, 1, scratch.dk);
  copy_heads(s, false, d_qkv, 3, 2, scratch.dv);
}

}  // namespace dtrain::nn
