// The GPU's operations for the attention core's steps (nn/attention_steps.h,
// the math and layouts in nn/attention.h) and for decoding with a key/value
// cache (nn::attention_cached), one class over the storage format
// D of Q, K, V, P and the products' operands: the batched products through
// cuda::gemm (cuBLAS, f32 accumulation; attention.cpp), the head reshuffles
// and the softmax passes, which compute in f32 (kernels in attention.cu).
// Device pointers; asynchronous on `stream`; `blas` is used by this thread only.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "nn/cuda/format.h"
#include "nn/cuda/matmul.h"

namespace dtrain::nn {
struct AttentionShape;
}  // namespace dtrain::nn

namespace dtrain::nn::cuda {

template <DType D>
class AttentionOps {
 public:
  using T = Storage<D>;
  AttentionOps(Blas& blas, const AttentionShape& shape, cudaStream_t stream);

  void gemm(const Gemm& g, const void* a, const void* b, void* c);
  // Part `part` of interleaved [B, T, parts, H, hd] to head-major [B, H, T, hd], and back.
  void to_heads(const T* interleaved, std::int64_t parts, std::int64_t part, T* heads);
  void from_heads(const T* heads, std::int64_t parts, std::int64_t part, T* interleaved);
  // probs = softmax(scores) per row of [B*H*T, T]; causal rows keep columns <= (row mod T), the rest are 0.
  // probs may alias scores (f32).
  void softmax(float* scores, T* probs);
  // d_scores = P * (dP - rowsum(P * dP)) per row; d_scores may alias dp (f32).
  void softmax_backward(const T* probs, const float* dp, T* d_scores);

  // nn::attention_cached (decoding one sequence, batch 1): the seq new rows
  // of qkv [seq, 3, H, hd] at positions first.. join k_cache and v_cache
  // ([H, capacity, hd]), then each row attends over the positions it sees
  // into out [seq, H, hd]: one block per (row, head), the row's scores in
  // shared memory (first + seq floats), arithmetic in the CPU's order.
  void cached(std::int64_t first, std::int64_t capacity, const T* qkv, T* k_cache, T* v_cache, T* out);

 private:
  void copy_heads(bool to_heads, T* interleaved, std::int64_t parts, std::int64_t part, T* heads);

  Blas& blas_;
  cudaStream_t stream_;
  std::int64_t batch_, heads_, seq_, head_dim_;
  bool causal_;
};

}  // namespace dtrain::nn::cuda
