// The steps of the attention core (nn/attention.h), written once for every
// device: per group of (batch, head) pairs, the head gathers, then per tile
// of query rows the products and the softmax passes, over a device's
// operations (nn/attention.cpp: one pair and a block of rows at a time, small
// oneDNN products and CPU loops; nn/cuda/attention.cpp: every pair and row in
// one tile, cuBLAS batched products and CUDA kernels). D is the storage
// format of Q, K, V, P and the products' operands, T its element type.
//
// Forward, per tile (rows r0 .. r0 + rows of every pair in the group; keys
// 0 .. keys, which for a causal head stop at the tile's last row):
//   S = Q K^T / sqrt(hd);  P = softmax(S), lse = log-sum-exp of each row;  O = P V
// Backward recomputes P from S and lse, then
//   dP = dO V^T;  dV += P^T dO;  dS = P * (dP - rowsum(P * dP));
//   dQ = dS K / sqrt(hd);  dK += dS^T Q / sqrt(hd)
// with the tiles in reverse order, so that the first (the widest, keys = T)
// writes dK and dV and the others add to them. dQ, dK, dV accumulate in f32.
//
// Ops provides, for the shape it was made for:
//   query_block()                               rows per tile (T: one tile)
//   for_each_group(saved, backward, fn)         fn(const AttentionGroup<T>&) for every group of pairs
//   gather(g, interleaved, parts, part, heads)  [B, T, parts, H, hd] -> the group's [pairs, T, hd]
//   write_rows(g, tile, o, out)                 the tile's O [pairs, rows, hd] -> out [B, T, H, hd]
//   write_grads(g, d_qkv)                       the group's f32 dq, dk, dv -> d_qkv [B, T, 3, H, hd]
//   softmax(g, tile)                            g.probs = softmax(g.scores), g.lse for the tile's rows
//   probs(g, tile)                              g.probs = exp(g.scores - g.lse)
//   softmax_backward(g, tile)                   g.d_scores = P * (dP - rowsum(P * dP))
//   gemm(const cpu::Gemm& g, const void* a, const void* b, void* c)
// Masked entries (a causal row's later keys) of P and dS are 0.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "nn/attention.h"
#include "nn/attention_tile.h"
#include "nn/cpu/matmul.h"

namespace dtrain::nn {

// The tile of query block `i` of `block` rows.
inline AttentionTile attention_tile(const AttentionShape& s, std::int64_t block, std::int64_t i) {
  const std::int64_t row0 = i * block, rows = std::min(block, s.seq - row0);
  return {row0, rows, s.causal ? row0 + rows : s.seq};
}

// op(A) [m, k] x op(B) [k, n] -> C [m, n] for each pair of a group: A, B, C
// step by a, b, c elements from pair to pair (unused for one pair).
inline cpu::Gemm attention_gemm(std::int64_t pairs, DType operands, DType output, std::int64_t m, std::int64_t n,
                                std::int64_t k, bool trans_a, bool trans_b, std::int64_t a, std::int64_t b,
                                std::int64_t c, float alpha = 1.0f, bool accumulate = false) {
  cpu::Gemm g{.m = m, .n = n, .k = k, .trans_a = trans_a, .trans_b = trans_b, .accumulate = accumulate,
              .alpha = alpha, .batch = pairs, .a_type = operands, .b_type = operands, .c_type = output};
  if (pairs > 1) {
    g.stride_a = a;
    g.stride_b = b;
    g.stride_c = c;
  }
  return g;
}

template <DType D, class T, class Ops>
void attention_forward_tile(Ops& ops, const AttentionShape& s, const AttentionGroup<T>& g, const AttentionTile& t,
                            T* out) {
  const std::int64_t n = g.pairs, hd = s.head_dim, th = s.seq * hd, rk = t.rows * t.keys;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const T* q = g.q + t.row0 * hd;
  ops.gemm(attention_gemm(n, D, DType::f32, t.rows, t.keys, hd, false, true, th, th, rk, scale), q, g.k, g.scores);
  ops.softmax(g, t);
  ops.gemm(attention_gemm(n, D, D, t.rows, hd, t.keys, false, false, rk, th, t.rows * hd), g.probs, g.v, g.o);
  ops.write_rows(g, t, g.o, out);
}

template <DType D, class T, class Ops>
void attention_backward_tile(Ops& ops, const AttentionShape& s, const AttentionGroup<T>& g, const AttentionTile& t,
                             bool first) {
  const std::int64_t n = g.pairs, hd = s.head_dim, th = s.seq * hd, rk = t.rows * t.keys;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const T* q = g.q + t.row0 * hd;
  const T* d_o = g.o + t.row0 * hd;
  const bool add = !first;
  ops.gemm(attention_gemm(n, D, DType::f32, t.rows, t.keys, hd, false, true, th, th, rk, scale), q, g.k, g.scores);
  ops.probs(g, t);
  ops.gemm(attention_gemm(n, D, DType::f32, t.rows, t.keys, hd, false, true, th, th, rk), d_o, g.v, g.dp);
  ops.gemm(attention_gemm(n, D, DType::f32, t.keys, hd, t.rows, true, false, rk, th, th, 1.0f, add), g.probs, d_o,
           g.dv);
  ops.softmax_backward(g, t);
  ops.gemm(attention_gemm(n, D, DType::f32, t.rows, hd, t.keys, false, false, rk, th, th, scale), g.d_scores, g.k,
           g.dq + t.row0 * hd);
  ops.gemm(attention_gemm(n, D, DType::f32, t.keys, hd, t.rows, true, false, rk, th, th, scale, add), g.d_scores, q,
           g.dk);
}

template <DType D, class T, class Ops>
void attention_forward_steps(Ops& ops, const AttentionShape& s, const T* qkv, T* out, const AttentionSaved<T>& saved) {
  const std::int64_t block = ops.query_block(), tiles = (s.seq + block - 1) / block;
  ops.for_each_group(saved, false, [&](const AttentionGroup<T>& g) {
    ops.gather(g, qkv, 3, 0, g.q);
    ops.gather(g, qkv, 3, 1, g.k);
    ops.gather(g, qkv, 3, 2, g.v);
    for (std::int64_t i = 0; i < tiles; ++i) attention_forward_tile<D>(ops, s, g, attention_tile(s, block, i), out);
  });
}

template <DType D, class T, class Ops>
void attention_backward_steps(Ops& ops, const AttentionShape& s, const T* d_out, T* d_qkv,
                              const AttentionSaved<T>& saved) {
  const std::int64_t block = ops.query_block(), tiles = (s.seq + block - 1) / block;
  ops.for_each_group(saved, true, [&](const AttentionGroup<T>& g) {
    ops.gather(g, d_out, 1, 0, g.o);
    for (std::int64_t i = tiles - 1; i >= 0; --i) {
      attention_backward_tile<D>(ops, s, g, attention_tile(s, block, i), i == tiles - 1);
    }
    ops.write_grads(g, d_qkv);
  });
}

}  // namespace dtrain::nn
