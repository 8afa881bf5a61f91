#include "nn/blocks.h"

namespace dtrain::nn {

NormParams declare_norm(ParameterLayout& layout, const std::string& name, const ModelConfig& c) {
  NormParams p;
  p.weight = layout.add(name + ".weight", {c.d_model}, Init::ones, false);
  if (c.norm == ModelConfig::Norm::layernorm) p.bias = layout.add(name + ".bias", {c.d_model}, Init::zeros, false);
  return p;
}

LinearParams declare_linear(ParameterLayout& layout, const std::string& name, std::int64_t out, std::int64_t in,
                            const ModelConfig& c) {
  LinearParams p;
  p.weight = layout.add(name + ".weight", {out, in}, Init::normal, true);
  if (c.bias) p.bias = layout.add(name + ".bias", {out}, Init::zeros, false);
  return p;
}

LayerParams declare_layer(ParameterLayout& layout, const std::string& prefix, const ModelConfig& c) {
  LayerParams p;
  p.norm1 = declare_norm(layout, prefix + "ln1", c);
  p.qkv = declare_linear(layout, prefix + "qkv", c.qkv_width(), c.d_model, c);
  p.proj = declare_linear(layout, prefix + "proj", c.d_model, c.d_model, c);
  p.norm2 = declare_norm(layout, prefix + "ln2", c);
  p.fc1 = declare_linear(layout, prefix + "fc1", c.fc1_width(), c.d_model, c);
  p.fc2 = declare_linear(layout, prefix + "fc2", c.d_model, c.d_ff, c);
  return p;
}

LayerParams layer_params(const ModelConfig& c) {
  ParameterLayout layout;
  layout.begin_block("layer");
  return declare_layer(layout, "", c);
}

NormParams final_norm_params(const ModelConfig& c) {
  ParameterLayout layout;
  layout.begin_block("head");
  return declare_norm(layout, "lnf", c);
}

}  // namespace dtrain::nn
