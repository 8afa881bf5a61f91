// Mixed-precision layers of the Transformer (ModelConfig::compute bf16 or
// f16): the same blocks as transformer.cpp / transformer_backward.cpp, with
// every matmul on 16-bit operands (weights from the compute copies) and f32
// accumulation, the residual stream, norms, softmax statistics and parameter
// gradients in f32. Each backward sits below the forward it undoes.
#include <cstring>

#include "nn/attention_half.h"
#include "nn/cpu/convert.h"
#include "nn/dropout.h"
#include "nn/gelu.h"
#include "nn/layernorm.h"
#include "nn/linear.h"
#include "nn/transformer.h"
#include "nn/transformer_activations.h"

namespace dtrain::nn {

const std::uint16_t* Transformer::param16(int index) const {
  const ParamSpec& spec = layout_.params()[static_cast<std::size_t>(index)];
  return ptrs_.compute[static_cast<std::size_t>(spec.block)] + spec.offset;
}

namespace {

// out[n, d] = base + drop(x W^T + b), f32. Without dropout the GEMM adds into
// a copy of base; with it, the branch goes through `branch` first.
void residual_branch(DType h, const std::uint16_t* x, const std::uint16_t* w, const float* b,
                     const float* base, float* out, float* branch, std::int64_t n,
                     std::int64_t in, std::int64_t d, float p, const std::uint64_t* key) {
  if (key != nullptr) {
    linear_forward_half(h, x, w, b, branch, DType::f32, n, in, d);
    dropout_apply(branch, n * d, p, *key);
    for (std::int64_t i = 0; i < n * d; ++i) out[i] = base[i] + branch[i];
    return;
  }
  std::memcpy(out, base, static_cast<std::size_t>(n * d) * sizeof(float));
  linear_forward_half(h, x, w, b, out, DType::f32, n, in, d, /*accumulate=*/true);
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
  const std::int64_t first = key.row_offset * seq_ * config_.d_model;
  const std::uint64_t key_attn = dropout_key(key.seed, key.step, key.micro, 2 * l, first);
  const std::uint64_t key_mlp = dropout_key(key.seed, key.step, key.micro, 2 * l + 1, first);

  layernorm_forward_half(x, w(kLn1W), w(kLn1B), L.ln1.data(), h, L.ln1_mean.data(),
                         L.ln1_rstd.data(), n, d);
  linear_forward_half(h, L.ln1.data(), w16(kQkvW), w(kQkvB), H.qkv.data(), h, n, d, 3 * d);
  attention_forward_half(attn_shape_, h, H.qkv.data(), L.attn.data(),
                         AttentionSavedHalf{L.q.data(), L.k.data(), L.v.data(), L.probs.data()},
                         AttentionScratchHalf{H.scores.data(), H.heads.data(), nullptr, nullptr,
                                              nullptr, nullptr});
  residual_branch(h, L.attn.data(), w16(kProjW), w(kProjB), x, L.mid.data(), acts_->d_tmp.data(),
                  n, d, d, config_.dropout, drop ? &key_attn : nullptr);
  layernorm_forward_half(L.mid.data(), w(kLn2W), w(kLn2B), L.ln2.data(), h, L.ln2_mean.data(),
                         L.ln2_rstd.data(), n, d);
  linear_forward_half(h, L.ln2.data(), w16(kFc1W), w(kFc1B), L.h.data(), h, n, d, ff);
  // h is overwritten by gelu'(h): backward needs only the derivative.
  gelu_forward_half(h, L.h.data(), L.a.data(), training ? L.h.data() : nullptr, n * ff);
  residual_branch(h, L.a.data(), w16(kFc2W), w(kFc2B), L.mid.data(), out, acts_->d_tmp.data(),
                  n, ff, d, config_.dropout, drop ? &key_mlp : nullptr);
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

  // A branch output's gradient: d_resid (dropped with forward's mask), in f32
  // for the bias and rounded to 16 bits in H.d_resid for the matmuls.
  auto branch_grad = [&](std::int64_t site) -> const float* {
    const float* grad = d_resid;
    if (dropout_active_) {
      float* db = acts_->d_branch.data();
      std::memcpy(db, d_resid, static_cast<std::size_t>(n * d) * sizeof(float));
      dropout_apply(db, n * d, config_.dropout, dropout_key(key_.seed, key_.step, key_.micro, site,
                                key_.row_offset * seq_ * config_.d_model));
      grad = db;
    }
    cpu::f32_to_half(grad, h, H.d_resid.data(), n * d);
    return grad;
  };

  // MLP branch.
  const float* g_mlp = branch_grad(2 * l + 1);
  linear_backward_half(h, H.d_resid.data(), g_mlp, L.a.data(), w16(kFc2W), H.d_h.data(), h,
                       g(kFc2W), g(kFc2B), n, ff, d);
  gelu_backward_half(h, H.d_h.data(), L.h.data(), n * ff);  // L.h holds gelu'
  linear_backward_half(h, H.d_h.data(), nullptr, L.ln2.data(), w16(kFc1W), d_tmp, DType::f32,
                       g(kFc1W), g(kFc1B), n, d, ff);
  layernorm_backward(d_tmp, L.mid.data(), w(kLn2W), L.ln2_mean.data(), L.ln2_rstd.data(),
                     d_resid, g(kLn2W), g(kLn2B), n, d, true);

  // Attention branch.
  const float* g_attn = branch_grad(2 * l);
  linear_backward_half(h, H.d_resid.data(), g_attn, L.attn.data(), w16(kProjW), H.d_attn.data(),
                       h, g(kProjW), g(kProjB), n, d, d);
  attention_backward_half(attn_shape_, h, H.d_attn.data(), H.d_qkv.data(),
                          AttentionSavedHalf{L.q.data(), L.k.data(), L.v.data(), L.probs.data()},
                          AttentionScratchHalf{H.scores.data(), H.heads.data(),
                                               H.d_scores.data(), H.dq.data(), H.dk.data(),
                                               H.dv.data()});
  linear_backward_half(h, H.d_qkv.data(), nullptr, L.ln1.data(), w16(kQkvW), d_tmp, DType::f32,
                       g(kQkvW), g(kQkvB), n, d, 3 * d);
  layernorm_backward(d_tmp, x, w(kLn1W), L.ln1_mean.data(), L.ln1_rstd.data(), d_resid, g(kLn1W),
                     g(kLn1B), n, d, true);
}

// lm head: logits (f32) = lnf(x) (16-bit) . W^T, W the head or the tied embedding.
void Transformer::lm_head_forward_half() {
  const int base = layout_.blocks().back().first_param;
  const std::int64_t n = batch_ * seq_, d = config_.d_model;
  const DType h = config_.compute;
  layernorm_forward_half(acts_->resid.back().data(), param(base, false), param(base + 1, false),
                         half_->lnf.data(), h, acts_->lnf_mean.data(), acts_->lnf_rstd.data(), n,
                         d);
  const std::uint16_t* head = config_.tie_embeddings ? param16(0) : param16(base + 2);
  linear_forward_half(h, half_->lnf.data(), head, nullptr, acts_->logits.data(), DType::f32, n,
                      d, config_.vocab_size);
}

// dlogits: f32 [n, vocab], already scaled (cross_entropy_backward).
void Transformer::lm_head_backward_half(float* dlogits) {
  const int base = layout_.blocks().back().first_param;
  const std::int64_t n = batch_ * seq_, d = config_.d_model, v = config_.vocab_size;
  const DType h = config_.compute;
  const bool tied = config_.tie_embeddings;
  cpu::f32_to_half(dlogits, h, half_->d_logits.data(), n * v);
  linear_backward_half(h, half_->d_logits.data(), nullptr, half_->lnf.data(),
                       tied ? param16(0) : param16(base + 2), acts_->d_lnf.data(), DType::f32,
                       tied ? param(0, true) : param(base + 2, true), nullptr, n, d, v);
  layernorm_backward(acts_->d_lnf.data(), acts_->resid.back().data(), param(base, false),
                     acts_->lnf_mean.data(), acts_->lnf_rstd.data(), acts_->d_resid.data(),
                     param(base, true), param(base + 1, true), n, d, false);
}

}  // namespace dtrain::nn
