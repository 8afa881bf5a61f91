#include "export/onnx_layers.h"

#include <cmath>
#include <limits>
#include <vector>

#include "export/quantize.h"
#include "nn/rotary.h"

namespace dtrain::exporter {

namespace {

using nn::ModelConfig;

// The rotary tables as initializers rope.cos and rope.sin, [max_seq_len,
// head_dim]: nn::rope_table's half-width rows written twice, so that one
// Mul rotates both halves of a head.
void rope_tables(GraphBuilder& g, const ModelConfig& c) {
  const std::int64_t hd = c.head_dim(), half = hd / 2, rows = c.max_seq_len;
  std::vector<float> cos(static_cast<std::size_t>(rows * half)), sin(cos.size());
  nn::rope_table(c.rope_theta, hd, rows, cos.data(), sin.data());
  for (const auto& [name, table] : {std::pair{"rope.cos", &cos}, std::pair{"rope.sin", &sin}}) {
    std::vector<float> full(static_cast<std::size_t>(rows * hd));
    for (std::int64_t p = 0; p < rows; ++p) {
      for (std::int64_t i = 0; i < half; ++i) {
        const float v = (*table)[static_cast<std::size_t>(p * half + i)];
        full[static_cast<std::size_t>(p * hd + i)] = v;
        full[static_cast<std::size_t>(p * hd + half + i)] = v;
      }
    }
    g.constant_f32_tensor(name, full, {rows, hd});
  }
}

// x [batch, heads, seq, hd] rotated (nn/rotary.h): x cos + rotate_half(x) sin,
// rotate_half(x) = (-x[half:], x[:half]).
std::string rotate(GraphBuilder& g, const RuntimeShapes& s, const std::string& x, const std::string& out) {
  const std::string lo = out + ".lo", hi = out + ".hi";
  g.node("Split", {x, s.rope_halves}, std::vector<std::string>{lo, hi}, {{"axis", std::int64_t{-1}}});
  const std::string neg_hi = g.node("Neg", {hi}, out + ".neg_hi");
  const std::string turned = g.node("Concat", {neg_hi, lo}, out + ".rotate_half", {{"axis", std::int64_t{-1}}});
  const std::string by_cos = g.node("Mul", {x, s.rope_cos}, out + ".by_cos");
  const std::string by_sin = g.node("Mul", {turned, s.rope_sin}, out + ".by_sin");
  return g.node("Add", {by_cos, by_sin}, out);
}

// kv [batch, Hkv, seq, hd] -> [batch, H, seq, hd], head j repeated at H / Hkv
// consecutive heads (j * group .. (j + 1) * group - 1).
std::string repeat_kv(GraphBuilder& g, const RuntimeShapes& s, const std::string& kv, const std::string& out) {
  const std::string one_group =
      g.node("Unsqueeze", {kv, g.constant_i64(out + ".axis2", {2}, {1})}, out + ".unsqueezed");
  const std::string groups = g.node("Expand", {one_group, s.kv_repeat}, out + ".groups");
  return g.node("Reshape", {groups, s.by_heads}, out);
}

}  // namespace

RuntimeShapes runtime_shapes(GraphBuilder& g, const std::string& input, const ModelConfig& c,
                             const std::string& past) {
  const std::int64_t d = c.d_model, heads = c.n_heads, kv_heads = c.kv_heads(), head_dim = d / heads;
  RuntimeShapes s;
  // Shape's start/end attributes (opset 15) take the leading dims of either input.
  s.batch_seq = g.node("Shape", {input}, "shape.batch_seq", {{"start", std::int64_t{0}}, {"end", std::int64_t{2}}});
  s.seq = g.node("Shape", {input}, "shape.seq", {{"start", std::int64_t{1}}, {"end", std::int64_t{2}}});
  s.rows_by_d = g.constant_i64("shape.rows_by_d", {-1, d}, {2});
  s.by_d = g.node("Concat", {s.batch_seq, g.constant_i64("shape.d", {d}, {1})}, "shape.by_d",
                  {{"axis", std::int64_t{0}}});
  const bool grouped = kv_heads != heads;
  const std::string packed_heads = grouped ? g.constant_i64("shape.qkv_heads_head_dim",
                                                            {heads + 2 * kv_heads, head_dim}, {2})
                                           : g.constant_i64("shape.3heads_head_dim", {3 * heads, head_dim}, {2});
  s.qkv_heads = g.node("Concat", {s.batch_seq, packed_heads}, "shape.qkv_heads", {{"axis", std::int64_t{0}}});
  s.head_split = g.constant_i64("shape.head_split", {heads, kv_heads, kv_heads}, {3});
  s.axis0 = g.constant_i64("axes.0", {0}, {1});
  // As nn/attention.cpp computes it, in float.
  s.score_scale = g.constant_f32("attn.scale", 1.0f / std::sqrt(static_cast<float>(head_dim)));
  if (!past.empty()) {
    s.past = g.node("Shape", {past}, "shape.past", {{"start", std::int64_t{2}}, {"end", std::int64_t{3}}});
    s.end = g.node("Add", {s.past, s.seq}, "shape.end");
    // future[i, j] = i + past < j: row i is the new token at position past + i, column j any cached or new position.
    const std::string past_scalar = g.node("Squeeze", {s.past, s.axis0}, "shape.past_scalar");
    const std::string end_scalar = g.node("Squeeze", {s.end, s.axis0}, "shape.end_scalar");
    const std::string one = g.constant_i64("const.1", {1}, {});
    const std::string row_positions = g.node("Range", {past_scalar, end_scalar, one}, "mask.row_positions");
    const std::string col_positions =
        g.node("Range", {g.constant_i64("const.0", {0}, {}), end_scalar, one}, "mask.col_positions");
    const std::string rows = g.node("Unsqueeze", {row_positions, g.constant_i64("axes.1", {1}, {1})}, "mask.rows");
    const std::string cols = g.node("Unsqueeze", {col_positions, s.axis0}, "mask.cols");
    s.future = g.node("Less", {rows, cols}, "mask.future");
    s.neg_inf = g.constant_f32("mask.neg_inf", -std::numeric_limits<float>::infinity());
  } else if (c.kind == ModelConfig::Kind::lm) {
    // future[i, j] = i < j over positions 0..seq-1 of this run's seq.
    const std::string seq_scalar = g.node("Squeeze", {s.seq, s.axis0}, "shape.seq_scalar");
    const std::string positions = g.node(
        "Range", {g.constant_i64("const.0", {0}, {}), seq_scalar, g.constant_i64("const.1", {1}, {})}, "mask.positions");
    const std::string rows = g.node("Unsqueeze", {positions, g.constant_i64("axes.1", {1}, {1})}, "mask.rows");
    const std::string cols = g.node("Unsqueeze", {positions, s.axis0}, "mask.cols");
    s.future = g.node("Less", {rows, cols}, "mask.future");
    s.neg_inf = g.constant_f32("mask.neg_inf", -std::numeric_limits<float>::infinity());
  }
  if (grouped) {
    s.kv_repeat = g.constant_i64("shape.kv_repeat", {1, 1, heads / kv_heads, 1, 1}, {5});
    s.by_heads = g.constant_i64("shape.by_heads", {0, heads, -1, head_dim}, {4});
  }
  if (c.position == ModelConfig::Position::rope) {
    rope_tables(g, c);
    // Rows 0 .. seq - 1, or past .. past + seq - 1 in the cached decoder.
    const std::string start = past.empty() ? g.constant_i64("rope.start", {0}, {1}) : s.past;
    const std::string end = past.empty() ? s.seq : s.end;
    s.rope_cos = g.node("Slice", {"rope.cos", start, end, s.axis0}, "rope.cos_seq");
    s.rope_sin = g.node("Slice", {"rope.sin", start, end, s.axis0}, "rope.sin_seq");
    s.rope_halves = g.constant_i64("shape.rope_halves", {head_dim / 2, head_dim / 2}, {2});
  }
  return s;
}

std::string norm(GraphBuilder& g, const ModelConfig& c, const std::string& x, const std::string& prefix,
                 const std::string& out) {
  if (c.norm == ModelConfig::Norm::rmsnorm) return rms_norm(g, x, prefix, c.norm_eps, out);
  return layer_norm(g, x, prefix, c.norm_eps, out);
}

std::string layer_norm(GraphBuilder& g, const std::string& x, const std::string& prefix, float eps,
                       const std::string& out) {
  return g.node("LayerNormalization", {x, prefix + ".weight", prefix + ".bias"}, out,
                {{"axis", std::int64_t{-1}}, {"epsilon", eps}});
}

std::string rms_norm(GraphBuilder& g, const std::string& x, const std::string& prefix, float eps,
                     const std::string& out) {
  const std::string square = g.node("Mul", {x, x}, out + ".square");
  const std::string mean = g.node("ReduceMean", {square}, out + ".mean_square",
                                  {{"axes", std::vector<std::int64_t>{-1}}, {"keepdims", std::int64_t{1}}});
  const std::string plus_eps = g.node("Add", {mean, g.constant_f32(out + ".eps", eps)}, out + ".plus_eps");
  const std::string rms = g.node("Sqrt", {plus_eps}, out + ".rms");
  const std::string normed = g.node("Div", {x, rms}, out + ".normed");
  return g.node("Mul", {normed, prefix + ".weight"}, out);
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

std::string gelu_tanh(GraphBuilder& g, const std::string& x, const std::string& out) {
  const std::string cubic = g.constant_f32(out + ".cubic", 0.044715f);
  const std::string sqrt_2_over_pi = g.constant_f32(out + ".sqrt_2_over_pi", 0.79788456080286536f);
  const std::string one = g.constant_f32(out + ".one", 1.0f), half = g.constant_f32(out + ".half", 0.5f);
  const std::string x2 = g.node("Mul", {x, x}, out + ".x2");
  const std::string x3 = g.node("Mul", {x2, x}, out + ".x3");
  const std::string inner = g.node("Add", {x, g.node("Mul", {x3, cubic}, out + ".cubic_x3")}, out + ".inner");
  const std::string t = g.node("Tanh", {g.node("Mul", {inner, sqrt_2_over_pi}, out + ".u")}, out + ".tanh");
  const std::string cdf = g.node("Add", {t, one}, out + ".one_plus_tanh");
  const std::string half_x = g.node("Mul", {x, half}, out + ".half_x");
  return g.node("Mul", {half_x, cdf}, out);
}

std::string swiglu(GraphBuilder& g, const std::string& h, std::int64_t d_ff, const std::string& out) {
  const std::string gate = out + ".gate", up = out + ".up";
  g.node("Split", {h, g.constant_i64(out + ".split", {d_ff, d_ff}, {2})}, std::vector<std::string>{gate, up},
         {{"axis", std::int64_t{1}}});
  const std::string silu = g.node("Mul", {gate, g.node("Sigmoid", {gate}, out + ".sigmoid")}, out + ".silu");
  return g.node("Mul", {silu, up}, out);
}

std::string mlp_activation(GraphBuilder& g, const ModelConfig& c, const std::string& h, const std::string& out) {
  switch (c.mlp) {
    case ModelConfig::Mlp::gelu:
      return gelu(g, h, out + "gelu");
    case ModelConfig::Mlp::gelu_tanh:
      return gelu_tanh(g, h, out + "gelu_tanh");
    case ModelConfig::Mlp::swiglu:
      return swiglu(g, h, c.d_ff, out + "swiglu");
  }
  return {};
}

std::string attention(GraphBuilder& g, const RuntimeShapes& s, const std::string& qkv, const std::string& out,
                      const KvCache* cache) {
  // [N, (H + 2 Hkv) hd] -> [batch, seq, H + 2 Hkv, hd] -> [batch, H + 2 Hkv, seq, hd] -> q, k, v.
  const std::string heads = g.node("Reshape", {qkv, s.qkv_heads}, out + ".qkv_heads");
  const std::string by_head = g.node("Transpose", {heads}, out + ".by_head", {{"perm", std::vector<std::int64_t>{0, 2, 1, 3}}});
  std::string q = out + ".q", k = out + ".k", v = out + ".v";
  g.node("Split", {by_head, s.head_split}, std::vector<std::string>{q, k, v}, {{"axis", std::int64_t{1}}});
  if (!s.rope_cos.empty()) {
    q = rotate(g, s, q, out + ".q_rotated");
    k = rotate(g, s, k, out + ".k_rotated");
  }
  if (cache != nullptr) {
    k = g.node("Concat", {cache->past_k, k}, cache->present_k, {{"axis", std::int64_t{2}}});
    v = g.node("Concat", {cache->past_v, v}, cache->present_v, {{"axis", std::int64_t{2}}});
  }
  if (!s.kv_repeat.empty()) {
    k = repeat_kv(g, s, k, out + ".k_repeated");
    v = repeat_kv(g, s, v, out + ".v_repeated");
  }
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
