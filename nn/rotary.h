// The heads between the QKV projection and attention's core, for rotary
// positions (RoPE) and grouped-query attention (GQA):
//   packed [B, T, H + 2 Hkv, hd]  (the projection's output: H query heads,
//                                  then Hkv key heads, then Hkv value heads)
//   qkv    [B, T, 3, H, hd]       (what attention_forward reads: query head
//                                  h uses key/value head h / (H / Hkv))
// Forward rotates q and k (when a rotary table is given) and repeats each
// key and value head over its group of H / Hkv query heads; backward
// undoes it: the group's gradients of a repeated head are summed (f32, in
// head order) and the rotation is applied backwards.
//
// The rotation is Hugging Face's LLaMA ("rotate half"): for a head vector x
// of hd elements, half = hd / 2, at position p, for i < half:
//   y[i]        = x[i] cos(p f_i) - x[i + half] sin(p f_i)
//   y[i + half] = x[i + half] cos(p f_i) + x[i] sin(p f_i)
// with f_i = theta^(-2i / hd); so weights imported from a LLaMA checkpoint
// need no permutation. Storage in format F; arithmetic in f32.
#pragma once

#include <cstdint>

#include "nn/cpu/convert.h"

namespace dtrain::nn {

struct HeadsShape {
  std::int64_t batch = 0, seq = 0;
  std::int64_t heads = 0;     // query heads H
  std::int64_t kv_heads = 0;  // key/value heads Hkv (divides H)
  std::int64_t head_dim = 0;  // even when rotating
  std::int64_t position = 0;  // the position of row t = 0 of every sequence (decoding: the cache's length)
  std::int64_t group() const { return heads / kv_heads; }
  std::int64_t packed_width() const { return (heads + 2 * kv_heads) * head_dim; }
};

// The rotary table: cos and sin, [positions, head_dim / 2] f32 each, of
// angle p * f_i computed in f32 as Hugging Face computes it (inv_freq =
// 1 / theta^(2i / hd) in f32, then p * inv_freq in f32).
void rope_table(double theta, std::int64_t head_dim, std::int64_t positions, float* cos, float* sin);

// packed -> qkv (layouts above). cos, sin: the rotary table (rows from
// position 0), or both null: no rotation (grouped-query attention alone).
template <class F = cpu::F32Format>
void qkv_heads_forward(const HeadsShape& shape, const typename F::T* packed, typename F::T* qkv, const float* cos,
                       const float* sin);

// d_qkv [B, T, 3, H, hd] -> d_packed [B, T, H + 2 Hkv, hd] (written): the
// gradient of qkv_heads_forward's input. d_bias, when given:
// [(H + 2 Hkv) hd], added to: d_packed's column sums (f32, before rounding
// to F; rows in order), the bias gradient of the projection.
template <class F = cpu::F32Format>
void qkv_heads_backward(const HeadsShape& shape, const typename F::T* d_qkv, typename F::T* d_packed,
                        const float* cos, const float* sin, float* d_bias = nullptr);

}  // namespace dtrain::nn
