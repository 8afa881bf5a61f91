// GPU multi-head self-attention core (nn/attention.h gives the math and the
// layouts): per (batch, head) S = Q K^T / sqrt(hd) (+ causal mask), P =
// softmax(S), O = P V, with the products batched through cuda::gemm and the
// same saved tensors and scratch structs as the CPU (their pointers here are
// device memory). Asynchronous on `stream`; `blas` is used by this thread only.
#pragma once

#include <cuda_runtime_api.h>

#include "nn/attention.h"
#include "nn/cuda/matmul.h"

namespace dtrain::nn::cuda {

// qkv: [B, T, 3, H, hd]; out: [B, T, H, hd]. Uses saved.{q,k,v,probs} and scratch.d_out.
void attention_forward(Blas& blas, const AttentionShape& shape, const float* qkv, float* out,
                       const AttentionSaved& saved, const AttentionScratch& scratch,
                       cudaStream_t stream);

// d_out: [B, T, H, hd]; d_qkv: [B, T, 3, H, hd], written. Uses every scratch buffer.
void attention_backward(Blas& blas, const AttentionShape& shape, const float* d_out, float* d_qkv,
                        const AttentionSaved& saved, const AttentionScratch& scratch,
                        cudaStream_t stream);

// The softmax steps on their own, [B*H*T, T] rows, for tests and fused callers.
// In place: causal rows keep columns <= (row mod T), the rest become 0.
void attention_softmax_forward(const AttentionShape& shape, float* probs, cudaStream_t stream);
// dS = P * (dP - rowsum(P * dP)), in place over d_probs.
void attention_softmax_backward(const AttentionShape& shape, const float* probs, float* d_probs,
                                cudaStream_t stream);

}  // namespace dtrain::nn::cuda
