// AttentionOps (attention.h): what reads the shape, the group, and the products.
#include "nn/cuda/attention.h"

#include "nn/attention.h"
#include "nn/attention_steps.h"

namespace dtrain::nn::cuda {

template <DType D>
AttentionOps<D>::AttentionOps(Blas& blas, const AttentionShape& s, cudaStream_t stream,
                              const AttentionScratch<T>& scratch)
    : scratch_(&scratch), blas_(blas), stream_(stream), batch_(s.batch), heads_(s.heads), seq_(s.seq),
      head_dim_(s.head_dim), causal_(s.causal), cache_heads_(s.cache_heads()) {}

template <DType D>
AttentionGroup<typename AttentionOps<D>::T> AttentionOps<D>::group(const AttentionSaved<T>& saved) const {
  const AttentionScratch<T>& x = *scratch_;
  return AttentionGroup<T>{.pair0 = 0, .pairs = batch_ * heads_, .q = saved.q, .k = saved.k, .v = saved.v,
                           .lse = saved.lse, .scores = x.scores, .dp = x.dp, .probs = x.probs,
                           .d_scores = x.d_scores, .o = x.heads, .dq = x.dq, .dk = x.dk, .dv = x.dv};
}

template <DType D>
void AttentionOps<D>::gemm(const Gemm& g, const void* a, const void* b, void* c) {
  cuda::gemm(blas_, g, a, b, c, nullptr, stream_);
}

template <DType D>
void AttentionOps<D>::one_pass_forward(const AttentionSaved<T>& saved, const T* qkv, T* out) {
  const AttentionGroup<T> g = group(saved);
  gather(g, qkv, 3, 0, saved.q);
  gather(g, qkv, 3, 1, saved.k);
  gather(g, qkv, 3, 2, saved.v);
  launch_one_pass_forward(saved.q, saved.k, saved.v, out, saved.lse);
}

template <DType D>
void AttentionOps<D>::one_pass_backward(const AttentionSaved<T>& saved, const T* d_out, T* d_qkv, float* delta) {
  launch_one_pass_backward(saved.q, saved.k, saved.v, saved.lse, d_out, d_qkv, delta);
}

// The rest is in attention.cu.
template class AttentionOps<DType::f32>;
template class AttentionOps<DType::bf16>;
template class AttentionOps<DType::f16>;

}  // namespace dtrain::nn::cuda
