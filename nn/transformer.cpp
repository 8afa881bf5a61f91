#include "nn/transformer.h"

#include "nn/blocks.h"

#include <algorithm>

#include <fmt/format.h>

namespace dtrain::nn {

std::int64_t ModelConfig::logits_rows(std::int64_t tokens) const {
  const std::int64_t fit = std::max<std::int64_t>(1, kLogitsTileBytes / (vocab_size * std::int64_t{4}));
  return std::min(tokens, logits_tile_rows > 0 ? logits_tile_rows : fit);
}

std::int64_t ModelConfig::matmul_params() const {
  const std::int64_t d = d_model;
  const std::int64_t per_layer = qkv_width() * d + d * d + fc1_width() * d + d * d_ff;
  return n_layers * per_layer + outputs() * d;
}

double ModelConfig::flops_per_token(std::int64_t seq_len) const {
  return 6.0 * static_cast<double>(matmul_params()) +
         12.0 * static_cast<double>(n_layers * d_model * seq_len);
}

ParameterLayout declare_parameters(const ModelConfig& c) {
  ParameterLayout layout;
  layout.begin_block("embeddings");
  if (c.input == ModelConfig::Input::tokens) {
    layout.add("tok_emb", {c.vocab_size, c.d_model}, Init::normal, true);
  } else {
    layout.add("patch.weight", {c.d_model, c.patch_dim}, Init::normal, true);
    layout.add("patch.bias", {c.d_model}, Init::zeros, false);
  }
  if (c.position == ModelConfig::Position::learned) layout.add("pos_emb", {c.max_seq_len, c.d_model}, Init::normal, true);
  for (std::int64_t l = 0; l < c.n_layers; ++l) {
    layout.begin_block(fmt::format("layer.{}", l));
    declare_layer(layout, fmt::format("layer.{}.", l), c);
  }
  layout.begin_block("head");
  declare_norm(layout, "lnf", c);
  if (c.kind == ModelConfig::Kind::lm) {
    if (!c.tie_embeddings) layout.add("head.weight", {c.vocab_size, c.d_model}, Init::normal, true);
  } else {
    layout.add("cls.weight", {c.num_classes, c.d_model}, Init::normal, true);
    layout.add("cls.bias", {c.num_classes}, Init::zeros, false);
  }
  return layout;
}

ForwardResult forward_once(Model& model, const ModelInputs& inputs, BlockHooks& hooks, bool training,
                           const StepKey& key) {
  model.reset_result();
  model.forward(inputs, hooks, training, key);
  return model.collect();
}

}  // namespace dtrain::nn
