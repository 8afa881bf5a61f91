// Multi-head scaled dot-product self-attention core (the QKV and output
// projections are Linear layers around it): per head,
//   S = Q K^T / sqrt(head_dim) (+ causal mask),  P = softmax(S),  O = P V.
// The products are batched over (batch, head) through nn::cpu::gemm.
#pragma once

#include <cstdint>

namespace dtrain::nn {

struct AttentionShape {
  std::int64_t batch = 0, seq = 0, heads = 0, head_dim = 0;
  bool causal = false;
  std::int64_t d_model() const { return heads * head_dim; }
  std::int64_t head_elems() const { return batch * heads * seq * head_dim; }  // one of Q, K, V
  std::int64_t prob_elems() const { return batch * heads * seq * seq; }
};

// What forward keeps for backward; all owned by the caller.
struct AttentionSaved {
  float* q;      // [B, H, T, hd]
  float* k;      // [B, H, T, hd]
  float* v;      // [B, H, T, hd]
  float* probs;  // [B, H, T, T]; masked entries are 0
};

// Scratch for backward, shared by all layers; owned by the caller.
struct AttentionScratch {
  float* d_out;    // [B, H, T, hd]; also forward's O before it is interleaved
  float* d_probs;  // [B, H, T, T]
  float* dq;       // [B, H, T, hd]
  float* dk;       // [B, H, T, hd]
  float* dv;       // [B, H, T, hd]
};

// qkv: [B, T, 3, H, hd] (the fused projection's output); out: [B, T, H, hd].
void attention_forward(const AttentionShape& shape, const float* qkv, float* out,
                       const AttentionSaved& saved, const AttentionScratch& scratch);

// d_out: [B, T, H, hd]; d_qkv: [B, T, 3, H, hd], written.
void attention_backward(const AttentionShape& shape, const float* d_out, float* d_qkv,
                        const AttentionSaved& saved, const AttentionScratch& scratch);

}  // namespace dtrain::nn
