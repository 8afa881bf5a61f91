// Mixed-precision attention core (nn/attention.h gives the math): Q, K, V,
// the probabilities and every matmul operand are 16-bit (bf16 or f16);
// scores and their gradient dP are f32 so softmax and its backward compute
// in f32; products accumulate in f32 (oneDNN).
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "nn/attention.h"

namespace dtrain::nn {

// What forward keeps for backward (16-bit); owned by the caller.
struct AttentionSavedHalf {
  std::uint16_t* q;      // [B, H, T, hd]
  std::uint16_t* k;      // [B, H, T, hd]
  std::uint16_t* v;      // [B, H, T, hd]
  std::uint16_t* probs;  // [B, H, T, T]; masked entries are 0
};

// Scratch shared by all layers; owned by the caller.
struct AttentionScratchHalf {
  float* scores;            // [B, H, T, T] f32: forward's scores, backward's dP
  std::uint16_t* heads;     // [B, H, T, hd]: forward's O, backward's dO
  std::uint16_t* d_scores;  // [B, H, T, T]: dS (backward only)
  std::uint16_t* dq;        // [B, H, T, hd] (backward only)
  std::uint16_t* dk;
  std::uint16_t* dv;
};

// qkv: [B, T, 3, H, hd]; out: [B, T, H, hd]; all of `dtype`.
void attention_forward_half(const AttentionShape& shape, DType dtype, const std::uint16_t* qkv,
                            std::uint16_t* out, const AttentionSavedHalf& saved,
                            const AttentionScratchHalf& scratch);

// d_out: [B, T, H, hd]; d_qkv: [B, T, 3, H, hd], written; all of `dtype`.
void attention_backward_half(const AttentionShape& shape, DType dtype,
                             const std::uint16_t* d_out, std::uint16_t* d_qkv,
                             const AttentionSavedHalf& saved,
                             const AttentionScratchHalf& scratch);

}  // namespace dtrain::nn
