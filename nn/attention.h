// Multi-head scaled dot-product self-attention core (the QKV and output
// projections are Linear layers around it): per head,
//   S = Q K^T / sqrt(head_dim) (+ causal mask),  P = softmax(S),  O = P V.
// Written once over the storage format F of Q, K, V, P and every matmul
// operand (f32, or bf16/f16 with f32 accumulation); the scores S and their
// gradient dP are always f32, so softmax and its backward compute in f32.
// No [B, H, T, T] tensor outlives a call: forward keeps each row's
// log-sum-exp, and backward recomputes P = exp(S - lse) from Q and K. The
// CPU works one (batch, head) pair and one block of query rows at a time
// (nn/attention_steps.h), the pairs spread over OpenMP threads.
#pragma once

#include <cstdint>

#include "nn/attention_tile.h"
#include "nn/cpu/convert.h"

namespace dtrain::nn {

struct AttentionShape {
  std::int64_t batch = 0, seq = 0, heads = 0, head_dim = 0;
  bool causal = false;
  // Key/value heads of grouped-query attention (0: heads). Only the
  // key/value cache of decoding keeps them apart (attention_cached); the
  // other kernels see every query head's keys and values (nn/rotary.h
  // repeats them).
  std::int64_t kv_heads = 0;
  std::int64_t group() const { return kv_heads > 0 ? heads / kv_heads : 1; }
  std::int64_t cache_heads() const { return kv_heads > 0 ? kv_heads : heads; }
  std::int64_t d_model() const { return heads * head_dim; }
  std::int64_t pairs() const { return batch * heads; }                      // (batch, head) pairs
  std::int64_t head_elems() const { return batch * heads * seq * head_dim; }  // one of Q, K, V
  std::int64_t row_elems() const { return batch * heads * seq; }             // one value per query row
  std::int64_t score_elems() const { return batch * heads * seq * seq; }     // S for every pair at once
};

// What forward keeps for backward; all owned by the caller. Q, K and V hold
// every pair's rows, [pairs, T, hd], in the order the device's kernels chose:
// the CPU's is [H, B, T, hd] (one head's rows of the whole batch form a dense
// [B * T, hd] matrix, which attention_project's products write directly),
// the GPU's [B, H, T, hd].
template <class T>
struct AttentionSaved {
  T* q;        // [pairs, T, hd]
  T* k;        // [pairs, T, hd]
  T* v;        // [pairs, T, hd]
  float* lse;  // [B, H, T]: log(sum_j exp(S_ij)) of each query row i
};

// Scratch shared by all layers, owned by the caller, for a device that runs
// every pair as one batch (the GPU); the CPU keeps its small tiles per thread
// and takes no scratch (any pointer may be null); the GPU's one-pass kernels
// use only delta. With f32 storage, probs may alias scores and d_scores may
// alias dp.
template <class T>
struct AttentionScratch {
  float* scores;   // [B, H, T, T] f32: S
  float* dp;       // [B, H, T, T] f32: dP (backward only)
  T* probs;        // [B, H, T, T]: P
  T* d_scores;     // [B, H, T, T]: dS (backward only)
  T* heads;        // [B, H, T, hd]: forward's O, backward's dO
  float* dq;       // [B, H, T, hd] f32 (backward only)
  float* dk;
  float* dv;
  float* delta;    // [B, H, T] f32: rowsum(P * dP) of each query row (backward of the one-pass kernels)
};

// qkv: [B, T, 3, H, hd] (the fused projection's output), gathered into
// saved's heads; or null when attention_project has written them already.
// out: [B, T, H, hd].
// Threading: splits the pairs across the calling thread's OpenMP threads;
// each pair is computed by one thread in a fixed order, so the result does
// not depend on the thread count.
template <class F = cpu::F32Format>
void attention_forward(const AttentionShape& shape, const typename F::T* qkv, typename F::T* out,
                       const AttentionSaved<typename F::T>& saved);

// The fused projection qkv = x W^T + b (x: [B * T, d], W: [3d, d] with the
// rows of Q, K, V in head order, b: [3d] or null) written straight into
// saved's q, k, v, for attention_forward with qkv null: one product per part
// and head, [B * T, d] x [d, hd], each writing that head's dense [B * T, hd]
// (as fast as the one [B * T, 3d] product, and no gather after it).
// w_version: as for linear_forward. Timed as its products (gemm).
template <class F = cpu::F32Format>
void attention_project(const AttentionShape& shape, const typename F::T* x, const typename F::T* w,
                       const float* b, std::uint64_t w_version, const AttentionSaved<typename F::T>& saved);

// d_out: [B, T, H, hd], gathered into heads; or null with d_out_heads, the
// same in saved's layout (attention_output_grad). d_qkv: [B, T, 3, H, hd],
// written. d_bias, when
// given: [3, H, hd], added to: d_qkv's column sums (as stored, widened to
// f32), the bias gradient of the projection that made qkv, taken while the
// gradients are scattered (each pair's rows in order, then the pairs in
// batch order: fixed, whatever the thread count).
template <class F = cpu::F32Format>
void attention_backward(const AttentionShape& shape, const typename F::T* d_out, typename F::T* d_qkv,
                        const AttentionSaved<typename F::T>& saved, float* d_bias = nullptr,
                        typename F::T* d_out_heads = nullptr);

// Backward's counterpart of attention_project: the gradient of attention's
// output, d_out = dy W (dy: [B * T, d], the gradient of the output
// projection y = out W^T + b, W: [d, d]), written in saved's layout as
// d_out_heads for attention_backward: one product per head, dy times W's
// columns of that head. w_version: as for linear_backward.
template <class F = cpu::F32Format>
void attention_output_grad(const AttentionShape& shape, const typename F::T* dy, const typename F::T* w,
                           std::uint64_t w_version, typename F::T* d_out_heads);

// Inference with a key/value cache (decoding one sequence): the shape's seq
// rows of qkv [seq, 3, H, hd] are positions first .. first + seq - 1; their
// keys and values are written into k_cache and v_cache ([Hkv, capacity, hd],
// Hkv = shape.cache_heads(): under grouped-query attention one head per
// group, the group's first, which qkv repeats over the group) at those
// positions, and out [seq, H, hd] attends over the cached positions
// (causally: row i sees 0 .. first + i; head h reads cache head
// h / shape.group()). scores: f32 scratch of capacity.
// REQUIRES: shape.batch == 1, first + shape.seq <= capacity.
template <class F = cpu::F32Format>
void attention_cached(const AttentionShape& shape, std::int64_t first, std::int64_t capacity,
                      const typename F::T* qkv, typename F::T* k_cache, typename F::T* v_cache, typename F::T* out,
                      float* scores);

}  // namespace dtrain::nn
