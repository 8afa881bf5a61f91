// GPU mixed-precision attention core (nn/attention_half.h gives the math and
// buffers): Q, K, V, the probabilities and every matmul operand are 16-bit
// (bf16 or f16); scores and dP are f32 so softmax and its backward compute in
// f32; products accumulate in f32 (cuBLAS). Same structs as the CPU, with
// device pointers. Asynchronous on `stream`; `blas` is used by this thread only.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"
#include "nn/attention_half.h"
#include "nn/cuda/matmul.h"

namespace dtrain::nn::cuda {

// qkv: [B, T, 3, H, hd]; out: [B, T, H, hd]; all of `dtype`.
void attention_forward_half(Blas& blas, const AttentionShape& shape, DType dtype,
                            const std::uint16_t* qkv, std::uint16_t* out,
                            const AttentionSavedHalf& saved, const AttentionScratchHalf& scratch,
                            cudaStream_t stream);

// d_out: [B, T, H, hd]; d_qkv: [B, T, 3, H, hd], written; all of `dtype`.
void attention_backward_half(Blas& blas, const AttentionShape& shape, DType dtype,
                             const std::uint16_t* d_out, std::uint16_t* d_qkv,
                             const AttentionSavedHalf& saved, const AttentionScratchHalf& scratch,
                             cudaStream_t stream);

}  // namespace dtrain::nn::cuda
