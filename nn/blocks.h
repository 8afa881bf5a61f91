// The pieces of a Transformer block and the parameters each declares: a
// norm (LayerNorm: weight and bias; RMSNorm: weight), the attention (the QKV
// projection and the output projection; its position encoding, learned or
// rotary, has no parameters in the block), the MLP (fc1: d_ff columns, or
// the gate's and the up projection's for SwiGLU; fc2), linear biases only
// with model.bias. declare_parameters (nn/transformer.h) composes a layer
// block from them, and the graph (nn/graph.h) finds each piece's parameters
// through the same declarations, so nothing spells out a fixed order twice.
#pragma once

#include <string>

#include "nn/parameters.h"
#include "nn/transformer.h"

namespace dtrain::nn {

// Indices of a piece's parameters (-1: the piece has none there).
struct NormParams {
  int weight = -1, bias = -1;
};
struct LinearParams {
  int weight = -1, bias = -1;
};
struct LayerParams {
  NormParams norm1;
  LinearParams qkv, proj;
  NormParams norm2;
  LinearParams fc1, fc2;
};

// Each adds its parameters to the layout's current block ("<name>.weight",
// "<name>.bias") and returns their indices in the layout.
NormParams declare_norm(ParameterLayout& layout, const std::string& name, const ModelConfig& config);
LinearParams declare_linear(ParameterLayout& layout, const std::string& name, std::int64_t out, std::int64_t in,
                            const ModelConfig& config);
LayerParams declare_layer(ParameterLayout& layout, const std::string& prefix, const ModelConfig& config);

// The same indices counted from the first parameter of their block: a
// layer block's, and the head block's final norm.
LayerParams layer_params(const ModelConfig& config);
NormParams final_norm_params(const ModelConfig& config);

}  // namespace dtrain::nn
