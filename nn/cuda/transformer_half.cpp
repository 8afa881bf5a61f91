// Mixed-precision layers of nn::cuda::Transformer (compute bf16 or f16), as
// nn/transformer_half.cpp: every matmul on 16-bit operands (weights from the
// compute copies) with f32 accumulation in cuBLAS; the residual stream, norms,
// softmax statistics and parameter gradients in f32. Each backward sits below
// the forward it undoes.
#include "core/error.h"
#include "nn/cuda/attention_half.h"
#include "nn/cuda/check.h"
#include "nn/cuda/convert.h"
#include "nn/cuda/dropout.h"
#include "nn/cuda/gelu.h"
#include "nn/cuda/layernorm.h"
#include "nn/cuda/linear.h"
#include "nn/cuda/matmul.h"
#include "nn/cuda/residual.h"
#include "nn/cuda/transformer.h"
#include "nn/cuda/transformer_activations.h"
#include "nn/linear.h"

namespace dtrain::nn::cuda {
namespace {

// nn::linear_forward_half on the device: y (y_type) (+)= x W^T + b, x and W of
// type h, bias f32.
void linear_forward_half(Blas& blas, DType h, const std::uint16_t* x, const std::uint16_t* weight,
                         const float* bias, void* y, DType y_type, std::int64_t n, std::int64_t in,
                         std::int64_t out, bool accumulate, cudaStream_t stream) {
  Gemm g = linear_forward_gemm(n, in, out, accumulate);
  g.a_type = g.b_type = h;
  g.c_type = y_type;
  gemm(blas, g, x, weight, y, bias, stream);
}

// nn::linear_backward_half on the device. dbias sums dy_f32 when given (the
// gradient before rounding), else dy widened into `widened` ([n, out] f32
// scratch), as the CPU sums the 16-bit rows in f32.
void linear_backward_half(Blas& blas, DType h, const std::uint16_t* dy, const float* dy_f32,
                          const std::uint16_t* x, const std::uint16_t* weight, void* dx,
                          DType dx_type, float* dweight, float* dbias, std::int64_t n,
                          std::int64_t in, std::int64_t out, float* widened, cudaStream_t stream) {
  if (dx != nullptr) {  // dx[n, in] = dy[n, out] W[out, in]
    Gemm g = linear_input_grad_gemm(n, in, out, false);
    g.a_type = g.b_type = h;
    g.c_type = dx_type;
    gemm(blas, g, dy, weight, dx, nullptr, stream);
  }
  Gemm w = linear_weight_grad_gemm(n, in, out);  // into f32
  w.a_type = w.b_type = h;
  gemm(blas, w, dy, x, dweight, nullptr, stream);
  if (dbias == nullptr) return;
  if (dy_f32 == nullptr) {
    half_to_f32(dy, h, widened, n * out, stream);
    dy_f32 = widened;
  }
  add_column_sums(dy_f32, dbias, n, out, stream);
}

// out[n, d] = base + drop(x W^T + b), f32. Without dropout the GEMM adds into
// a copy of base; with it, the branch goes through `branch` first.
void residual_branch(Blas& blas, DType h, const std::uint16_t* x, const std::uint16_t* w,
                     const float* b, const float* base, float* out, float* branch, std::int64_t n,
                     std::int64_t in, std::int64_t d, float p, const std::uint64_t* key,
                     cudaStream_t stream) {
  if (key != nullptr) {
    linear_forward_half(blas, h, x, w, b, branch, DType::f32, n, in, d, false, stream);
    dropout_apply(branch, n * d, p, *key, stream);
    residual_forward(base, branch, out, n * d, stream);
    return;
  }
  DTRAIN_CUDA_TRY(cudaMemcpyAsync(out, base, static_cast<std::size_t>(n * d) * sizeof(float),
                                  cudaMemcpyDeviceToDevice, stream));
  linear_forward_half(blas, h, x, w, b, out, DType::f32, n, in, d, /*accumulate=*/true, stream);
}

}  // namespace

// x_mid = x + drop(proj(attn(ln1(x)))); x_out = x_mid + drop(fc2(gelu(fc1(ln2(x_mid))))).
void Transformer::layer_forward_half(int l, const StepKey& key, bool training) {
  HalfActivations& H = *half_;
  HalfActivations::Layer& L = H.layers[static_cast<std::size_t>(l)];
  const DType h = config_.compute;
  const int base = layout_.blocks()[static_cast<std::size_t>(l + 1)].first_param;
  auto w = [&](int i) { return param(base + i, false); };  // f32: norms, biases
  auto w16 = [&](int i) { return param16(base + i); };     // 16-bit: matrices
  const std::int64_t n = batch_ * seq_, d = config_.d_model, ff = config_.d_ff;
  const float* x = acts_->resid[static_cast<std::size_t>(l)].data();
  float* out = acts_->resid[static_cast<std::size_t>(l) + 1].data();
  const bool drop = training && config_.dropout > 0.0f;
  const std::uint64_t key_attn = key_for(key, 2 * l);
  const std::uint64_t key_mlp = key_for(key, 2 * l + 1);
  Blas& blas = *blas_;

  layernorm_forward_half(x, w(kLn1W), w(kLn1B), L.ln1.data(), h, L.ln1_mean.data(),
                         L.ln1_rstd.data(), n, d, stream_);
  linear_forward_half(blas, h, L.ln1.data(), w16(kQkvW), w(kQkvB), H.qkv.data(), h, n, d, 3 * d,
                      false, stream_);
  attention_forward_half(blas, attn_shape_, h, H.qkv.data(), L.attn.data(),
                         AttentionSavedHalf{L.q.data(), L.k.data(), L.v.data(), L.probs.data()},
                         AttentionScratchHalf{H.scores.data(), H.heads.data(), nullptr, nullptr,
                                              nullptr, nullptr},
                         stream_);
  residual_branch(blas, h, L.attn.data(), w16(kProjW), w(kProjB), x, L.mid.data(),
                  acts_->d_tmp.data(), n, d, d, config_.dropout, drop ? &key_attn : nullptr, stream_);
  layernorm_forward_half(L.mid.data(), w(kLn2W), w(kLn2B), L.ln2.data(), h, L.ln2_mean.data(),
                         L.ln2_rstd.data(), n, d, stream_);
  linear_forward_half(blas, h, L.ln2.data(), w16(kFc1W), w(kFc1B), L.h.data(), h, n, d, ff, false,
                      stream_);
  // h is overwritten by gelu'(h): backward needs only the derivative.
  gelu_forward_half(h, L.h.data(), L.a.data(), training ? L.h.data() : nullptr, n * ff, stream_);
  residual_branch(blas, h, L.a.data(), w16(kFc2W), w(kFc2B), L.mid.data(), out,
                  acts_->d_tmp.data(), n, ff, d, config_.dropout, drop ? &key_mlp : nullptr, stream_);
}

void Transformer::layer_backward_half(int l) {
  HalfActivations& H = *half_;
  HalfActivations::Layer& L = H.layers[static_cast<std::size_t>(l)];
  const DType h = config_.compute;
  const int base = layout_.blocks()[static_cast<std::size_t>(l + 1)].first_param;
  auto w = [&](int i) { return param(base + i, false); };
  auto w16 = [&](int i) { return param16(base + i); };
  auto g = [&](int i) { return param(base + i, true); };
  const std::int64_t n = batch_ * seq_, d = config_.d_model, ff = config_.d_ff;
  const float* x = acts_->resid[static_cast<std::size_t>(l)].data();
  float* d_resid = acts_->d_resid.data();
  float* d_tmp = acts_->d_tmp.data();
  float* widened = acts_->d_bias.data();
  Blas& blas = *blas_;

  // A branch output's gradient: d_resid (dropped with forward's mask), in f32
  // for the bias and rounded to 16 bits in H.d_resid for the matmuls.
  auto branch_grad = [&](std::int64_t site) -> const float* {
    const float* grad = d_resid;
    if (dropout_active_) {
      float* db = acts_->d_branch.data();
      DTRAIN_CUDA_TRY(cudaMemcpyAsync(db, d_resid, static_cast<std::size_t>(n * d) * sizeof(float),
                                      cudaMemcpyDeviceToDevice, stream_));
      dropout_apply(db, n * d, config_.dropout, key_for(key_, site), stream_);
      grad = db;
    }
    f32_to_half(grad, h, H.d_resid.data(), n * d, stream_);
    return grad;
  };

  // MLP branch.
  const float* g_mlp = branch_grad(2 * l + 1);
  linear_backward_half(blas, h, H.d_resid.data(), g_mlp, L.a.data(), w16(kFc2W), H.d_h.data(), h,
                       g(kFc2W), g(kFc2B), n, ff, d, widened, stream_);
  gelu_backward_half(h, H.d_h.data(), L.h.data(), n * ff, stream_);  // L.h holds gelu'
  linear_backward_half(blas, h, H.d_h.data(), nullptr, L.ln2.data(), w16(kFc1W), d_tmp, DType::f32,
                       g(kFc1W), g(kFc1B), n, d, ff, widened, stream_);
  layernorm_backward(d_tmp, L.mid.data(), w(kLn2W), L.ln2_mean.data(), L.ln2_rstd.data(), d_resid,
                     g(kLn2W), g(kLn2B), n, d, true, stream_);

  // Attention branch.
  const float* g_attn = branch_grad(2 * l);
  linear_backward_half(blas, h, H.d_resid.data(), g_attn, L.attn.data(), w16(kProjW),
                       H.d_attn.data(), h, g(kProjW), g(kProjB), n, d, d, widened, stream_);
  attention_backward_half(blas, attn_shape_, h, H.d_attn.data(), H.d_qkv.data(),
                          AttentionSavedHalf{L.q.data(), L.k.data(), L.v.data(), L.probs.data()},
                          AttentionScratchHalf{H.scores.data(), H.heads.data(), H.d_scores.data(),
                                               H.dq.data(), H.dk.data(), H.dv.data()},
                          stream_);
  linear_backward_half(blas, h, H.d_qkv.data(), nullptr, L.ln1.data(), w16(kQkvW), d_tmp,
                       DType::f32, g(kQkvW), g(kQkvB), n, d, 3 * d, widened, stream_);
  layernorm_backward(d_tmp, x, w(kLn1W), L.ln1_mean.data(), L.ln1_rstd.data(), d_resid, g(kLn1W),
                     g(kLn1B), n, d, true, stream_);
}

// lm head: logits (f32) = lnf(x) (16-bit) . W^T, W the head or the tied embedding.
void Transformer::lm_head_forward_half() {
  const int base = layout_.blocks().back().first_param;
  const std::int64_t n = batch_ * seq_, d = config_.d_model;
  const DType h = config_.compute;
  layernorm_forward_half(acts_->resid.back().data(), param(base, false), param(base + 1, false),
                         half_->lnf.data(), h, acts_->lnf_mean.data(), acts_->lnf_rstd.data(), n,
                         d, stream_);
  const std::uint16_t* head = config_.tie_embeddings ? param16(0) : param16(base + 2);
  linear_forward_half(*blas_, h, half_->lnf.data(), head, nullptr, acts_->logits.data(),
                      DType::f32, n, d, config_.vocab_size, false, stream_);
}

// dlogits: f32 [n, vocab], already scaled (cross_entropy_backward).
void Transformer::lm_head_backward_half(float* dlogits) {
  const int base = layout_.blocks().back().first_param;
  const std::int64_t n = batch_ * seq_, d = config_.d_model, v = config_.vocab_size;
  const DType h = config_.compute;
  const bool tied = config_.tie_embeddings;
  f32_to_half(dlogits, h, half_->d_logits.data(), n * v, stream_);
  linear_backward_half(*blas_, h, half_->d_logits.data(), nullptr, half_->lnf.data(),
                       tied ? param16(0) : param16(base + 2), acts_->d_lnf.data(), DType::f32,
                       tied ? param(0, true) : param(base + 2, true), nullptr, n, d, v, nullptr,
                       stream_);
  layernorm_backward(acts_->d_lnf.data(), acts_->resid.back().data(), param(base, false),
                     acts_->lnf_mean.data(), acts_->lnf_rstd.data(), acts_->d_resid.data(),
                     param(base, true), param(base + 1, true), n, d, false, stream_);
}

}  // namespace dtrain::nn::cuda
