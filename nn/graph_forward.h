// nn::Graph (nn/graph.h): construction, inputs, forward and the loss
// read-back. Included by the files that instantiate Graph for a device.
//   x_mid = x + drop(proj(attn(norm1(x)))); x_out = x_mid + drop(fc2(act(fc1(norm2(x_mid)))))
#pragma once

#include <algorithm>
#include <cstring>
#include <string>

#include <fmt/format.h>

#include "core/error.h"
#include "nn/dropout.h"
#include "nn/graph.h"
#include "nn/graph_pieces.h"
#include "nn/rotary.h"

namespace dtrain::nn {

template <class K>
Graph<K>::Graph(Device& device, K kernels, const ModelConfig& config, const ParameterLayout& layout,
                std::int64_t batch, std::int64_t seq_len)
    : Model(config, batch, seq_len), device_(device), k_(std::move(kernels)), layout_(layout),
      acts_(device, config, batch, seq_len,
            K::attention_scratch(batch * config.n_heads, seq_len,
                                 config.n_heads > 0 ? config.d_model / config.n_heads : 0),
            MlpStrides{K::row_stride(config.fc1_width(), config.d_model), K::row_stride(config.d_ff, config.d_model)}),
      inputs_(device, config.input == ModelConfig::Input::tokens ? static_cast<std::size_t>(batch * seq_len) : 0,
              config.input == ModelConfig::Input::patches
                  ? static_cast<std::size_t>(batch * seq_len * config.patch_dim)
                  : 0,
              static_cast<std::size_t>(config.kind == ModelConfig::Kind::lm ? batch * seq_len : batch)) {
  if (config.n_heads <= 0 || config.d_model % config.n_heads != 0) {
    throw ConfigError("model.n_heads", fmt::format("{} heads do not divide d_model {}", config.n_heads,
                                                   config.d_model));
  }
  if (seq_len > config.max_seq_len) {
    throw ConfigError("model.max_seq_len", fmt::format("sequences of {} are longer than max_seq_len {}",
                                                       seq_len, config.max_seq_len));
  }
  if (config.n_kv_heads < 0 || config.n_heads % config.kv_heads() != 0) {
    throw ConfigError("model.n_kv_heads", fmt::format("{} key/value heads do not divide n_heads {}",
                                                      config.kv_heads(), config.n_heads));
  }
  if (config.position == ModelConfig::Position::rope) {
    const std::int64_t hd = config.head_dim();
    if (hd % 2 != 0) throw ConfigError("model.position", fmt::format("rope needs an even head size, not {}", hd));
    if (!(config.rope_theta > 0)) throw ConfigError("model.rope_theta", "must be > 0");
    const auto table = static_cast<std::size_t>(config.max_seq_len * hd / 2);
    rope_cos_ = DeviceArray<float>(device, table);  // filled at bind (a dry run's graph counts, never binds)
    rope_sin_ = DeviceArray<float>(device, table);
  }
  lp_ = layer_params(config);
  final_norm_ = final_norm_params(config);
  set_span(Span{batch, seq_len, 0});
  reset_result();
}

template <class K>
void Graph<K>::set_span(Span span) {
  span_ = span;
  attn_shape_ = AttentionShape{span.batch, span.seq, config().n_heads, config().d_model / config().n_heads, lm(),
                               config().kv_heads()};
}

template <class K>
void Graph<K>::bind(const BlockPointers& pointers) {
  DTRAIN_CHECK(static_cast<int>(pointers.params.size()) == layout_.num_blocks() &&
                   static_cast<int>(pointers.grads.size()) == layout_.num_blocks(),
               "bind: {} blocks expected", layout_.num_blocks());
  DTRAIN_CHECK(kF32 || static_cast<int>(pointers.compute.size()) == layout_.num_blocks(),
               "bind: {} compute copies expected for {} compute", layout_.num_blocks(),
               dtype_name(config().compute));
  ptrs_ = pointers;
  if (rope_cos_.size() != 0 && !rope_filled_) {
    const ModelConfig& c = config();
    HostArray<float> cos(device_, rope_cos_.size()), sin(device_, rope_sin_.size());
    rope_table(c.rope_theta, c.head_dim(), c.max_seq_len, cos.data(), sin.data());
    device_.copy(rope_cos_.data(), cos.data(), cos.bytes());
    device_.copy(rope_sin_.data(), sin.data(), sin.bytes());
    device_.synchronize();  // the host tables go out of scope
    rope_filled_ = true;
  }
}

template <class K>
float* Graph<K>::param(int index, bool grad) const {
  const ParamSpec& spec = layout_.params()[static_cast<std::size_t>(index)];
  const auto b = static_cast<std::size_t>(spec.block);
  return (grad ? ptrs_.grads[b] : ptrs_.params[b]) + spec.offset;
}

template <class K>
const typename Graph<K>::T* Graph<K>::matrix(int index) const {
  if constexpr (kF32) {
    return param(index, false);
  } else {
    const ParamSpec& spec = layout_.params()[static_cast<std::size_t>(index)];
    return ptrs_.compute[static_cast<std::size_t>(spec.block)] + spec.offset;
  }
}

template <class K>
std::uint64_t Graph<K>::weights_version(int index) const {
  // Decoding multiplies a few rows at a time, each count a new shape: copies
  // of every weight per shape would not pay for themselves.
  if (decoding_ || ptrs_.weights_version == nullptr) return 0;
  return ptrs_.weights_version[static_cast<std::size_t>(layout_.params()[static_cast<std::size_t>(index)].block)];
}

template <class K>
const typename Graph<K>::T* Graph<K>::as_storage(const float* x, T* buffer, std::int64_t n) {
  if constexpr (kF32) {
    (void)buffer;
    (void)n;
    return x;
  } else {
    k_.to_storage(x, buffer, n);
    return buffer;
  }
}

template <class K>
std::uint64_t Graph<K>::key_for(std::int64_t site) const {
  return dropout_key(key_.seed, key_.step, key_.micro, site, key_.row_offset * span_.seq * config().d_model);
}

// Checks every token and target on the host (a bad token would make the
// embedding's backward write outside its table on any device), copying them
// into the next host slot, and queues their copy to the device.
template <class K>
void Graph<K>::stage(const ModelInputs& in, bool with_targets) {
  GraphInputs::Slot& slot = inputs_.slots[inputs_.next];
  inputs_.next ^= 1;
  if (slot.copied && !slot.copied->wait_until(Fence::Clock::now() + device_.timeout())) {
    throw TimeoutError(fmt::format("{}: the copy of the inputs two micro-batches back did not finish within {} ms",
                                   device_.name(), device_.timeout().count()));
  }
  const ModelConfig& c = config();
  if (c.input == ModelConfig::Input::tokens) {
    DTRAIN_CHECK(in.tokens != nullptr, "token model given no tokens");
    for (std::int64_t i = 0; i < tokens(); ++i) {
      const std::int32_t tok = in.tokens[i];
      if (tok < 0 || tok >= c.vocab_size) {
        throw DataError(fmt::format("token {} at batch row {}, position {} is outside the vocabulary [0, {}); "
                                    "check model.vocab_size against the data",
                                    tok, i / span_.seq, i % span_.seq + span_.position, c.vocab_size));
      }
      slot.tokens.data()[i] = tok;
    }
    device_.copy(inputs_.tokens.data(), slot.tokens.data(), static_cast<std::size_t>(tokens()) * sizeof(std::int32_t));
  } else {
    DTRAIN_CHECK(in.patches != nullptr, "patch model given no patches");
    std::memcpy(slot.patches.data(), in.patches, slot.patches.bytes());
    device_.copy(inputs_.patches.data(), slot.patches.data(), inputs_.patches.bytes());
  }
  if (!with_targets) {
    slot.copied = device_.fence();
    return;
  }
  DTRAIN_CHECK(in.targets != nullptr, "forward given no targets");
  for (std::int64_t i = 0; i < rows(); ++i) {
    const std::int32_t target = in.targets[i];
    if (target < 0 || target >= c.outputs()) {
      const std::string where = lm() ? fmt::format("batch row {}, position {}", i / span_.seq, i % span_.seq)
                                     : fmt::format("batch row {}", i);
      throw DataError(fmt::format("target {} at {} is outside [0, {}): check the labels against "
                                  "model.num_classes / model.vocab_size",
                                  target, where, c.outputs()));
    }
    slot.targets.data()[i] = target;
  }
  device_.copy(inputs_.targets.data(), slot.targets.data(), inputs_.targets.bytes());
  slot.copied = device_.fence();
}

template <class K>
void Graph<K>::reset_result() {
  device_.zero(inputs_.totals.data(), inputs_.totals.bytes());
  scored_ = 0;
}

template <class K>
ForwardResult Graph<K>::collect() {
  device_.copy(inputs_.host_totals.data(), inputs_.totals.data(), inputs_.totals.bytes());
  device_.synchronize();
  const CrossEntropyTotals t = *inputs_.host_totals.data();
  ForwardResult out;
  out.count = scored_;
  out.correct = static_cast<std::int64_t>(t.correct);
  out.loss = scored_ > 0 ? static_cast<float>(t.loss_sum / static_cast<double>(scored_)) : 0.0f;
  return out;
}

// The head block's after_forward hook is the caller's.
template <class K>
void Graph<K>::forward_blocks(BlockHooks& hooks, bool training, float* host_logits) {
  DTRAIN_CHECK(!ptrs_.params.empty(), "forward before bind");
  hooks.before_forward(0);
  embed_forward(training);
  hooks.after_forward(0);
  for (int l = 0; l < config().n_layers; ++l) {
    hooks.before_forward(l + 1);
    layer_forward(l, training);
    hooks.after_forward(l + 1);
  }
  hooks.before_forward(layout_.num_blocks() - 1);
  head_forward(host_logits);
}

template <class K>
void Graph<K>::forward(const ModelInputs& inputs, BlockHooks& hooks, bool training, const StepKey& key) {
  set_span(Span{batch(), seq_len(), 0});
  decoding_ = false;
  stage(inputs, true);
  key_ = key;
  dropout_active_ = training && config().dropout > 0.0f;
  forward_blocks(hooks, training, nullptr);
  hooks.after_forward(layout_.num_blocks() - 1);
  scored_ += rows();
}

template <class K>
void Graph<K>::infer(const ModelInputs& inputs, BlockHooks& hooks, float* logits) {
  set_span(Span{batch(), seq_len(), 0});
  decoding_ = false;
  stage(inputs, false);
  key_ = StepKey{};
  dropout_active_ = false;
  forward_blocks(hooks, false, logits);
  hooks.after_forward(layout_.num_blocks() - 1);
  device_.synchronize();
}

template <class K>
void Graph<K>::decode(const std::int32_t* tokens_in, std::int64_t n, std::int64_t position, float* logits) {
  constexpr bool kCanDecode = requires(K k, const AttentionShape& s, const T* in, T* io, float* f) {
    k.attention_cached(s, std::int64_t{0}, std::int64_t{0}, in, io, io, io, f);
  };
  if constexpr (!kCanDecode) {
    (void)tokens_in, (void)n, (void)position, (void)logits;
    throw Error(fmt::format("decoding with a key/value cache runs on the CPU, not on {}", device_.name()));
  } else {
    const ModelConfig& c = config();
    if (!lm() || c.input != ModelConfig::Input::tokens) throw Error("decoding needs a token language model (lm)");
    DTRAIN_CHECK(n > 0 && n <= seq_len(), "decode of {} tokens on a model of {} positions per pass", n, seq_len());
    if (position < 0 || position + n > c.max_seq_len) {
      throw ConfigError("model.max_seq_len", fmt::format("positions {} .. {} are past the model's {}", position,
                                                         position + n - 1, c.max_seq_len));
    }
    if (k_cache_.size() == 0) {  // grouped-query attention caches one head per group
      const auto cache = static_cast<std::size_t>(c.n_layers * c.max_seq_len * c.kv_heads() * c.head_dim());
      k_cache_ = DeviceArray<T>(device_, cache);
      v_cache_ = DeviceArray<T>(device_, cache);
      cache_scores_ = DeviceArray<float>(device_, static_cast<std::size_t>(c.max_seq_len));
    }
    set_span(Span{1, n, position});
    decoding_ = true;
    dropout_active_ = false;
    stage(ModelInputs{tokens_in, nullptr, nullptr}, false);
    BlockHooks none;
    forward_blocks(none, false, logits);
    device_.synchronize();
    decoding_ = false;
  }
}

template <class K>
void Graph<K>::embed_forward(bool training) {
  const ModelConfig& c = config();
  const bool by_token = c.input == ModelConfig::Input::tokens;
  // Learned positions follow the embedding (rotary ones rotate q and k in the attention).
  const bool learned = c.position == ModelConfig::Position::learned;
  const float* pos = learned ? param(by_token ? 1 : 2, false) + span_.position * c.d_model : nullptr;
  float* out = acts_.resid[0].data();
  if (by_token) {
    k_.token_embedding_forward(inputs_.tokens.data(), param(0, false), pos, out, span_.batch, span_.seq, c.d_model,
                               c.vocab_size);
  } else {
    k_.patch_embedding_forward(inputs_.patches.data(), param(0, false), param(1, false), pos, out, span_.batch,
                               span_.seq, c.d_model, c.patch_dim);
  }
  if (training && c.dropout > 0.0f) k_.dropout(out, tokens() * c.d_model, c.dropout, key_for(kEmbedDropoutSite));
}

template <class K>
void Graph<K>::residual_branch(const T* x, int weight, const float* bias, const float* base, float* out,
                               std::int64_t in, std::int64_t site, std::int64_t x_stride) {
  const std::int64_t n = tokens(), d = config().d_model;
  const LinearRows rows{.in = x_stride};
  if (dropout_active_) {  // the branch needs its own buffer to be dropped before the residual add
    float* branch = acts_.d_tmp.data();
    k_.linear_forward(x, matrix(weight), bias, branch, n, in, d, false, weights_version(weight), rows);
    k_.dropout(branch, n * d, config().dropout, key_for(site));
    k_.residual(base, branch, out, n * d);
    return;
  }
  // The residual is added by the GEMM's accumulation into the copy of base
  // that the LayerNorm before it wrote (residual_copy).
  k_.linear_forward(x, matrix(weight), bias, out, n, in, d, true, weights_version(weight), rows);
}

template <class K>
void Graph<K>::layer_forward(int l, bool training) {
  Layer& L = acts_.layer(l);
  const int base = layout_.blocks()[static_cast<std::size_t>(l + 1)].first_param;
  const std::int64_t d = config().d_model;
  const float* x = acts_.resid[static_cast<std::size_t>(l)].data();
  float* out = acts_.resid[static_cast<std::size_t>(l) + 1].data();
  norm_forward(base, lp_.norm1, x, L.norm1.y.data(), L.norm1.mean.data(), L.norm1.rstd.data(),
               residual_copy(L.mid.data()));
  attention_forward(l, base, L);
  residual_branch(L.attn.out.data(), base + lp_.proj.weight, param_at(base, lp_.proj.bias, false), x, L.mid.data(),
                  d, 2 * l);
  norm_forward(base, lp_.norm2, L.mid.data(), L.norm2.y.data(), L.norm2.mean.data(), L.norm2.rstd.data(),
               residual_copy(out));
  mlp_forward(base, L, training);
  residual_branch(acts_.mlp_out(L), base + lp_.fc2.weight, param_at(base, lp_.fc2.bias, false), L.mid.data(), out,
                  config().d_ff, 2 * l + 1, acts_.strides.a);
}

template <class K>
int Graph<K>::head_param(int k) const {
  return layout_.blocks().back().first_param + (final_norm_.bias >= 0 ? 2 : 1) + k;
}

// lm: logits (f32) = normf(x) (storage T) . W^T, W the head or the tied
// embedding, one tile of rows at a time (ModelConfig::logits_tile_rows),
// each tile's loss taken (or its logits copied out) before the next tile
// reuses the buffer. The classifier's small head stays f32 in every
// precision and is one tile.
template <class K>
void Graph<K>::head_forward(float* host_logits) {
  const int base = layout_.blocks().back().first_param;
  const std::int64_t n = tokens(), d = config().d_model, v = config().outputs();
  const float* x = acts_.resid.back().data();
  auto finish = [&](std::int64_t first, std::int64_t count) {
    if (host_logits != nullptr) {
      device_.copy(host_logits + first * v, acts_.logits.data(), static_cast<std::size_t>(count * v) * sizeof(float));
    } else {
      k_.cross_entropy_forward(acts_.logits.data(), inputs_.targets.data() + first, acts_.logits.data(), count, v,
                               inputs_.totals.data());
    }
  };
  if (lm()) {
    norm_forward(base, final_norm_, x, acts_.lnf.data(), acts_.lnf_mean.data(), acts_.lnf_rstd.data(), nullptr);
    for (std::int64_t first = 0; first < n; first += acts_.logits_rows) {
      const std::int64_t count = std::min(acts_.logits_rows, n - first);
      head_logits(first, count);
      finish(first, count);
    }
    return;
  }
  norm_forward(base, final_norm_, x, acts_.lnf32.data(), acts_.lnf_mean.data(), acts_.lnf_rstd.data(), nullptr);
  k_.mean_pool_forward(acts_.lnf32.data(), acts_.pooled.data(), span_.batch, span_.seq, d);
  k_.linear_forward(static_cast<const float*>(acts_.pooled.data()), param(head_param(0), false),
                    param(head_param(1), false), acts_.logits.data(), span_.batch, d, v, false,
                    weights_version(head_param(0)));
  finish(0, span_.batch);
}

template <class K>
void Graph<K>::head_logits(std::int64_t first, std::int64_t count) {
  const std::int64_t d = config().d_model;
  const int index = config().tie_embeddings ? 0 : head_param(0);
  k_.linear_forward(acts_.lnf.data() + first * d, matrix(index), static_cast<const float*>(nullptr),
                    acts_.logits.data(), count, d, config().vocab_size, false, weights_version(index));
}

}  // namespace dtrain::nn
