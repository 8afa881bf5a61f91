// nn::cuda::CudaKernels<F>: the kernel set nn::Graph runs on a CudaDevice
// (nn/graph.h lists what a kernel set provides): the member functions of
// nn/cpu/host_kernels.h, attention_cached included (so the graph decodes on
// the GPU too), with device pointers, queued on the device's compute stream.
// Each is its CUDA layer (nn/cuda/*.h), or, where the CPU composes a layer
// from products (linear, attention, the patch embedding), the same
// composition: nn/linear.h's and nn/attention_steps.h's products through
// cuda::gemm (the device's cuBLAS handle) around the layer's kernels.
// F is the storage format of matmul operands and saved activations
// (nn::cpu::F32Format, Bf16Format, F16Format; only its DType is used here);
// a call's element type E (X, Y, D) has the format kFormatOf<E, kCompute>:
// f32 for float, F's for a 16-bit type.
//
// Threading: the device's submitting thread only.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include <fmt/format.h>

#include "core/cuda/check.h"
#include "core/error.h"
#include "nn/attention_steps.h"
#include "nn/cross_entropy.h"
#include "nn/cuda/attention.h"
#include "nn/cuda/convert.h"
#include "nn/cuda/cross_entropy.h"
#include "nn/cuda/cuda_device.h"
#include "nn/cuda/dropout.h"
#include "nn/cuda/embedding.h"
#include "nn/cuda/gelu.h"
#include "nn/cuda/layernorm.h"
#include "nn/cuda/linear.h"
#include "nn/cuda/residual.h"
#include "nn/cuda/rmsnorm.h"
#include "nn/cuda/rotary.h"
#include "nn/cuda/swiglu.h"
#include "nn/gelu_form.h"
#include "nn/layernorm.h"
#include "nn/linear.h"
#include "nn/rotary.h"

namespace dtrain::nn::cuda {

template <class F>
class CudaKernels {
 public:
  static constexpr DType kCompute = F::kDType;
  using T = Storage<kCompute>;

  explicit CudaKernels(CudaDevice& device) : blas_(&device.blas()), stream_(device.stream()) {}

  // cuBLAS reads every activation as stored: rows stay dense.
  static std::int64_t row_stride(std::int64_t cols, std::int64_t /*other*/) { return cols; }

  template <class E>
  void layernorm_forward(const float* x, const float* w, const float* b, E* y, float* mean, float* rstd,
                         std::int64_t n, std::int64_t c, float* x_copy = nullptr, float eps = kLayerNormEps) {
    cuda::layernorm_forward<format<E>>(x, w, b, y, mean, rstd, n, c, eps, x_copy, stream_);
  }
  // dx_sums (when given): dx's column sums, after the layernorm (the CPU's order is not kept).
  void layernorm_backward(const float* dy, const float* x, const float* w, const float* mean, const float* rstd,
                          float* dx, float* dw, float* db, std::int64_t n, std::int64_t c, bool accumulate_dx,
                          float* dx_sums = nullptr) {
    cuda::layernorm_backward(dy, x, w, mean, rstd, dx, dw, db, n, c, accumulate_dx, stream_);
    if (dx_sums == nullptr) return;
    DTRAIN_CUDA_CHECK(cudaMemsetAsync(dx_sums, 0, static_cast<std::size_t>(c) * sizeof(float), stream_));
    add_column_sums<DType::f32>(dx, dx_sums, n, c, stream_);
  }

  template <class E>
  void rmsnorm_forward(const float* x, const float* w, E* y, float* rstd, std::int64_t n, std::int64_t c, float eps,
                       float* x_copy = nullptr) {
    cuda::rmsnorm_forward<format<E>>(x, w, y, rstd, n, c, eps, x_copy, stream_);
  }
  void rmsnorm_backward(const float* dy, const float* x, const float* w, const float* rstd, float* dx, float* dw,
                        std::int64_t n, std::int64_t c, bool accumulate_dx) {
    cuda::rmsnorm_backward(dy, x, w, rstd, dx, dw, n, c, accumulate_dx, stream_);
  }

  // cos, sin: the rotary table (nn::rope_table's) in device memory, or both null.
  void qkv_heads_forward(const HeadsShape& s, const T* packed, T* qkv, const float* cos, const float* sin) {
    require_heads(s, cos, "qkv_heads_forward");
    cuda::qkv_heads_forward<kCompute>(packed, qkv, cos, sin, s.batch, s.seq, s.heads, s.kv_heads, s.head_dim,
                                      s.position, stream_);
  }
  void qkv_heads_backward(const HeadsShape& s, const T* d_qkv, T* d_packed, const float* cos, const float* sin,
                          float* d_bias = nullptr) {
    require_heads(s, cos, "qkv_heads_backward");
    cuda::qkv_heads_backward<kCompute>(d_qkv, d_packed, cos, sin, d_bias, s.batch, s.seq, s.heads, s.kv_heads,
                                       s.head_dim, s.position, stream_);
  }

  void swiglu_forward(const T* h, T* a, std::int64_t n, std::int64_t c, std::int64_t ld_h = 0,
                      std::int64_t ld_a = 0) {
    cuda::swiglu_forward<kCompute>(h, a, n, c, ld_h, ld_a, stream_);
  }
  void swiglu_backward(const T* da, const T* h, T* d_h, float* d_bias, std::int64_t n, std::int64_t c,
                       std::int64_t ld_a = 0, std::int64_t ld_h = 0) {
    cuda::swiglu_backward<kCompute>(da, h, d_h, d_bias, n, c, ld_a, ld_h, stream_);
  }

  // y (+)= x W^T + b: one product, the bias and the accumulation in its epilogue (nn/cuda/matmul.h).
  // cuBLAS reads W as stored: the weights' version is not needed.
  template <class X, class Y>
  void linear_forward(const X* x, const X* w, const float* b, Y* y, std::int64_t n, std::int64_t in,
                      std::int64_t out, bool accumulate, std::uint64_t /*w_version*/ = 0, LinearRows rows = {}) {
    gemm(*blas_, typed(linear_forward_gemm(n, in, out, accumulate, rows), format<X>, format<Y>), x, w, y, b,
         stream_);
  }
  // dx = dy W (unless null), dW += dy^T x, db += column sums of dy_f32 (when given) or of dy.
  // REQUIRES: dense rows of dy where db is given (row_stride() keeps them so).
  template <class X, class D>
  void linear_backward(const X* dy, const float* dy_f32, const X* x, const X* w, D* dx, float* dw, float* db,
                       std::int64_t n, std::int64_t in, std::int64_t out, std::uint64_t /*w_version*/ = 0,
                       LinearRows rows = {}) {
    if (db != nullptr) require_dense(rows.out, out, "linear_backward's bias gradient");  // before any work
    if (dx != nullptr) {
      gemm(*blas_, typed(linear_input_grad_gemm(n, in, out, false, rows), format<X>, format<D>), dy, w, dx,
           nullptr, stream_);
    }
    gemm(*blas_, typed(linear_weight_grad_gemm(n, in, out, rows), format<X>, DType::f32), dy, x, dw, nullptr,
         stream_);
    if (db == nullptr) return;
    if (dy_f32 != nullptr) return add_column_sums<DType::f32>(dy_f32, db, n, out, stream_);
    add_column_sums<format<X>>(dy, db, n, out, stream_);
  }

  // Every pair and row as one tile of the steps, through the whole-batch
  // scratch, or, where that scratch would be too large (gpu_attention_scratch:
  // the graph then allocates delta alone), the one-pass kernels.
  static AttentionScratchKind attention_scratch(std::int64_t pairs, std::int64_t seq, std::int64_t head_dim) {
    return gpu_attention_scratch(pairs, seq, head_dim);
  }
  void attention_forward(const AttentionShape& s, const T* qkv, T* out, const AttentionSaved<T>& saved,
                         const AttentionScratch<T>& scratch) {
    AttentionOps<kCompute> ops(*blas_, s, stream_, scratch);
    if (scratch.scores == nullptr) return ops.one_pass_forward(saved, qkv, out);
    attention_forward_steps<kCompute>(ops, s, qkv, out, saved);
  }
  // d_bias (when given): d_qkv's column sums, after the kernels (the CPU's order is not kept).
  void attention_backward(const AttentionShape& s, const T* d_out, T* d_qkv, const AttentionSaved<T>& saved,
                          const AttentionScratch<T>& scratch, float* d_bias = nullptr) {
    AttentionOps<kCompute> ops(*blas_, s, stream_, scratch);
    if (scratch.scores == nullptr) {
      ops.one_pass_backward(saved, d_out, d_qkv, scratch.delta);
    } else {
      attention_backward_steps<kCompute>(ops, s, d_out, d_qkv, saved);
    }
    if (d_bias != nullptr) add_column_sums<kCompute>(d_qkv, d_bias, s.batch * s.seq, 3 * s.d_model(), stream_);
  }
  // Decoding with a key/value cache; the scores stay in shared memory, so `scores` is not used.
  void attention_cached(const AttentionShape& s, std::int64_t first, std::int64_t capacity, const T* qkv,
                        T* k_cache, T* v_cache, T* out, float* /*scores*/) {
    AttentionOps<kCompute>(*blas_, s, stream_, {}).cached(first, capacity, qkv, k_cache, v_cache, out);
  }

  void gelu_forward(const T* x, T* y, T* dydx, std::int64_t n, GeluForm form = GeluForm::erf) {
    cuda::gelu_forward<kCompute>(x, y, dydx, n, form, stream_);
  }
  void gelu_backward(const T* dy, const T* dydx, T* dx, float* dbias, std::int64_t n, std::int64_t c,
                     std::int64_t ld = 0) {
    require_dense(ld, c, "gelu_backward");
    cuda::gelu_backward<kCompute>(dy, dydx, dx, dbias, n, c, stream_);
  }
  void to_storage(const float* x, T* y, std::int64_t n) { to_format<kCompute>(x, y, n, stream_); }

  void dropout(float* x, std::int64_t n, float p, std::uint64_t key) { dropout_apply(x, n, p, key, stream_); }
  void residual(const float* x, const float* branch, float* out, std::int64_t n) {
    cuda::residual(x, branch, out, n, stream_);
  }

  // vocab: the tokens were checked against it when the graph staged them.
  void token_embedding_forward(const std::int32_t* tokens, const float* table, const float* pos, float* out,
                               std::int64_t batch, std::int64_t seq, std::int64_t d, std::int64_t /*vocab*/) {
    cuda::token_embedding_forward(tokens, table, pos, out, batch, seq, d, stream_);
  }
  void token_embedding_backward(const std::int32_t* tokens, const float* d_out, float* d_table, float* d_pos,
                                std::int64_t batch, std::int64_t seq, std::int64_t d) {
    cuda::token_embedding_backward(tokens, d_out, d_table, d_pos, batch, seq, d, stream_);
  }
  // The patch embedding: a linear projection of every patch, then the positions.
  void patch_embedding_forward(const float* patches, const float* w, const float* b, const float* pos, float* out,
                               std::int64_t batch, std::int64_t seq, std::int64_t d, std::int64_t patch_dim) {
    linear_forward(patches, w, b, out, batch * seq, patch_dim, d, false);
    add_positions_forward(pos, out, batch, seq, d, stream_);
  }
  void patch_embedding_backward(const float* patches, const float* d_out, float* dw, float* db, float* d_pos,
                                std::int64_t batch, std::int64_t seq, std::int64_t d, std::int64_t patch_dim) {
    linear_backward(d_out, nullptr, patches, static_cast<const float*>(nullptr), static_cast<float*>(nullptr), dw,
                    db, batch * seq, patch_dim, d);
    add_positions_backward(d_out, d_pos, batch, seq, d, stream_);
  }
  void mean_pool_forward(const float* x, float* out, std::int64_t batch, std::int64_t seq, std::int64_t d) {
    cuda::mean_pool_forward(x, out, batch, seq, d, stream_);
  }
  void mean_pool_backward(const float* d_out, float* d_x, std::int64_t batch, std::int64_t seq, std::int64_t d) {
    cuda::mean_pool_backward(d_out, d_x, batch, seq, d, stream_);
  }

  void cross_entropy_forward(const float* logits, const std::int32_t* targets, float* probs, std::int64_t n,
                             std::int64_t v, CrossEntropyTotals* totals) {
    cuda::cross_entropy_forward(logits, targets, probs, n, v, totals, stream_);
  }
  void cross_entropy_backward(float* probs, const std::int32_t* targets, std::int64_t n, std::int64_t v,
                              float scale) {
    cuda::cross_entropy_backward(probs, targets, n, v, scale, stream_);
  }

 private:
  template <class E>
  static constexpr DType format = kFormatOf<E, kCompute>;

  // Row strides other than the width reach a kernel here only through a
  // caller's bug: the graph asks row_stride(), which is dense on the GPU.
  static void require_dense(std::int64_t ld, std::int64_t width, const char* what) {
    if (ld != 0 && ld != width) {
      throw Error(fmt::format("{}: rows {} elements apart, {} wide: the GPU kernels take dense rows only", what, ld,
                              width));
    }
  }

  // A head layout the kernels would read out of bounds with (or divide by
  // zero): refused before the launch, where the error still names the call.
  static void require_heads(const HeadsShape& s, const float* cos, const char* what) {
    if (s.kv_heads <= 0 || s.heads % s.kv_heads != 0 || (cos != nullptr && s.head_dim % 2 != 0)) {
      throw Error(fmt::format("{}: {} query heads over {} key/value heads of {} elements: the key/value heads must "
                              "divide the query heads, and a rotated head's size must be even",
                              what, s.heads, s.kv_heads, s.head_dim));
    }
  }

  Blas* blas_;
  cudaStream_t stream_;
};

}  // namespace dtrain::nn::cuda
