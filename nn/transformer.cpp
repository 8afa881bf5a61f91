#include "nn/transformer.h"

#include "nn/transformer_activations.h"

#include <cstring>

#include "core/error.h"
#include "nn/cross_entropy.h"
#include "nn/dropout.h"
#include "nn/embedding.h"
#include "nn/gelu.h"
#include "nn/layernorm.h"
#include "nn/linear.h"

namespace dtrain::nn {

std::int64_t ModelConfig::matmul_params() const {
  const std::int64_t d = d_model;
  const std::int64_t per_layer = 3 * d * d + d * d + 2 * d * d_ff;
  return n_layers * per_layer + outputs() * d;
}

double ModelConfig::flops_per_token(std::int64_t seq_len) const {
  return 6.0 * static_cast<double>(matmul_params()) +
         12.0 * static_cast<double>(n_layers * d_model * seq_len);
}

ParameterLayout declare_parameters(const ModelConfig& c) {
  const std::int64_t d = c.d_model;
  ParameterLayout layout;
  layout.begin_block("embeddings");
  if (c.input == ModelConfig::Input::tokens) {
    layout.add("tok_emb", {c.vocab_size, d}, Init::normal, true);
  } else {
    layout.add("patch.weight", {d, c.patch_dim}, Init::normal, true);
    layout.add("patch.bias", {d}, Init::zeros, false);
  }
  layout.add("pos_emb", {c.max_seq_len, d}, Init::normal, true);
  for (std::int64_t l = 0; l < c.n_layers; ++l) {
    const std::string p = fmt::format("layer.{}.", l);
    layout.begin_block(fmt::format("layer.{}", l));
    layout.add(p + "ln1.weight", {d}, Init::ones, false);
    layout.add(p + "ln1.bias", {d}, Init::zeros, false);
    layout.add(p + "qkv.weight", {3 * d, d}, Init::normal, true);
    layout.add(p + "qkv.bias", {3 * d}, Init::zeros, false);
    layout.add(p + "proj.weight", {d, d}, Init::normal, true);
    layout.add(p + "proj.bias", {d}, Init::zeros, false);
    layout.add(p + "ln2.weight", {d}, Init::ones, false);
    layout.add(p + "ln2.bias", {d}, Init::zeros, false);
    layout.add(p + "fc1.weight", {c.d_ff, d}, Init::normal, true);
    layout.add(p + "fc1.bias", {c.d_ff}, Init::zeros, false);
    layout.add(p + "fc2.weight", {d, c.d_ff}, Init::normal, true);
    layout.add(p + "fc2.bias", {d}, Init::zeros, false);
  }
  layout.begin_block("head");
  layout.add("lnf.weight", {d}, Init::ones, false);
  layout.add("lnf.bias", {d}, Init::zeros, false);
  if (c.kind == ModelConfig::Kind::lm) {
    if (!c.tie_embeddings) layout.add("head.weight", {c.vocab_size, d}, Init::normal, true);
  } else {
    layout.add("cls.weight", {c.num_classes, d}, Init::normal, true);
    layout.add("cls.bias", {c.num_classes}, Init::zeros, false);
  }
  return layout;
}

Transformer::Transformer(const ModelConfig& config, const ParameterLayout& layout,
                         std::int64_t batch, std::int64_t seq_len)
    : config_(config), layout_(layout), batch_(batch), seq_(seq_len) {
  DTRAIN_CHECK(config.d_model % config.n_heads == 0, "d_model {} vs n_heads {}", config.d_model,
               config.n_heads);
  DTRAIN_CHECK(seq_len <= config.max_seq_len, "seq_len {} > max_seq_len {}", seq_len,
               config.max_seq_len);
  attn_shape_ = AttentionShape{batch, seq_len, config.n_heads, config.d_model / config.n_heads,
                               config.kind == ModelConfig::Kind::lm};
  acts_ = std::make_unique<Activations>(config, batch, seq_len);
  if (half()) {
    DTRAIN_CHECK(config.compute == DType::bf16 || config.compute == DType::f16,
                 "compute type {} is not f32, bf16 or f16", dtype_name(config.compute));
    half_ = std::make_unique<HalfActivations>(config, batch, seq_len);
  }
}

Transformer::~Transformer() = default;

void Transformer::bind(const BlockPointers& pointers) {
  DTRAIN_CHECK(static_cast<int>(pointers.params.size()) == layout_.num_blocks() &&
                   static_cast<int>(pointers.grads.size()) == layout_.num_blocks(),
               "bind: {} blocks expected", layout_.num_blocks());
  DTRAIN_CHECK(!half() || static_cast<int>(pointers.compute.size()) == layout_.num_blocks(),
               "bind: {} compute copies expected for {} compute", layout_.num_blocks(),
               dtype_name(config_.compute));
  ptrs_ = pointers;
}

float* Transformer::param(int index, bool grad) const {
  const ParamSpec& spec = layout_.params()[static_cast<std::size_t>(index)];
  const auto b = static_cast<std::size_t>(spec.block);
  return (grad ? ptrs_.grads[b] : ptrs_.params[b]) + spec.offset;
}

ForwardResult Transformer::forward(const ModelInputs& inputs, BlockHooks& hooks, bool training,
                                   const StepKey& key) {
  DTRAIN_CHECK(!ptrs_.params.empty(), "forward before bind");
  inputs_ = inputs;
  key_ = key;
  dropout_active_ = training && config_.dropout > 0.0f;
  const int head_block = layout_.num_blocks() - 1;

  hooks.before_forward(0);
  embed_forward(key, training);
  hooks.after_forward(0);
  for (int l = 0; l < config_.n_layers; ++l) {
    hooks.before_forward(l + 1);
    layer_forward(l, key, training);
    hooks.after_forward(l + 1);
  }
  hooks.before_forward(head_block);
  head_forward();
  const bool lm = config_.kind == ModelConfig::Kind::lm;
  const std::int64_t rows = lm ? batch_ * seq_ : batch_;
  const CrossEntropyResult ce = cross_entropy_forward(acts_->logits.data(), inputs.targets,
                                                      acts_->logits.data(), rows,
                                                      config_.outputs());
  hooks.after_forward(head_block);
  return ForwardResult{static_cast<float>(ce.loss_sum / static_cast<double>(rows)), ce.correct,
                       rows};
}

void Transformer::embed_forward(const StepKey& key, bool training) {
  const float* pos = param(config_.input == ModelConfig::Input::tokens ? 1 : 2, false);
  float* out = acts_->resid[0].data();
  if (config_.input == ModelConfig::Input::tokens) {
    token_embedding_forward(inputs_.tokens, param(0, false), pos, out, batch_, seq_,
                            config_.d_model, config_.vocab_size);
  } else {
    patch_embedding_forward(inputs_.patches, param(0, false), param(1, false), pos, out, batch_,
                            seq_, config_.d_model, config_.patch_dim);
  }
  if (training && config_.dropout > 0.0f) {
    dropout_apply(out, batch_ * seq_ * config_.d_model, config_.dropout,
                  dropout_key(key.seed, key.step, key.micro, kEmbedDropoutSite,
                              key.row_offset * seq_ * config_.d_model));
  }
}

// x_mid = x + drop(proj(attn(ln1(x)))); x_out = x_mid + drop(fc2(gelu(fc1(ln2(x_mid))))).
void Transformer::layer_forward(int l, const StepKey& key, bool training) {
  if (half()) return layer_forward_half(l, key, training);
  Activations::Layer& L = acts_->layers[static_cast<std::size_t>(l)];
  const int base = layout_.blocks()[static_cast<std::size_t>(l + 1)].first_param;
  auto w = [&](int i) { return param(base + i, false); };
  const std::int64_t n = batch_ * seq_, d = config_.d_model, ff = config_.d_ff;
  const float* x = acts_->resid[static_cast<std::size_t>(l)].data();
  float* out = acts_->resid[static_cast<std::size_t>(l) + 1].data();
  const bool drop = training && config_.dropout > 0.0f;
  const auto bytes = static_cast<std::size_t>(n * d) * sizeof(float);

  layernorm_forward(x, w(kLn1W), w(kLn1B), L.ln1.data(), L.ln1_mean.data(), L.ln1_rstd.data(), n,
                    d);
  linear_forward(L.ln1.data(), w(kQkvW), w(kQkvB), L.qkv.data(), n, d, 3 * d);
  attention_forward(attn_shape_, L.qkv.data(), L.attn.data(),
                    AttentionSaved{L.q.data(), L.k.data(), L.v.data(), L.probs.data()},
                    AttentionScratch{acts_->d_heads.data(), nullptr, nullptr, nullptr, nullptr});
  if (drop) {  // the branch needs its own buffer to be dropped before the residual add
    float* branch = acts_->d_tmp.data();
    linear_forward(L.attn.data(), w(kProjW), w(kProjB), branch, n, d, d);
    dropout_apply(branch, n * d, config_.dropout, dropout_key(key.seed, key.step, key.micro, 2 * l,
                              key.row_offset * seq_ * config_.d_model));
    for (std::int64_t i = 0; i < n * d; ++i) L.mid[static_cast<std::size_t>(i)] = x[i] + branch[i];
  } else {  // residual added by the GEMM's accumulation into a copy of x
    std::memcpy(L.mid.data(), x, bytes);
    linear_forward(L.attn.data(), w(kProjW), w(kProjB), L.mid.data(), n, d, d, true);
  }
  layernorm_forward(L.mid.data(), w(kLn2W), w(kLn2B), L.ln2.data(), L.ln2_mean.data(),
                    L.ln2_rstd.data(), n, d);
  linear_forward(L.ln2.data(), w(kFc1W), w(kFc1B), L.h.data(), n, d, ff);
  // h is overwritten by gelu'(h): backward needs only the derivative.
  gelu_forward(L.h.data(), L.a.data(), training ? L.h.data() : nullptr, n * ff);
  if (drop) {
    float* branch = acts_->d_tmp.data();
    linear_forward(L.a.data(), w(kFc2W), w(kFc2B), branch, n, ff, d);
    dropout_apply(branch, n * d, config_.dropout,
                  dropout_key(key.seed, key.step, key.micro, 2 * l + 1,
                              key.row_offset * seq_ * config_.d_model));
    for (std::int64_t i = 0; i < n * d; ++i) out[i] = L.mid[static_cast<std::size_t>(i)] + branch[i];
  } else {
    std::memcpy(out, L.mid.data(), bytes);
    linear_forward(L.a.data(), w(kFc2W), w(kFc2B), out, n, ff, d, true);
  }
}

void Transformer::head_forward() {
  const int base = layout_.blocks().back().first_param;
  const std::int64_t n = batch_ * seq_, d = config_.d_model;
  if (half() && config_.kind == ModelConfig::Kind::lm) return lm_head_forward_half();
  layernorm_forward(acts_->resid.back().data(), param(base, false), param(base + 1, false),
                    acts_->lnf.data(), acts_->lnf_mean.data(), acts_->lnf_rstd.data(), n, d);
  if (config_.kind == ModelConfig::Kind::lm) {
    const float* head = config_.tie_embeddings ? param(0, false) : param(base + 2, false);
    linear_forward(acts_->lnf.data(), head, nullptr, acts_->logits.data(), n, d,
                   config_.vocab_size);
  } else {
    mean_pool_forward(acts_->lnf.data(), acts_->pooled.data(), batch_, seq_, d);
    linear_forward(acts_->pooled.data(), param(base + 2, false), param(base + 3, false),
                   acts_->logits.data(), batch_, d, config_.num_classes);
  }
}

}  // namespace dtrain::nn
