#include <cmath>

#include "nn/cuda/attention_half.h"
#include "nn/cuda/attention_kernels.cuh"
#include "nn/cuda/check.h"

namespace dtrain::nn::cuda {
namespace {

using detail::kBlock;
using Half = std::uint16_t;

void copy_heads(const AttentionShape& s, bool to_heads, Half* interleaved, std::int64_t parts,
                std::int64_t part, Half* heads, cudaStream_t stream) {
  if (to_heads) {
    detail::copy_heads_kernel<true>
        <<<detail::heads_grid(s), kBlock, 0, stream>>>(s, interleaved, parts, part, heads);
  } else {
    detail::copy_heads_kernel<false>
        <<<detail::heads_grid(s), kBlock, 0, stream>>>(s, interleaved, parts, part, heads);
  }
  DTRAIN_CUDA_LAUNCH_CHECK();
}

Gemm batched(const AttentionShape& s, DType dtype, DType c_type, std::int64_t m, std::int64_t n,
             std::int64_t k) {
  Gemm g;
  g.m = m;
  g.n = n;
  g.k = k;
  g.batch = s.batch * s.heads;
  g.a_type = g.b_type = dtype;
  g.c_type = c_type;
  return g;
}

void softmax(const AttentionShape& s, DType dtype, const float* scores, Half* probs,
             cudaStream_t stream) {
  if (dtype == DType::bf16) {
    detail::softmax_rows_kernel<detail::Bf16>
        <<<detail::softmax_grid(s), kBlock, 0, stream>>>(s, scores, probs);
  } else {
    detail::softmax_rows_kernel<detail::F16>
        <<<detail::softmax_grid(s), kBlock, 0, stream>>>(s, scores, probs);
  }
  DTRAIN_CUDA_LAUNCH_CHECK();
}

void softmax_backward(const AttentionShape& s, DType dtype, const Half* probs, const float* dp,
                      Half* ds, cudaStream_t stream) {
  if (dtype == DType::bf16) {
    detail::softmax_backward_rows_kernel<detail::Bf16>
        <<<detail::softmax_grid(s), kBlock, 0, stream>>>(s, probs, dp, ds);
  } else {
    detail::softmax_backward_rows_kernel<detail::F16>
        <<<detail::softmax_grid(s), kBlock, 0, stream>>>(s, probs, dp, ds);
  }
  DTRAIN_CUDA_LAUNCH_CHECK();
}

void require_shape(const AttentionShape& s, DType dtype) {
  DTRAIN_CUDA_REQUIRE(s.batch > 0 && s.seq > 0 && s.heads > 0 && s.head_dim > 0,
                      "attention: empty shape");
  DTRAIN_CUDA_REQUIRE(dtype == DType::bf16 || dtype == DType::f16, "dtype must be bf16 or f16");
}

}  // namespace

void attention_forward_half(Blas& blas, const AttentionShape& s, DType dtype, const Half* qkv,
                            Half* out, const AttentionSavedHalf& saved,
                            const AttentionScratchHalf& scratch, cudaStream_t stream) {
  require_shape(s, dtype);
  const std::int64_t T = s.seq, hd = s.head_dim;
  auto* src = const_cast<Half*>(qkv);  // only read in this direction
  copy_heads(s, true, src, 3, 0, saved.q, stream);
  copy_heads(s, true, src, 3, 1, saved.k, stream);
  copy_heads(s, true, src, 3, 2, saved.v, stream);
  Gemm scores = batched(s, dtype, DType::f32, T, T, hd);  // S = Q K^T / sqrt(hd)
  scores.trans_b = true;
  scores.alpha = 1.0f / std::sqrt(static_cast<float>(hd));
  gemm(blas, scores, saved.q, saved.k, scratch.scores, nullptr, stream);
  softmax(s, dtype, scratch.scores, saved.probs, stream);
  gemm(blas, batched(s, dtype, dtype, T, hd, T), saved.probs, saved.v, scratch.heads, nullptr,
       stream);  // O = P V
  copy_heads(s, false, out, 1, 0, scratch.heads, stream);
}

void attention_backward_half(Blas& blas, const AttentionShape& s, DType dtype, const Half* d_out,
                             Half* d_qkv, const AttentionSavedHalf& saved,
                             const AttentionScratchHalf& scratch, cudaStream_t stream) {
  require_shape(s, dtype);
  const std::int64_t T = s.seq, hd = s.head_dim;
  copy_heads(s, true, const_cast<Half*>(d_out), 1, 0, scratch.heads, stream);
  Gemm dp = batched(s, dtype, DType::f32, T, T, hd);  // dP = dO V^T
  dp.trans_b = true;
  gemm(blas, dp, scratch.heads, saved.v, scratch.scores, nullptr, stream);
  Gemm dv = batched(s, dtype, dtype, T, hd, T);  // dV = P^T dO
  dv.trans_a = true;
  gemm(blas, dv, saved.probs, scratch.heads, scratch.dv, nullptr, stream);
  softmax_backward(s, dtype, saved.probs, scratch.scores, scratch.d_scores, stream);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  Gemm dq = batched(s, dtype, dtype, T, hd, T);  // dQ = dS K / sqrt(hd)
  dq.alpha = scale;
  gemm(blas, dq, scratch.d_scores, saved.k, scratch.dq, nullptr, stream);
  Gemm dk = batched(s, dtype, dtype, T, hd, T);  // dK = dS^T Q / sqrt(hd)
  dk.trans_a = true;
  dk.alpha = scale;
  gemm(blas, dk, scratch.d_scores, saved.q, scratch.dk, nullptr, stream);
  copy_heads(s, false, d_qkv, 3, 0, scratch.dq, stream);
  copy_heads(s, false, d_qkv, 3, 1, scratch.dk, stream);
  copy_heads(s, false, d_qkv, 3, 2, scratch.dv, stream);
}

}  // namespace dtrain::nn::cuda
