// nn::cpu::HostKernels<F>: the kernel set nn::Graph runs on a HostDevice
// (nn/graph.h lists what a kernel set provides): each call is the CPU
// function of nn/ of the same name, run inline or queued by the device. F is
// the storage format of matmul operands and saved activations
// (F32Format, Bf16Format, F16Format; nn/cpu/convert.h).
//
// Each call is timed as one kernel of its kind with the bytes it moves
// (nn/cpu/kernel_profile.h: every operand read once, every result written
// once); a linear's and attention's parts time themselves (GEMMs, bias
// gradient, attention's tile loops).
#pragma once

#include <type_traits>

#include "nn/attention.h"
#include "nn/cpu/convert.h"
#include "nn/cpu/host_device.h"
#include "nn/cpu/kernel_profile.h"
#include "nn/cross_entropy.h"
#include "nn/dropout.h"
#include "nn/embedding.h"
#include "nn/gelu.h"
#include "nn/layernorm.h"
#include "nn/linear.h"
#include "nn/rmsnorm.h"
#include "nn/rotary.h"
#include "nn/swiglu.h"

namespace dtrain::nn::cpu {

template <class F>
class HostKernels {
 public:
  using T = typename F::T;
  static constexpr DType kCompute = F::kDType;

  explicit HostKernels(HostDevice& device) : dev_(&device) {}

  // The row stride of the d_ff-wide activations (cols wide, multiplied with
  // other-wide ones), which weight gradients read down their columns: padded
  // where oneDNN's sgemm would otherwise copy them (cpu::activation_row_stride).
  static std::int64_t row_stride(std::int64_t cols, std::int64_t other) {
    return activation_row_stride(cols, other, kCompute);
  }

  // x, w, b read; y, mean, rstd (and x_copy, when given) written.
  template <class E>
  void layernorm_forward(const float* x, const float* w, const float* b, E* y, float* mean, float* rstd,
                         std::int64_t n, std::int64_t c, float* x_copy = nullptr, float eps = kLayerNormEps) {
    const double bytes = f32((x_copy != nullptr ? 2 : 1) * n * c + 2 * c + 2 * n) + elements<E>(n * c);
    dev_->run(KernelKind::layernorm_forward, bytes,
              [=] { nn::layernorm_forward<Fmt<E>>(x, w, b, y, mean, rstd, n, c, x_copy, eps); });
  }
  // dy, x, w, mean, rstd read; dx written (and read when accumulated); dw, db updated; dx_sums written.
  void layernorm_backward(const float* dy, const float* x, const float* w, const float* mean, const float* rstd,
                          float* dx, float* dw, float* db, std::int64_t n, std::int64_t c, bool accumulate_dx,
                          float* dx_sums = nullptr) {
    const double bytes = f32((accumulate_dx ? 4 : 3) * n * c + 6 * c + 2 * n);
    dev_->run(KernelKind::layernorm_backward, bytes,
              [=] { nn::layernorm_backward(dy, x, w, mean, rstd, dx, dw, db, n, c, accumulate_dx, dx_sums); });
  }

  // RMSNorm (nn/rmsnorm.h): as the layernorm's, without the mean and the bias.
  template <class E>
  void rmsnorm_forward(const float* x, const float* w, E* y, float* rstd, std::int64_t n, std::int64_t c, float eps,
                       float* x_copy = nullptr) {
    const double bytes = f32((x_copy != nullptr ? 2 : 1) * n * c + c + n) + elements<E>(n * c);
    dev_->run(KernelKind::rmsnorm_forward, bytes,
              [=] { nn::rmsnorm_forward<Fmt<E>>(x, w, y, rstd, n, c, eps, x_copy); });
  }
  void rmsnorm_backward(const float* dy, const float* x, const float* w, const float* rstd, float* dx, float* dw,
                        std::int64_t n, std::int64_t c, bool accumulate_dx) {
    const double bytes = f32((accumulate_dx ? 4 : 3) * n * c + 3 * c + n);
    dev_->run(KernelKind::rmsnorm_backward, bytes,
              [=] { nn::rmsnorm_backward(dy, x, w, rstd, dx, dw, n, c, accumulate_dx); });
  }

  // Rotary positions and grouped heads between the QKV projection and attention (nn/rotary.h).
  void qkv_heads_forward(const HeadsShape& s, const T* packed, T* qkv, const float* cos, const float* sin) {
    const std::int64_t rows = s.batch * s.seq, hd = s.head_dim;
    dev_->run(KernelKind::rotary_forward, elements<T>(rows * (s.packed_width() + 3 * s.heads * hd)),
              [=] { nn::qkv_heads_forward<F>(s, packed, qkv, cos, sin); });
  }
  void qkv_heads_backward(const HeadsShape& s, const T* d_qkv, T* d_packed, const float* cos, const float* sin,
                          float* d_bias = nullptr) {
    const std::int64_t rows = s.batch * s.seq, hd = s.head_dim;
    dev_->run(KernelKind::rotary_backward, elements<T>(rows * (s.packed_width() + 3 * s.heads * hd)),
              [=] { nn::qkv_heads_backward<F>(s, d_qkv, d_packed, cos, sin, d_bias); });
  }

  // SwiGLU (nn/swiglu.h): forward reads [n, 2c] and writes [n, c]; backward reads both, writes [n, 2c].
  void swiglu_forward(const T* h, T* a, std::int64_t n, std::int64_t c, std::int64_t ld_h = 0,
                      std::int64_t ld_a = 0) {
    dev_->run(KernelKind::swiglu_forward, elements<T>(3 * n * c),
              [=] { nn::swiglu_forward<F>(h, a, n, c, ld_h, ld_a); });
  }
  void swiglu_backward(const T* da, const T* h, T* d_h, float* d_bias, std::int64_t n, std::int64_t c,
                       std::int64_t ld_a = 0, std::int64_t ld_h = 0) {
    dev_->run(KernelKind::swiglu_backward, elements<T>(5 * n * c) + (d_bias != nullptr ? f32(4 * c) : 0.0),
              [=] { nn::swiglu_backward<F>(da, h, d_h, d_bias, n, c, ld_a, ld_h); });
  }

  // Untimed as a whole: the GEMMs and the bias gradient time themselves.
  // w_version: w's version (BlockPointers::weights_version), 0 if unknown;
  // read on this thread, so the product sees the version of its submission.
  template <class X, class Y>
  void linear_forward(const X* x, const X* w, const float* b, Y* y, std::int64_t n, std::int64_t in,
                      std::int64_t out, bool accumulate, std::uint64_t w_version = 0, LinearRows rows = {}) {
    dev_->run([=] { nn::linear_forward<Fmt<X>, Fmt<Y>>(x, w, b, y, n, in, out, accumulate, w_version, rows); });
  }
  template <class X, class D>
  void linear_backward(const X* dy, const float* dy_f32, const X* x, const X* w, D* dx, float* dw, float* db,
                       std::int64_t n, std::int64_t in, std::int64_t out, std::uint64_t w_version = 0,
                       LinearRows rows = {}) {
    dev_->run([=] {
      nn::linear_backward<Fmt<X>, Fmt<D>>(dy, x, w, dx, dw, db, n, in, out, false, dy_f32, w_version, rows);
    });
  }

  // The CPU works in per-thread tiles: it takes no scratch.
  static AttentionScratchKind attention_scratch(std::int64_t /*pairs*/, std::int64_t /*seq*/,
                                                std::int64_t /*head_dim*/) {
    return AttentionScratchKind::none;
  }
  // Untimed here: the tile loop and its products time themselves.
  void attention_forward(const AttentionShape& s, const T* qkv, T* out, const AttentionSaved<T>& saved,
                         const AttentionScratch<T>& /*scratch*/) {
    dev_->run([=] { nn::attention_forward<F>(s, qkv, out, saved); });
  }
  // The QKV projection into forward's saved heads (nn/attention.h); its products time themselves.
  void attention_project(const AttentionShape& s, const T* x, const T* w, const float* b, std::uint64_t w_version,
                         const AttentionSaved<T>& saved) {
    dev_->run([=] { nn::attention_project<F>(s, x, w, b, w_version, saved); });
  }
  // d_out null: d_out_heads holds dO in the heads' layout (attention_output_grad).
  void attention_backward(const AttentionShape& s, const T* d_out, T* d_qkv, const AttentionSaved<T>& saved,
                          const AttentionScratch<T>& /*scratch*/, float* d_bias = nullptr, T* d_out_heads = nullptr) {
    dev_->run([=] { nn::attention_backward<F>(s, d_out, d_qkv, saved, d_bias, d_out_heads); });
  }
  // The output projection's input gradient in the heads' layout; its products time themselves.
  void attention_output_grad(const AttentionShape& s, const T* dy, const T* w, std::uint64_t w_version,
                             T* d_out_heads) {
    dev_->run([=] { nn::attention_output_grad<F>(s, dy, w, w_version, d_out_heads); });
  }

  void attention_cached(const AttentionShape& s, std::int64_t first, std::int64_t capacity, const T* qkv,
                        T* k_cache, T* v_cache, T* out, float* scores) {
    dev_->run(KernelKind::attention_decode, 0.0,
              [=] { nn::attention_cached<F>(s, first, capacity, qkv, k_cache, v_cache, out, scores); });
  }

  // x read, y and dydx (when given) written; backward reads two, writes one.
  void gelu_forward(const T* x, T* y, T* dydx, std::int64_t n, GeluForm form = GeluForm::erf) {
    dev_->run(KernelKind::gelu_forward, elements<T>((dydx != nullptr ? 3 : 2) * n),
              [=] { nn::gelu_forward<F>(x, y, dydx, n, form); });
  }
  // Reads dy and dydx, writes dx; with dbias, reads and writes its c sums.
  void gelu_backward(const T* dy, const T* dydx, T* dx, float* dbias, std::int64_t n, std::int64_t c,
                     std::int64_t ld = 0) {
    dev_->run(KernelKind::gelu_backward, elements<T>(3 * n * c) + (dbias != nullptr ? f32(2 * c) : 0.0),
              [=] { nn::gelu_backward<F>(dy, dydx, dx, dbias, n, c, ld); });
  }
  void to_storage(const float* x, T* y, std::int64_t n) {
    dev_->run(KernelKind::convert, f32(n) + elements<T>(n), [=] {
      store_all<F>(x, y, n);
    });
  }

  // Dropout updates x in place; the residual reads two and writes one.
  void dropout(float* x, std::int64_t n, float p, std::uint64_t key) {
    dev_->run(KernelKind::dropout, f32(2 * n), [=] { dropout_apply(x, n, p, key); });
  }
  void residual(const float* x, const float* branch, float* out, std::int64_t n) {
    dev_->run(KernelKind::residual, f32(3 * n), [=] {
      for (std::int64_t i = 0; i < n; ++i) out[i] = x[i] + branch[i];
    });
  }

  // Embeddings: tokens, the rows they pick and the positions read, out
  // written; backward updates the rows and positions. Patches: only what
  // is outside the linear's GEMM and bias gradient (the positions).
  void token_embedding_forward(const std::int32_t* tokens, const float* table, const float* pos, float* out,
                               std::int64_t batch, std::int64_t seq, std::int64_t d, std::int64_t vocab) {
    dev_->run(KernelKind::embedding_forward, f32(2 * batch * seq * d + seq * d + batch * seq),
              [=] { nn::token_embedding_forward(tokens, table, pos, out, batch, seq, d, vocab); });
  }
  void token_embedding_backward(const std::int32_t* tokens, const float* d_out, float* d_table, float* d_pos,
                                std::int64_t batch, std::int64_t seq, std::int64_t d) {
    dev_->run(KernelKind::embedding_backward, f32(3 * batch * seq * d + 2 * seq * d + batch * seq),
              [=] { nn::token_embedding_backward(tokens, d_out, d_table, d_pos, batch, seq, d); });
  }
  void patch_embedding_forward(const float* patches, const float* w, const float* b, const float* pos, float* out,
                               std::int64_t batch, std::int64_t seq, std::int64_t d, std::int64_t patch_dim) {
    dev_->run(KernelKind::embedding_forward, f32(2 * batch * seq * d + seq * d),
              [=] { nn::patch_embedding_forward(patches, w, b, pos, out, batch, seq, d, patch_dim); });
  }
  void patch_embedding_backward(const float* patches, const float* d_out, float* dw, float* db, float* d_pos,
                                std::int64_t batch, std::int64_t seq, std::int64_t d, std::int64_t patch_dim) {
    dev_->run(KernelKind::embedding_backward, f32(batch * seq * d + 2 * seq * d),
              [=] { nn::patch_embedding_backward(patches, d_out, dw, db, d_pos, batch, seq, d, patch_dim); });
  }
  // Mean pooling reads [batch, seq, d] and writes [batch, d], or back.
  void mean_pool_forward(const float* x, float* out, std::int64_t batch, std::int64_t seq, std::int64_t d) {
    dev_->run(KernelKind::mean_pool_forward, f32(batch * seq * d + batch * d),
              [=] { nn::mean_pool_forward(x, out, batch, seq, d); });
  }
  void mean_pool_backward(const float* d_out, float* d_x, std::int64_t batch, std::int64_t seq, std::int64_t d) {
    dev_->run(KernelKind::mean_pool_backward, f32(batch * seq * d + batch * d),
              [=] { nn::mean_pool_backward(d_out, d_x, batch, seq, d); });
  }

  // Adds the loss and hits to *totals unless null (backward recomputing).
  void cross_entropy_forward(const float* logits, const std::int32_t* targets, float* probs, std::int64_t n,
                             std::int64_t v, CrossEntropyTotals* totals) {
    dev_->run(KernelKind::cross_entropy_forward, f32(2 * n * v + n), [=] {  // logits, targets read; probs written
      const CrossEntropyResult r = nn::cross_entropy_forward(logits, targets, probs, n, v);
      if (totals == nullptr) return;
      totals->loss_sum += r.loss_sum;
      totals->correct += static_cast<std::uint64_t>(r.correct);
    });
  }
  void cross_entropy_backward(float* probs, const std::int32_t* targets, std::int64_t n, std::int64_t v,
                              float scale) {
    dev_->run(KernelKind::cross_entropy_backward, f32(2 * n * v + n),  // probs updated, targets read
              [=] { nn::cross_entropy_backward(probs, targets, n, v, scale); });
  }

 private:
  // The format of an element type: float is f32, a 16-bit type is F's.
  template <class E>
  using Fmt = std::conditional_t<std::is_same_v<std::remove_const_t<E>, float>, F32Format, F>;
  // Bytes of n elements of E, of n floats.
  template <class E>
  static double elements(std::int64_t n) {
    return static_cast<double>(n) * static_cast<double>(sizeof(E));
  }
  static double f32(std::int64_t n) { return elements<float>(n); }

  HostDevice* dev_;
};

}  // namespace dtrain::nn::cpu
