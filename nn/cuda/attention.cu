#include <cmath>

#include "nn/cuda/attention.h"
#include "nn/cuda/attention_kernels.cuh"
#include "nn/cuda/check.h"

namespace dtrain::nn::cuda {
namespace {

using detail::kBlock;

void to_heads(const AttentionShape& s, const float* src, std::int64_t parts, std::int64_t part,
              float* dst, cudaStream_t stream) {
  // Only read in this direction.
  detail::copy_heads_kernel<true>
      <<<detail::heads_grid(s), kBlock, 0, stream>>>(s, const_cast<float*>(src), parts, part, dst);
  DTRAIN_CUDA_LAUNCH_CHECK();
}

void from_heads(const AttentionShape& s, const float* src, std::int64_t parts, std::int64_t part,
                float* dst, cudaStream_t stream) {
  detail::copy_heads_kernel<false>
      <<<detail::heads_grid(s), kBlock, 0, stream>>>(s, dst, parts, part, const_cast<float*>(src));
  DTRAIN_CUDA_LAUNCH_CHECK();
}

Gemm batched(const AttentionShape& s, std::int64_t m, std::int64_t n, std::int64_t k) {
  Gemm g;
  g.m = m;
  g.n = n;
  g.k = k;
  g.batch = s.batch * s.heads;
  return g;
}

}  // namespace

void attention_softmax_forward(const AttentionShape& s, float* probs, cudaStream_t stream) {
  detail::softmax_rows_kernel<detail::F32>
      <<<detail::softmax_grid(s), kBlock, 0, stream>>>(s, probs, probs);
  DTRAIN_CUDA_LAUNCH_CHECK();
}

void attention_softmax_backward(const AttentionShape& s, const float* probs, float* d_probs,
                                cudaStream_t stream) {
  detail::softmax_backward_rows_kernel<detail::F32>
      <<<detail::softmax_grid(s), kBlock, 0, stream>>>(s, probs, d_probs, d_probs);
  DTRAIN_CUDA_LAUNCH_CHECK();
}

void attention_forward(Blas& blas, const AttentionShape& s, const float* qkv, float* out,
                       const AttentionSaved& saved, const AttentionScratch& scratch,
                       cudaStream_t stream) {
  DTRAIN_CUDA_REQUIRE(s.batch > 0 && s.seq > 0 && s.heads > 0 && s.head_dim > 0,
                      "attention: empty shape");
  const std::int64_t T = s.seq, hd = s.head_dim;
  to_heads(s, qkv, 3, 0, saved.q, stream);
  to_heads(s, qkv, 3, 1, saved.k, stream);
  to_heads(s, qkv, 3, 2, saved.v, stream);
  // S[T, T] = Q K^T / sqrt(hd)
  Gemm scores = batched(s, T, T, hd);
  scores.trans_b = true;
  scores.alpha = 1.0f / std::sqrt(static_cast<float>(hd));
  gemm(blas, scores, saved.q, saved.k, saved.probs, nullptr, stream);
  attention_softmax_forward(s, saved.probs, stream);
  // O[T, hd] = P V
  gemm(blas, batched(s, T, hd, T), saved.probs, saved.v, scratch.d_out, nullptr, stream);
  from_heads(s, scratch.d_out, 1, 0, out, stream);
}

void attention_backward(Blas& blas, const AttentionShape& s, const float* d_out, float* d_qkv,
                        const AttentionSaved& saved, const AttentionScratch& scratch,
                        cudaStream_t stream) {
  DTRAIN_CUDA_REQUIRE(s.batch > 0 && s.seq > 0 && s.heads > 0 && s.head_dim > 0,
                      "attention: empty shape");
  const std::int64_t T = s.seq, hd = s.head_dim;
  to_heads(s, d_out, 1, 0, scratch.d_out, stream);
  // dP[T, T] = dO V^T ; dV[T, hd] = P^T dO
  Gemm dp = batched(s, T, T, hd);
  dp.trans_b = true;
  gemm(blas, dp, scratch.d_out, saved.v, scratch.d_probs, nullptr, stream);
  Gemm dv = batched(s, T, hd, T);
  dv.trans_a = true;
  gemm(blas, dv, saved.probs, scratch.d_out, scratch.dv, nullptr, stream);
  attention_softmax_backward(s, saved.probs, scratch.d_probs, stream);
  // dQ = dS K / sqrt(hd) ; dK = dS^T Q / sqrt(hd)
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  Gemm dq = batched(s, T, hd, T);
  dq.alpha = scale;
  gemm(blas, dq, scratch.d_probs, saved.k, scratch.dq, nullptr, stream);
  Gemm dk = batched(s, T, hd, T);
  dk.trans_a = true;
  dk.alpha = scale;
  gemm(blas, dk, scratch.d_probs, saved.q, scratch.dk, nullptr, stream);
  from_heads(s, scratch.dq, 3, 0, d_qkv, stream);
  from_heads(s, scratch.dk, 3, 1, d_qkv, stream);
  from_heads(s, scratch.dv, 3, 2, d_qkv, stream);
}

}  // namespace dtrain::nn::cuda
