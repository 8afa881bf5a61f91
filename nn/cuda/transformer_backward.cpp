// nn::cuda::Transformer::backward: the blocks in reverse, each layer's
// backward as in nn/transformer_backward.cpp. d_resid carries dL/d(residual
// stream) from block to block and is updated in place; every call is queued
// on the model's stream.
#include "core/error.h"
#include "nn/cuda/attention.h"
#include "nn/cuda/check.h"
#include "nn/cuda/cross_entropy.h"
#include "nn/cuda/dropout.h"
#include "nn/cuda/embedding.h"
#include "nn/cuda/gelu.h"
#include "nn/cuda/layernorm.h"
#include "nn/cuda/linear.h"
#include "nn/cuda/matmul.h"
#include "nn/cuda/transformer.h"
#include "nn/cuda/transformer_activations.h"

namespace dtrain::nn::cuda {

void Transformer::backward(BlockHooks& hooks, float grad_scale) {
  const int head_block = layout_.num_blocks() - 1;
  hooks.before_backward(head_block);
  head_backward(grad_scale);
  hooks.after_backward(head_block);
  for (int l = static_cast<int>(config_.n_layers) - 1; l >= 0; --l) {
    hooks.before_backward(l + 1);
    layer_backward(l);
    hooks.after_backward(l + 1);
  }
  hooks.before_backward(0);
  embed_backward();
  hooks.after_backward(0);
}

void Transformer::head_backward(float grad_scale) {
  const int base = layout_.blocks().back().first_param;
  const std::int64_t n = batch_ * seq_, d = config_.d_model;
  const bool lm = config_.kind == ModelConfig::Kind::lm;
  float* dlogits = acts_->logits.data();  // holds the softmax after forward
  cross_entropy_backward(dlogits, inputs_->targets.data(), rows(), config_.outputs(),
                         grad_scale / static_cast<float>(rows()), stream_);
  if (lm && half()) return lm_head_backward_half(dlogits);
  if (lm) {
    const bool tied = config_.tie_embeddings;
    const float* head = tied ? param(0, false) : param(base + 2, false);
    float* dhead = tied ? param(0, true) : param(base + 2, true);
    linear_backward(*blas_, dlogits, acts_->lnf.data(), head, acts_->d_lnf.data(), dhead, nullptr,
                    n, d, config_.vocab_size, false, stream_);
  } else {
    linear_backward(*blas_, dlogits, acts_->pooled.data(), param(base + 2, false),
                    acts_->d_pooled.data(), param(base + 2, true), param(base + 3, true), batch_, d,
                    config_.num_classes, false, stream_);
    mean_pool_backward(acts_->d_pooled.data(), acts_->d_lnf.data(), batch_, seq_, d, stream_);
  }
  layernorm_backward(acts_->d_lnf.data(), acts_->resid.back().data(), param(base, false),
                     acts_->lnf_mean.data(), acts_->lnf_rstd.data(), acts_->d_resid.data(),
                     param(base, true), param(base + 1, true), n, d, false, stream_);
}

void Transformer::layer_backward(int l) {
  if (half()) return layer_backward_half(l);
  Activations::Layer& L = acts_->layers[static_cast<std::size_t>(l)];
  const int base = layout_.blocks()[static_cast<std::size_t>(l + 1)].first_param;
  auto w = [&](int i) { return param(base + i, false); };
  auto g = [&](int i) { return param(base + i, true); };
  const std::int64_t n = batch_ * seq_, d = config_.d_model, ff = config_.d_ff;
  const float* x = acts_->resid[static_cast<std::size_t>(l)].data();
  float* d_resid = acts_->d_resid.data();
  float* d_tmp = acts_->d_tmp.data();
  Blas& blas = *blas_;

  // The gradient of a branch output is d_resid, dropped with forward's mask.
  auto branch_grad = [&](std::int64_t site) -> const float* {
    if (!dropout_active_) return d_resid;
    float* db = acts_->d_branch.data();
    DTRAIN_CUDA_TRY(cudaMemcpyAsync(db, d_resid, static_cast<std::size_t>(n * d) * sizeof(float),
                                    cudaMemcpyDeviceToDevice, stream_));
    dropout_apply(db, n * d, config_.dropout, key_for(key_, site), stream_);
    return db;
  };

  // MLP branch: x_out = mid + fc2(gelu(fc1(ln2(mid)))).
  linear_backward(blas, branch_grad(2 * l + 1), L.a.data(), w(kFc2W), acts_->d_h.data(), g(kFc2W),
                  g(kFc2B), n, ff, d, false, stream_);
  gelu_backward(acts_->d_h.data(), L.h.data(), acts_->d_h.data(), n * ff, stream_);  // L.h holds gelu'
  linear_backward(blas, acts_->d_h.data(), L.ln2.data(), w(kFc1W), d_tmp, g(kFc1W), g(kFc1B), n, d,
                  ff, false, stream_);
  layernorm_backward(d_tmp, L.mid.data(), w(kLn2W), L.ln2_mean.data(), L.ln2_rstd.data(), d_resid,
                     g(kLn2W), g(kLn2B), n, d, true, stream_);

  // Attention branch: mid = x + proj(attn(qkv(ln1(x)))).
  linear_backward(blas, branch_grad(2 * l), L.attn.data(), w(kProjW), d_tmp, g(kProjW), g(kProjB),
                  n, d, d, false, stream_);
  attention_backward(blas, attn_shape_, d_tmp, acts_->d_qkv.data(),
                     AttentionSaved{L.q.data(), L.k.data(), L.v.data(), L.probs.data()},
                     AttentionScratch{acts_->d_heads.data(), acts_->d_probs.data(),
                                      acts_->dq.data(), acts_->dk.data(), acts_->dv.data()},
                     stream_);
  linear_backward(blas, acts_->d_qkv.data(), L.ln1.data(), w(kQkvW), d_tmp, g(kQkvW), g(kQkvB), n,
                  d, 3 * d, false, stream_);
  layernorm_backward(d_tmp, x, w(kLn1W), L.ln1_mean.data(), L.ln1_rstd.data(), d_resid, g(kLn1W),
                     g(kLn1B), n, d, true, stream_);
}

void Transformer::embed_backward() {
  float* d_out = acts_->d_resid.data();
  const std::int64_t d = config_.d_model;
  if (dropout_active_) {
    dropout_apply(d_out, batch_ * seq_ * d, config_.dropout, key_for(key_, kEmbedDropoutSite),
                  stream_);
  }
  if (config_.input == ModelConfig::Input::tokens) {
    token_embedding_backward(inputs_->tokens.data(), d_out, param(0, true), param(1, true), batch_,
                             seq_, d, stream_);
  } else {  // patch.weight and patch.bias as a Linear without dx, then the positions
    linear_backward(*blas_, d_out, inputs_->patches.data(), param(0, false), nullptr,
                    param(0, true), param(1, true), batch_ * seq_, config_.patch_dim, d, false,
                    stream_);
    add_positions_backward(d_out, param(2, true), batch_, seq_, d, stream_);
  }
}

}  // namespace dtrain::nn::cuda
