// nn::cuda::Transformer: construction, inputs, the f32 forward and the loss
// read-back. Each layer mirrors nn/transformer.cpp line for line with the
// nn/cuda kernel of the same name.
#include "nn/cuda/transformer.h"

#include <cstring>
#include <string>

#include <fmt/format.h>

#include "core/error.h"
#include "nn/cuda/attention.h"
#include "nn/cuda/check.h"
#include "nn/cuda/dropout.h"
#include "nn/cuda/embedding.h"
#include "nn/cuda/gelu.h"
#include "nn/cuda/layernorm.h"
#include "nn/cuda/linear.h"
#include "nn/cuda/matmul.h"
#include "nn/cuda/residual.h"
#include "nn/cuda/transformer_activations.h"
#include "nn/dropout.h"

namespace dtrain::nn::cuda {

Transformer::Transformer(const ModelConfig& config, const ParameterLayout& layout,
                         std::int64_t batch, std::int64_t seq_len, cudaStream_t stream)
    : config_(config), layout_(layout), batch_(batch), seq_(seq_len), stream_(stream) {
  DTRAIN_CHECK(config.d_model % config.n_heads == 0, "d_model {} vs n_heads {}", config.d_model,
               config.n_heads);
  DTRAIN_CHECK(seq_len <= config.max_seq_len, "seq_len {} > max_seq_len {}", seq_len,
               config.max_seq_len);
  DTRAIN_CHECK(config.compute == DType::f32 || config.compute == DType::bf16 ||
                   config.compute == DType::f16,
               "compute type {} is not f32, bf16 or f16", dtype_name(config.compute));
  attn_shape_ = AttentionShape{batch, seq_len, config.n_heads, config.d_model / config.n_heads,
                               config.kind == ModelConfig::Kind::lm};
  blas_ = std::make_unique<Blas>();
  const auto bt = static_cast<std::size_t>(batch * seq_len);
  const bool tokens = config.input == ModelConfig::Input::tokens;
  inputs_ = std::make_unique<Inputs>(tokens ? bt : 0,
                                     tokens ? 0 : bt * static_cast<std::size_t>(config.patch_dim),
                                     static_cast<std::size_t>(rows()));
  acts_ = std::make_unique<Activations>(config, batch, seq_len);
  if (half()) half_ = std::make_unique<HalfActivations>(config, batch, seq_len);
  reset_result();
}

Transformer::~Transformer() = default;

std::int64_t Transformer::activation_bytes() const {
  return acts_->bytes() + (half_ ? half_->bytes() : 0) + inputs_->bytes();
}

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

const std::uint16_t* Transformer::param16(int index) const {
  const ParamSpec& spec = layout_.params()[static_cast<std::size_t>(index)];
  return ptrs_.compute[static_cast<std::size_t>(spec.block)] + spec.offset;
}

std::uint64_t Transformer::key_for(const StepKey& key, std::int64_t site) const {
  return dropout_key(key.seed, key.step, key.micro, site, key.row_offset * seq_ * config_.d_model);
}

// Copies the host inputs into the next pinned slot (checking every token, as
// the CPU embedding does, before a bad one can reach the device) and queues
// their copies to the device.
void Transformer::stage_inputs(const ModelInputs& in) {
  Inputs& I = *inputs_;
  Inputs::Slot& slot = I.slots[I.next];
  I.next ^= 1;
  DTRAIN_CUDA_TRY(cudaEventSynchronize(slot.copied));  // its previous copy has left the slot
  const std::int64_t bt = batch_ * seq_;
  if (config_.input == ModelConfig::Input::tokens) {
    DTRAIN_CHECK(in.tokens != nullptr, "token model given no tokens");
    std::int32_t* staged = slot.tokens.data();
    for (std::int64_t i = 0; i < bt; ++i) {
      const std::int32_t tok = in.tokens[i];
      if (tok < 0 || tok >= config_.vocab_size) {
        throw DataError(fmt::format(
            "token {} at batch row {}, position {} is outside the vocabulary [0, {}); "
            "check model.vocab_size against the data",
            tok, i / seq_, i % seq_, config_.vocab_size));
      }
      staged[i] = tok;
    }
    DTRAIN_CUDA_TRY(cudaMemcpyAsync(I.tokens.data(), staged, I.tokens.bytes(),
                                    cudaMemcpyHostToDevice, stream_));
  } else {
    DTRAIN_CHECK(in.patches != nullptr, "patch model given no patches");
    std::memcpy(slot.patches.data(), in.patches, I.patches.bytes());
    DTRAIN_CUDA_TRY(cudaMemcpyAsync(I.patches.data(), slot.patches.data(), I.patches.bytes(),
                                    cudaMemcpyHostToDevice, stream_));
  }
  DTRAIN_CHECK(in.targets != nullptr, "forward given no targets");
  std::memcpy(slot.targets.data(), in.targets, I.targets.bytes());
  DTRAIN_CUDA_TRY(cudaMemcpyAsync(I.targets.data(), slot.targets.data(), I.targets.bytes(),
                                  cudaMemcpyHostToDevice, stream_));
  DTRAIN_CUDA_TRY(cudaEventRecord(slot.copied, stream_));
}

void Transformer::reset_result() {
  cross_entropy_reset(inputs_->result.data(), stream_);
  DTRAIN_CUDA_TRY(cudaMemsetAsync(inputs_->bad_index.data(), 0xff, sizeof(std::int32_t), stream_));  // -1
  scored_ = 0;
}

ForwardResult Transformer::collect() {
  Inputs& I = *inputs_;
  I.result.download(I.host_result.data(), stream_);
  I.bad_index.download(I.host_bad_index.data(), stream_);
  DTRAIN_CUDA_TRY(cudaStreamSynchronize(stream_));
  const CrossEntropyDeviceResult r = *I.host_result.data();
  const std::int32_t bad_token = *I.host_bad_index.data();
  if (bad_token >= 0) {  // the host check comes first; this is the device's word for the same
    throw DataError(fmt::format("a token at batch row {}, position {} is outside the vocabulary [0, {}); "
                                "check model.vocab_size against the data",
                                bad_token / seq_, bad_token % seq_, config_.vocab_size));
  }
  if (r.bad_row >= 0) {
    const bool lm = config_.kind == ModelConfig::Kind::lm;
    const std::string where = lm ? fmt::format("batch row {}, position {}", r.bad_row / seq_, r.bad_row % seq_)
                                 : fmt::format("batch row {}", r.bad_row);
    throw DataError(fmt::format("a target at {} is outside [0, {}): check the labels against "
                                "model.num_classes / model.vocab_size",
                                where, config_.outputs()));
  }
  ForwardResult out;
  out.count = scored_;
  out.correct = static_cast<std::int64_t>(r.correct);
  out.loss = scored_ > 0 ? static_cast<float>(r.loss_sum / static_cast<double>(scored_)) : 0.0f;
  return out;
}

void Transformer::forward(const ModelInputs& inputs, BlockHooks& hooks, bool training,
                          const StepKey& key) {
  DTRAIN_CHECK(!ptrs_.params.empty(), "forward before bind");
  stage_inputs(inputs);
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
  cross_entropy_forward(acts_->logits.data(), inputs_->targets.data(), acts_->logits.data(), rows(),
                        config_.outputs(), inputs_->result.data(), stream_);
  hooks.after_forward(head_block);
  scored_ += rows();
}

void Transformer::embed_forward(const StepKey& key, bool training) {
  const bool tokens = config_.input == ModelConfig::Input::tokens;
  const float* pos = param(tokens ? 1 : 2, false);
  float* out = acts_->resid[0].data();
  const std::int64_t d = config_.d_model;
  if (tokens) {
    token_embedding_forward(inputs_->tokens.data(), param(0, false), pos, out, batch_, seq_, d,
                            config_.vocab_size, inputs_->bad_index.data(), stream_);
  } else {  // the CPU's patch embedding: a Linear, then the positions
    linear_forward(*blas_, inputs_->patches.data(), param(0, false), param(1, false), out,
                   batch_ * seq_, config_.patch_dim, d, false, stream_);
    add_positions_forward(pos, out, batch_, seq_, d, stream_);
  }
  if (training && config_.dropout > 0.0f) {
    dropout_apply(out, batch_ * seq_ * d, config_.dropout, key_for(key, kEmbedDropoutSite), stream_);
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
  Blas& blas = *blas_;

  layernorm_forward(x, w(kLn1W), w(kLn1B), L.ln1.data(), L.ln1_mean.data(), L.ln1_rstd.data(), n, d,
                    stream_);
  linear_forward(blas, L.ln1.data(), w(kQkvW), w(kQkvB), L.qkv.data(), n, d, 3 * d, false, stream_);
  attention_forward(blas, attn_shape_, L.qkv.data(), L.attn.data(),
                    AttentionSaved{L.q.data(), L.k.data(), L.v.data(), L.probs.data()},
                    AttentionScratch{acts_->d_heads.data(), nullptr, nullptr, nullptr, nullptr},
                    stream_);
  if (drop) {  // the branch needs its own buffer to be dropped before the residual add
    float* branch = acts_->d_tmp.data();
    linear_forward(blas, L.attn.data(), w(kProjW), w(kProjB), branch, n, d, d, false, stream_);
    dropout_apply(branch, n * d, config_.dropout, key_for(key, 2 * l), stream_);
    residual_forward(x, branch, L.mid.data(), n * d, stream_);
  } else {  // residual added by the GEMM's accumulation into a copy of x
    DTRAIN_CUDA_TRY(cudaMemcpyAsync(L.mid.data(), x, bytes, cudaMemcpyDeviceToDevice, stream_));
    linear_forward(blas, L.attn.data(), w(kProjW), w(kProjB), L.mid.data(), n, d, d, true, stream_);
  }
  layernorm_forward(L.mid.data(), w(kLn2W), w(kLn2B), L.ln2.data(), L.ln2_mean.data(),
                    L.ln2_rstd.data(), n, d, stream_);
  linear_forward(blas, L.ln2.data(), w(kFc1W), w(kFc1B), L.h.data(), n, d, ff, false, stream_);
  // h is overwritten by gelu'(h): backward needs only the derivative.
  gelu_forward(L.h.data(), L.a.data(), training ? L.h.data() : nullptr, n * ff, stream_);
  if (drop) {
    float* branch = acts_->d_tmp.data();
    linear_forward(blas, L.a.data(), w(kFc2W), w(kFc2B), branch, n, ff, d, false, stream_);
    dropout_apply(branch, n * d, config_.dropout, key_for(key, 2 * l + 1), stream_);
    residual_forward(L.mid.data(), branch, out, n * d, stream_);
  } else {
    DTRAIN_CUDA_TRY(cudaMemcpyAsync(out, L.mid.data(), bytes, cudaMemcpyDeviceToDevice, stream_));
    linear_forward(blas, L.a.data(), w(kFc2W), w(kFc2B), out, n, ff, d, true, stream_);
  }
}

void Transformer::head_forward() {
  const int base = layout_.blocks().back().first_param;
  const std::int64_t n = batch_ * seq_, d = config_.d_model;
  if (half() && config_.kind == ModelConfig::Kind::lm) return lm_head_forward_half();
  layernorm_forward(acts_->resid.back().data(), param(base, false), param(base + 1, false),
                    acts_->lnf.data(), acts_->lnf_mean.data(), acts_->lnf_rstd.data(), n, d,
                    stream_);
  if (config_.kind == ModelConfig::Kind::lm) {
    const float* head = config_.tie_embeddings ? param(0, false) : param(base + 2, false);
    linear_forward(*blas_, acts_->lnf.data(), head, nullptr, acts_->logits.data(), n, d,
                   config_.vocab_size, false, stream_);
  } else {  // the classifier's small head stays f32 in every precision, as on the CPU
    mean_pool_forward(acts_->lnf.data(), acts_->pooled.data(), batch_, seq_, d, stream_);
    linear_forward(*blas_, acts_->pooled.data(), param(base + 2, false), param(base + 3, false),
                   acts_->logits.data(), batch_, d, config_.num_classes, false, stream_);
  }
}

}  // namespace dtrain::nn::cuda
