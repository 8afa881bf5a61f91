// AttentionOps (attention.h): what reads the shape, and the products.
#include "nn/cuda/attention.h"

#include "nn/attention.h"

namespace dtrain::nn::cuda {

template <DType D>
AttentionOps<D>::AttentionOps(Blas& blas, const AttentionShape& s, cudaStream_t stream)
    : blas_(blas), stream_(stream), batch_(s.batch), heads_(s.heads), seq_(s.seq), head_dim_(s.head_dim),
      causal_(s.causal) {}

template <DType D>
void AttentionOps<D>::gemm(const Gemm& g, const void* a, const void* b, void* c) {
  cuda::gemm(blas_, g, a, b, c, nullptr, stream_);
}

// The rest is in attention.cu.
template class AttentionOps<DType::f32>;
template class AttentionOps<DType::bf16>;
template class AttentionOps<DType::f16>;

}  // namespace dtrain::nn::cuda
