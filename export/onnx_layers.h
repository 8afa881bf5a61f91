// The layers of dtrain's Transformers (nn/*.h) as standard ONNX operators
// (opset 17), each computing what its nn/ counterpart computes in f32. Values
// flow as dtrain's do: the residual stream is [N, d] with N = batch * seq rows
// (row b * seq + t), so every Linear is one Gemm (or its int8 form) on the
// weight exactly as dtrain stores it, [out, in]. Only attention and the
// classifier's pooling look at [batch, seq, ...], through shapes computed
// from the input at run time, so batch and sequence length stay dynamic.
//
// Each function appends nodes to the GraphBuilder and returns the name of its
// result; weights are initializers named as dtrain names the parameters
// (nn/transformer.h), added beforehand. Value names start with `out`.
#pragma once

#include <cstdint>
#include <string>

#include "export/onnx_graph.h"

namespace dtrain::exporter {

// Shape values computed once from the graph input and shared by the layers.
struct RuntimeShapes {
  std::string batch_seq;    // int64 [2]: batch, seq
  std::string seq;          // int64 [1]: seq
  std::string rows_by_d;    // int64 [2]: -1, d (back to the residual stream's [N, d])
  std::string by_d;         // int64 [3]: batch, seq, d
  std::string qkv_heads;    // int64 [4]: batch, seq, 3 * heads, head_dim
  std::string head_split;   // int64 [3]: heads, heads, heads (Split of q | k | v)
  std::string axis0;        // int64 [1]: 0 (axes of Slice, Squeeze, Unsqueeze)
  std::string score_scale;  // float scalar 1 / sqrt(head_dim)
  std::string future;       // lm: bool [seq, seq], true where column j > row i (masked); else ""
  std::string neg_inf;      // lm: float scalar -inf
};

// Adds the RuntimeShapes of `input` (tokens [batch, seq] or patches [batch,
// seq, patch_dim]) for d_model d and `heads` heads; `causal` adds the mask.
RuntimeShapes runtime_shapes(GraphBuilder& g, const std::string& input, std::int64_t d, std::int64_t heads,
                             bool causal);

// LayerNorm over the last axis with weight prefix.weight, bias prefix.bias,
// eps 1e-5 (nn/layernorm.h): LayerNormalization.
std::string layer_norm(GraphBuilder& g, const std::string& x, const std::string& prefix, const std::string& out);

// x [N, in] W^T + b for the Linear `weight` [out, in] and `bias` [out] ("" for
// none): Gemm with transB = 1, or with int8 the dynamic quantized form of
// export/quantize.h.
std::string linear(GraphBuilder& g, const std::string& x, const std::string& weight, const std::string& bias,
                   bool int8, const std::string& out);

// Exact GELU, 0.5 x (1 + erf(x / sqrt(2))) (nn/gelu.h): opset 17 has no Gelu
// operator, so Mul, Erf, Add, Mul, Mul.
std::string gelu(GraphBuilder& g, const std::string& x, const std::string& out);

// Self-attention core of nn/attention.h on qkv [N, 3d] laid out q | k | v,
// each heads x head_dim: S = Q K^T / sqrt(head_dim), with the lm's causal
// mask (columns after the row set to -inf, so softmax gives them exactly 0),
// P = softmax(S) in f32, O = P V; returns O as [N, d].
std::string attention(GraphBuilder& g, const RuntimeShapes& s, const std::string& qkv, const std::string& out);

}  // namespace dtrain::exporter
