// GPU heads between the QKV projection and attention (nn/rotary.h gives the
// layouts and the math): rotary positions and grouped-query heads, one
// function over the storage format D (arithmetic in f32). The shape is
// nn::HeadsShape's fields as plain numbers (the .cu cannot include
// nn/rotary.h). The rotary table (nn::rope_table, made on the host) is read
// from device memory. Device pointers; asynchronous on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "nn/cuda/format.h"

namespace dtrain::nn::cuda {

// packed [batch, seq, heads + 2 kv_heads, head_dim] -> qkv [batch, seq, 3,
// heads, head_dim]: q and k rotated at positions position + t, each key and
// value head repeated over its group of heads / kv_heads query heads.
// cos, sin: [positions, head_dim / 2] f32 from position 0, covering
// position + seq; or both null: no rotation.
// REQUIRES: kv_heads divides heads; head_dim even when rotating.
template <DType D>
void qkv_heads_forward(const Storage<D>* packed, Storage<D>* qkv, const float* cos, const float* sin,
                       std::int64_t batch, std::int64_t seq, std::int64_t heads, std::int64_t kv_heads,
                       std::int64_t head_dim, std::int64_t position, cudaStream_t stream);

// d_qkv [batch, seq, 3, heads, head_dim] -> d_packed [batch, seq, heads + 2
// kv_heads, head_dim] (written): a group's gradients of a repeated head
// summed in head order (f32), then rotated backwards. d_bias, when given:
// [(heads + 2 kv_heads) head_dim], added to: d_packed's column sums (f32,
// before rounding to D), rows in a fixed order (no atomics).
template <DType D>
void qkv_heads_backward(const Storage<D>* d_qkv, Storage<D>* d_packed, const float* cos, const float* sin,
                        float* d_bias, std::int64_t batch, std::int64_t seq, std::int64_t heads,
                        std::int64_t kv_heads, std::int64_t head_dim, std::int64_t position, cudaStream_t stream);

}  // namespace dtrain::nn::cuda
