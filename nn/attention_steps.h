// The steps of the attention core (nn/attention.h), written once for every
// device: the head reshuffles, the five batched products and the softmax
// passes, in order, over a device's operations (nn/attention.cpp: oneDNN and
// the CPU loops; nn/cuda/attention.cpp: cuBLAS and the CUDA kernels). D is
// the storage format of Q, K, V, P and the products' operands, T its element
// type. Ops provides, for the shape it was made for:
//   gemm(const cpu::Gemm& g, const void* a, const void* b, void* c)
//   to_heads(const T* interleaved, parts, part, T* heads)    [B, T, parts, H, hd] -> [B, H, T, hd]
//   from_heads(const T* heads, parts, part, T* interleaved)  and back
//   softmax(float* scores, T* probs)                          per row, causal as the shape says
//   softmax_backward(const T* probs, const float* dp, T* d_scores)   dS = P * (dP - rowsum(P * dP))
#pragma once

#include <cmath>
#include <cstdint>

#include "nn/attention.h"
#include "nn/cpu/matmul.h"

namespace dtrain::nn {

// One product per (batch, head): [m, k] x [k, n] -> [m, n], op(A) / op(B) transposed as asked.
inline cpu::Gemm attention_gemm(const AttentionShape& s, DType operands, DType output, std::int64_t m,
                                std::int64_t n, std::int64_t k, bool trans_a = false, bool trans_b = false,
                                float alpha = 1.0f) {
  return cpu::Gemm{.m = m, .n = n, .k = k, .trans_a = trans_a, .trans_b = trans_b, .alpha = alpha,
                   .batch = s.batch * s.heads, .a_type = operands, .b_type = operands, .c_type = output};
}

template <DType D, class T, class Ops>
void attention_forward_steps(Ops& ops, const AttentionShape& s, const T* qkv, T* out, const AttentionSaved<T>& saved,
                             const AttentionScratch<T>& scratch) {
  for (int part = 0; part < 3; ++part) ops.to_heads(qkv, 3, part, part == 0 ? saved.q : part == 1 ? saved.k : saved.v);
  const std::int64_t t = s.seq, hd = s.head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  // S = Q K^T / sqrt(hd); P = softmax(S); O = P V
  ops.gemm(attention_gemm(s, D, DType::f32, t, t, hd, false, true, scale), saved.q, saved.k, scratch.scores);
  ops.softmax(scratch.scores, saved.probs);
  ops.gemm(attention_gemm(s, D, D, t, hd, t), saved.probs, saved.v, scratch.heads);
  ops.from_heads(scratch.heads, 1, 0, out);
}

template <DType D, class T, class Ops>
void attention_backward_steps(Ops& ops, const AttentionShape& s, const T* d_out, T* d_qkv,
                              const AttentionSaved<T>& saved, const AttentionScratch<T>& scratch) {
  ops.to_heads(d_out, 1, 0, scratch.heads);
  const std::int64_t t = s.seq, hd = s.head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  // dP = dO V^T; dV = P^T dO; dS = softmax'(dP); dQ = dS K / sqrt(hd); dK = dS^T Q / sqrt(hd)
  ops.gemm(attention_gemm(s, D, DType::f32, t, t, hd, false, true), scratch.heads, saved.v, scratch.scores);
  ops.gemm(attention_gemm(s, D, D, t, hd, t, true), saved.probs, scratch.heads, scratch.dv);
  ops.softmax_backward(saved.probs, scratch.scores, scratch.d_scores);
  ops.gemm(attention_gemm(s, D, D, t, hd, t, false, false, scale), scratch.d_scores, saved.k, scratch.dq);
  ops.gemm(attention_gemm(s, D, D, t, hd, t, true, false, scale), scratch.d_scores, saved.q, scratch.dk);
  for (int part = 0; part < 3; ++part) {
    ops.from_heads(part == 0 ? scratch.dq : part == 1 ? scratch.dk : scratch.dv, 3, part, d_qkv);
  }
}

}  // namespace dtrain::nn
