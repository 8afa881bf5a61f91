// Multi-head scaled dot-product self-attention core (the QKV and output
// projections are Linear layers around it): per head,
//   S = Q K^T / sqrt(head_dim) (+ causal mask),  P = softmax(S),  O = P V.
// Written once over the storage format F of Q, K, V, P and every matmul
// operand (f32, or bf16/f16 with f32 accumulation); the scores S and their
// gradient dP are always f32, so softmax and its backward compute in f32.
// The products are batched over (batch, head) through nn::cpu::gemm.
#pragma once

#include <cstdint>

#include "nn/cpu/convert.h"

namespace dtrain::nn {

struct AttentionShape {
  std::int64_t batch = 0, seq = 0, heads = 0, head_dim = 0;
  bool causal = false;
  std::int64_t d_model() const { return heads * head_dim; }
  std::int64_t head_elems() const { return batch * heads * seq * head_dim; }  // one of Q, K, V
  std::int64_t prob_elems() const { return batch * heads * seq * seq; }
};

// What forward keeps for backward; all owned by the caller.
template <class T>
struct AttentionSaved {
  T* q;      // [B, H, T, hd]
  T* k;      // [B, H, T, hd]
  T* v;      // [B, H, T, hd]
  T* probs;  // [B, H, T, T]; masked entries are 0
};

// Scratch shared by all layers; owned by the caller. With f32 storage,
// scores may alias saved.probs and d_scores may alias scores (every kernel
// reads an element before it writes the aliased one).
template <class T>
struct AttentionScratch {
  float* scores;  // [B, H, T, T] f32: forward's scores, backward's dP
  T* heads;       // [B, H, T, hd]: forward's O, backward's dO
  T* d_scores;    // [B, H, T, T]: dS (backward only)
  T* dq;          // [B, H, T, hd] (backward only)
  T* dk;
  T* dv;
};

// qkv: [B, T, 3, H, hd] (the fused projection's output); out: [B, T, H, hd].
template <class F = cpu::F32Format>
void attention_forward(const AttentionShape& shape, const typename F::T* qkv, typename F::T* out,
                       const AttentionSaved<typename F::T>& saved,
                       const AttentionScratch<typename F::T>& scratch);

// d_out: [B, T, H, hd]; d_qkv: [B, T, 3, H, hd], written.
template <class F = cpu::F32Format>
void attention_backward(const AttentionShape& shape, const typename F::T* d_out, typename F::T* d_qkv,
                        const AttentionSaved<typename F::T>& saved,
                        const AttentionScratch<typename F::T>& scratch);

// Inference with a key/value cache (decoding one sequence): the shape's seq
// rows of qkv [seq, 3, H, hd] are positions first .. first + seq - 1; their
// keys and values are written into k_cache and v_cache ([H, capacity, hd])
// at those positions, and out [seq, H, hd] attends over the cached positions
// (causally: row i sees 0 .. first + i). scores: f32 scratch of capacity.
// REQUIRES: shape.batch == 1, first + shape.seq <= capacity.
template <class F = cpu::F32Format>
void attention_cached(const AttentionShape& shape, std::int64_t first, std::int64_t capacity,
                      const typename F::T* qkv, typename F::T* k_cache, typename F::T* v_cache, typename F::T* out,
                      float* scores);

}  // namespace dtrain::nn
