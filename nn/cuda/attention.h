// The GPU's operations for the attention core's steps (nn/attention_steps.h,
// the math and layouts in nn/attention.h) and for decoding with a key/value
// cache (nn::attention_cached), one class over the storage format
// D of Q, K, V, P and the products' operands: every (batch, head) pair and
// query row as one tile, the batched products through cuda::gemm (cuBLAS,
// f32 accumulation; attention.cpp) over the whole-batch scratch, the head
// gathers and the softmax passes, which compute in f32 (kernels in
// attention.cu). Device pointers; asynchronous on `stream`; `blas` is used by
// this thread only.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "nn/attention_tile.h"
#include "nn/cuda/format.h"
#include "nn/cuda/matmul.h"

namespace dtrain::nn {
struct AttentionShape;
template <class T>
struct AttentionSaved;
template <class T>
struct AttentionScratch;
}  // namespace dtrain::nn

namespace dtrain::nn::cuda {

template <DType D>
class AttentionOps {
 public:
  using T = Storage<D>;
  // scratch: the whole-batch buffers, which must outlive this object (unused by cached()).
  AttentionOps(Blas& blas, const AttentionShape& shape, cudaStream_t stream, const AttentionScratch<T>& scratch);

  std::int64_t query_block() const { return seq_; }
  // fn(group) once, for every pair.
  template <class Fn>
  void for_each_group(const AttentionSaved<T>& saved, bool backward, Fn fn) {
    (void)backward;
    fn(group(saved));
  }
  void gemm(const Gemm& g, const void* a, const void* b, void* c);
  // Part `part` of interleaved [B, T, parts, H, hd] to head-major [B, H, T, hd].
  void gather(const AttentionGroup<T>& g, const T* interleaved, std::int64_t parts, std::int64_t part, T* heads);
  // The tile's O [B, H, T, hd] (every row) to out [B, T, H, hd].
  void write_rows(const AttentionGroup<T>& g, const AttentionTile& tile, const T* o, T* out);
  // f32 dq, dk, dv [B, H, T, hd] to d_qkv [B, T, 3, H, hd] in storage.
  void write_grads(const AttentionGroup<T>& g, T* d_qkv);
  // probs = softmax(scores) per row of [B*H*T, T], lse its log-sum-exp;
  // causal rows keep columns <= (row mod T), the rest are 0. probs may alias scores (f32).
  void softmax(const AttentionGroup<T>& g, const AttentionTile& tile);
  // probs = exp(scores - lse), masked as softmax; may alias scores (f32).
  void probs(const AttentionGroup<T>& g, const AttentionTile& tile);
  // d_scores = P * (dP - rowsum(P * dP)) per row; d_scores may alias dp (f32).
  void softmax_backward(const AttentionGroup<T>& g, const AttentionTile& tile);

  // The attention core in one pass per (pair, block of 64 query rows), for
  // head dims up to kOnePassMaxHeadDim (nn/attention.h): forward gathers q, k,
  // v into `saved`, then an online softmax over key tiles in shared memory
  // writes out [B, T, H, hd] and saved.lse; backward recomputes P from lse,
  // one kernel for dQ and delta = rowsum(P * dP) (two passes over the keys),
  // one for dK and dV (a thread per key row over the query rows that see it),
  // writing d_qkv [B, T, 3, H, hd]. f32 arithmetic; no [T, T] tensor and no
  // scratch but delta [B, H, T] f32; causal blocks stop at the diagonal;
  // fixed order, no atomics: deterministic.
  void one_pass_forward(const AttentionSaved<T>& saved, const T* qkv, T* out);
  void one_pass_backward(const AttentionSaved<T>& saved, const T* d_out, T* d_qkv, float* delta);

  // nn::attention_cached (decoding one sequence, batch 1): the seq new rows
  // of qkv [seq, 3, H, hd] at positions first.. join k_cache and v_cache
  // ([Hkv, capacity, hd]: one head per group of grouped-query attention), then each row attends over the positions it sees
  // into out [seq, H, hd]: one block per (row, head), the row's scores in
  // shared memory (first + seq floats), arithmetic in the CPU's order.
  void cached(std::int64_t first, std::int64_t capacity, const T* qkv, T* k_cache, T* v_cache, T* out);

 private:
  AttentionGroup<T> group(const AttentionSaved<T>& saved) const;
  // The one-pass kernels (attention.cu).
  void launch_one_pass_forward(const T* q, const T* k, const T* v, T* out, float* lse);
  void launch_one_pass_backward(const T* q, const T* k, const T* v, const float* lse, const T* d_out, T* d_qkv,
                                float* delta);

  const AttentionScratch<T>* scratch_;

  Blas& blas_;
  cudaStream_t stream_;
  std::int64_t batch_, heads_, seq_, head_dim_;
  bool causal_;
  std::int64_t cache_heads_;  // the key/value cache's heads (AttentionShape::cache_heads)
};

}  // namespace dtrain::nn::cuda
