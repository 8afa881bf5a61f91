#include "export/onnx_layers.h"

#include <cmath>
#include <limits>

#include "export/quantize.h"
#include "nn/layernorm.h"

namespace dtrain::exporter {

RuntimeShapes runtime_shapes(GraphBuilder& g, const std::string& input, std::int64_t d, std::int64_t heads,
                             bool causal) {
  const std::int64_t head_dim = d / heads;
  RuntimeShapes s;
  // Shape's start/end attributes (opset 15) take the leading dims of either input.
  s.batch_seq = g.node("Shape", {input}, "shape.batch_seq", {{"start", std::int64_t{0}}, {"end", std::int64_t{2}}});
  s.seq = g.node("Shape", {input}, "shape.seq", {{"start", std::int64_t{1}}, {"end", std::int64_t{2}}});
  s.rows_by_d = g.constant_i64("shape.rows_by_d", {-1, d}, {2});
  s.by_d = g.node("Concat", {s.batch_seq, g.constant_i64("shape.d", {d}, {1})}, "shape.by_d",
                  {{"axis", std::int64_t{0}}});
  s.qkv_heads = g.node("Concat", {s.batch_seq, g.constant_i64("shape.3heads_head_dim", {3 * heads, head_dim}, {2})},
                       "shape.qkv_heads", {{"axis", std::int64_t{0}}});
  s.head_split = g.constant_i64("shape.head_split", {heads, heads, heads}, {3});
  s.axis0 = g.constant_i64("axes.0", {0}, {1});
  // As nn/attention.cpp computes it, in float.
  s.score_scale = g.constant_f32("attn.scale", 1.0f / std::sqrt(static_cast<float>(head_dim)));
  if (causal) {
    // future[i, j] = i < j over positions 0..seq-1 of this run's seq.
    const std::string seq_scalar = g.node("Squeeze", {s.seq, s.axis0}, "shape.seq_scalar");
    const std::string positions = g.node(
        "Range", {g.constant_i64("const.0", {0}, {}), seq_scalar, g.constant_i64("const.1", {1}, {})}, "mask.positions");
    const std::string rows = g.node("Unsqueeze", {positions, g.constant_i64("axes.1", {1}, {1})}, "mask.rows");
    const std::string cols = g.node("Unsqueeze", {positions, s.axis0}, "mask.cols");
    s.future = g.node("Less", {rows, cols}, "mask.future");
    s.neg_inf = g.constant_f32("mask.neg_inf", -std::numeric_limits<float>::infinity());
  }
  return s;
}

std::string layer_norm(GraphBuilder& g, const std::string& x, const std::string& prefix, const std::string& out) {
  return g.node("LayerNormalization", {x, prefix + ".weight", prefix + ".bias"}, out,
                {{"axis", std::int64_t{-1}}, {"epsilon", nn::kLayerNormEps}});
}

std::string linear(GraphBuilder& g, const std::string& x, const std::string& weight, const std::string& bias,
                   bool int8, const std::string& out) {
  if (int8) return int8_linear(g, x, weight, bias, out);
  std::vector<std::string> inputs = {x, weight};
  if (!bias.empty()) inputs.push_back(bias);
  return g.node("Gemm", inputs, out, {{"transB", std::int64_t{1}}});
}

std::string gelu(GraphBuilder& g, const std::string& x, const std::string& out) {
  const std::string inv_sqrt2 = out + ".inv_sqrt2", one = out + ".one", half = out + ".half";
  g.constant_f32(inv_sqrt2, 0.70710678118654752f);
  g.constant_f32(one, 1.0f);
  g.constant_f32(half, 0.5f);
  const std::string erf = g.node("Erf", {g.node("Mul", {x, inv_sqrt2}, out + ".scaled")}, out + ".erf");
  const std::string cdf = g.node("Add", {erf, one}, out + ".one_plus_erf");
  const std::string half_x = g.node("Mul", {x, half}, out + ".half_x");
  return g.node("Mul", {half_x, cdf}, out);
}

std::string attention(GraphBuilder& g, const RuntimeShapes& s, const std::string& qkv, const std::string& out) {
  // [N, 3d] -> [batch, seq, 3 * heads, head_dim] -> [batch, 3 * heads, seq, head_dim] -> q, k, v.
  const std::string heads = g.node("Reshape", {qkv, s.qkv_heads}, out + ".qkv_heads");
  const std::string by_head = g.node("Transpose", {heads}, out + ".by_head", {{"perm", std::vector<std::int64_t>{0, 2, 1, 3}}});
  const std::string q = out + ".q", k = out + ".k", v = out + ".v";
  g.node("Split", {by_head, s.head_split}, std::vector<std::string>{q, k, v}, {{"axis", std::int64_t{1}}});
  const std::string k_t = g.node("Transpose", {k}, out + ".k_t", {{"perm", std::vector<std::int64_t>{0, 1, 3, 2}}});
  const std::string raw = g.node("MatMul", {q, k_t}, out + ".qk");
  std::string scores = g.node("Mul", {raw, s.score_scale}, out + ".scores");
  if (!s.future.empty()) scores = g.node("Where", {s.future, s.neg_inf, scores}, out + ".masked_scores");
  const std::string probs = g.node("Softmax", {scores}, out + ".probs", {{"axis", std::int64_t{-1}}});
  const std::string o = g.node("MatMul", {probs, v}, out + ".heads_out");
  const std::string by_token = g.node("Transpose", {o}, out + ".by_token", {{"perm", std::vector<std::int64_t>{0, 2, 1, 3}}});
  return g.node("Reshape", {by_token, s.rows_by_d}, out);
}

}  // namespace dtrain::exporter
