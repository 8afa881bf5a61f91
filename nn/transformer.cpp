#include "nn/transformer.h"

#include <algorithm>

#include <fmt/format.h>

namespace dtrain::nn {

std::int64_t ModelConfig::logits_rows(std::int64_t tokens) const {
  const std::int64_t fit = std::max<std::int64_t>(1, kLogitsTileBytes / (vocab_size * std::int64_t{4}));
  return std::min(tokens, logits_tile_rows > 0 ? logits_tile_rows : fit);
}

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

ForwardResult forward_once(Model& model, const ModelInputs& inputs, BlockHooks& hooks, bool training,
                           const StepKey& key) {
  model.reset_result();
  model.forward(inputs, hooks, training, key);
  return model.collect();
}

}  // namespace dtrain::nn
