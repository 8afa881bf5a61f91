// The ONNX forms of the block's newer pieces (export/onnx_layers.h), each run
// alone in ONNX Runtime on inputs of order 1, where a wrong form shows (in
// a briefly trained model the activations are small, and erf and tanh GELU,
// or two rotary layouts, differ there by less than any tolerance):
//   - RMSNorm, GELU's tanh form and SwiGLU against the CPU kernels that
//     nn::Model::infer runs, within 1e-6 of the largest |output| (measured
//     5e-8 to 7e-8);
//   - attention with rotary positions and grouped-query heads against a
//     plain reference in double written from nn/rotary.h's definition
//     (rotate-half, query head h reads key/value head h / (H / Hkv), causal
//     softmax), within 1e-6 of the largest |output| (measured 1.0e-7 to
//     1.5e-7), for 2, 1 and 4 key/value heads of 4.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "export/onnx_layers.h"
#include "export/onnx_model.h"
#include "nn/gelu.h"
#include "nn/rmsnorm.h"
#include "nn/swiglu.h"
#include "support/onnx_testing.h"
#include "support/temp_dir.h"

namespace dtrain::testing {
namespace {

namespace fs = std::filesystem;
using exporter::GraphBuilder;
using nn::ModelConfig;

std::vector<float> normal(std::size_t n, float stddev, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// A model of one input "x" (`in_dims`) and one output "y" (`out_dims`, a
// "rows" dim where -1) built by `body`, run in ONNX Runtime on `x`; returns y.
template <class Body>
std::vector<float> run_layer(const TempDir& dir, const std::string& name, const std::vector<std::int64_t>& in_dims,
                             const std::vector<std::int64_t>& out_dims, const std::vector<float>& x, Body body) {
  onnx::ModelProto m;
  m.set_ir_version(onnx::IR_VERSION);
  onnx::OperatorSetIdProto* opset = m.add_opset_import();
  opset->set_domain("");
  opset->set_version(exporter::kOnnxOpset);
  GraphBuilder g(m.mutable_graph());
  m.mutable_graph()->set_name(name);
  g.input("x", onnx::TensorProto::FLOAT, in_dims, {});
  body(g);
  std::vector<std::int64_t> dims = out_dims;
  std::vector<std::string> names(dims.size());
  for (std::size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] < 0) names[i] = "rows", dims[i] = 0;
  }
  g.output("y", onnx::TensorProto::FLOAT, dims, names);
  exporter::check_onnx(m);
  const fs::path model = dir / (name + ".onnx"), sets = dir / (name + "_data");
  {
    std::ofstream out(model, std::ios::binary);
    EXPECT_TRUE(m.SerializeToOstream(&out));
  }
  fs::create_directories(data_set(sets, 0));
  write_tensor(data_set(sets, 0) / "input_0.pb", "x", in_dims, x);
  run_onnx_data_sets(model, sets);
  std::vector<std::int64_t> got;
  return read_float_tensor(data_set(sets, 0) / "ort_output_0.pb", &got);
}

// max |a - b| / max |b|.
double relative_error(const std::vector<float>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double scale = 0.0, worst = 0.0;
  for (double v : b) scale = std::max(scale, std::fabs(v));
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
  return scale > 0.0 ? worst / scale : worst;
}

std::vector<double> widen(const std::vector<float>& v) { return {v.begin(), v.end()}; }

TEST(OnnxLayers, RmsNormGeluTanhAndSwigluMatchTheirKernels) {
  require_onnx_runtime();
  TempDir dir;
  const std::int64_t n = 37, c = 48;
  const std::vector<float> x = normal(static_cast<std::size_t>(n * c), 2.0f, 1);

  const std::vector<float> w = normal(static_cast<std::size_t>(c), 1.0f, 2);
  const float eps = 1e-6f;
  const std::vector<float> rms = run_layer(dir, "rmsnorm", {n, c}, {n, c}, x, [&](GraphBuilder& g) {
    g.constant_f32_tensor("norm.weight", w, {c});
    exporter::rms_norm(g, "x", "norm", eps, "y");
  });
  std::vector<float> want(x.size()), rstd(static_cast<std::size_t>(n));
  nn::rmsnorm_forward(x.data(), w.data(), want.data(), rstd.data(), n, c, eps);
  const double rms_error = relative_error(rms, widen(want));
  EXPECT_LE(rms_error, 1e-6);

  const std::vector<float> gelu = run_layer(dir, "gelu_tanh", {n, c}, {n, c}, x, [&](GraphBuilder& g) {
    exporter::gelu_tanh(g, "x", "y");
  });
  nn::gelu_forward(x.data(), want.data(), static_cast<float*>(nullptr), n * c, nn::GeluForm::tanh);
  const double gelu_error = relative_error(gelu, widen(want));
  EXPECT_LE(gelu_error, 1e-6);
  // The tanh form is told apart from erf's at these inputs (measured: 6.9e-5).
  std::vector<float> erf(x.size());
  nn::gelu_forward(x.data(), erf.data(), static_cast<float*>(nullptr), n * c, nn::GeluForm::erf);
  EXPECT_GT(relative_error(gelu, widen(erf)), 1e-5);

  // x as [n, 2 f]: gate | up.
  const std::int64_t f = c / 2;
  const std::vector<float> swiglu = run_layer(dir, "swiglu", {n, c}, {n, f}, x, [&](GraphBuilder& g) {
    exporter::swiglu(g, "x", f, "y");
  });
  std::vector<float> a(static_cast<std::size_t>(n * f));
  nn::swiglu_forward(x.data(), a.data(), n, f);
  const double swiglu_error = relative_error(swiglu, widen(a));
  EXPECT_LE(swiglu_error, 1e-6);
  std::cout << fmt::format("max |onnx - kernel| / max |kernel|: rmsnorm {:.2e}, gelu_tanh {:.2e}, swiglu {:.2e}\n",
                           rms_error, gelu_error, swiglu_error);
}

// Causal attention with rotary positions and grouped heads, in double, on
// packed [B, T, (H + 2 Hkv) hd] (nn/rotary.h); returns [B * T, H * hd].
std::vector<double> reference_attention(const std::vector<float>& packed, std::int64_t batch, std::int64_t seq,
                                        std::int64_t heads, std::int64_t kv_heads, std::int64_t hd, double theta) {
  const std::int64_t width = (heads + 2 * kv_heads) * hd, half = hd / 2, group = heads / kv_heads;
  // Rotated head vectors (q: heads, k: kv_heads) and plain v, [b][t][head][e].
  auto head = [&](std::int64_t b, std::int64_t t, std::int64_t column_head, bool rotate) {
    std::vector<double> x(static_cast<std::size_t>(hd));
    const float* row = packed.data() + (b * seq + t) * width + column_head * hd;
    for (std::int64_t e = 0; e < hd; ++e) x[static_cast<std::size_t>(e)] = row[e];
    if (!rotate) return x;
    std::vector<double> y(x.size());
    for (std::int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(t) * std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(hd));
      const double x0 = x[static_cast<std::size_t>(i)], x1 = x[static_cast<std::size_t>(i + half)];
      y[static_cast<std::size_t>(i)] = x0 * std::cos(angle) - x1 * std::sin(angle);
      y[static_cast<std::size_t>(i + half)] = x1 * std::cos(angle) + x0 * std::sin(angle);
    }
    return y;
  };
  std::vector<double> out(static_cast<std::size_t>(batch * seq * heads * hd));
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t h = 0; h < heads; ++h) {
      const std::int64_t j = h / group;
      for (std::int64_t t = 0; t < seq; ++t) {
        const std::vector<double> q = head(b, t, h, true);
        std::vector<double> p(static_cast<std::size_t>(t + 1));
        double top = -INFINITY, sum = 0.0;
        for (std::int64_t s = 0; s <= t; ++s) {
          const std::vector<double> k = head(b, s, heads + j, true);
          double dot = 0.0;
          for (std::int64_t e = 0; e < hd; ++e) dot += q[static_cast<std::size_t>(e)] * k[static_cast<std::size_t>(e)];
          p[static_cast<std::size_t>(s)] = dot / std::sqrt(static_cast<double>(hd));
          top = std::max(top, p[static_cast<std::size_t>(s)]);
        }
        for (double& v : p) sum += (v = std::exp(v - top));
        double* o = out.data() + (b * seq + t) * heads * hd + h * hd;
        for (std::int64_t s = 0; s <= t; ++s) {
          const std::vector<double> v = head(b, s, heads + kv_heads + j, false);
          for (std::int64_t e = 0; e < hd; ++e) o[e] += p[static_cast<std::size_t>(s)] / sum * v[static_cast<std::size_t>(e)];
        }
      }
    }
  }
  return out;
}

TEST(OnnxLayers, RotaryGroupedAttentionMatchesAPlainReference) {
  require_onnx_runtime();
  TempDir dir;
  struct Case {
    std::int64_t heads, kv_heads;
  };
  for (const Case k : {Case{4, 2}, Case{4, 1}, Case{4, 4}}) {
    ModelConfig c;
    c.kind = ModelConfig::Kind::lm;
    c.d_model = 32;
    c.n_heads = k.heads;
    c.n_kv_heads = k.kv_heads;
    c.max_seq_len = 16;
    c.position = ModelConfig::Position::rope;
    c.rope_theta = 100.0;  // a small theta turns every pair within 16 positions
    const std::int64_t batch = 2, seq = 11, width = c.qkv_width();
    const std::vector<float> packed = normal(static_cast<std::size_t>(batch * seq * width), 1.0f, 3);
    const std::string name = fmt::format("attention_{}_of_{}", k.kv_heads, k.heads);
    const std::vector<float> y = run_layer(dir, name, {batch, seq, width}, {-1, c.d_model}, packed,
                                           [&](GraphBuilder& g) {
      const exporter::RuntimeShapes s = exporter::runtime_shapes(g, "x", c);
      const std::string flat = g.node("Reshape", {"x", g.constant_i64("test.rows", {-1, width}, {2})}, "x.flat");
      exporter::attention(g, s, flat, "y");
    });
    const double error =
        relative_error(y, reference_attention(packed, batch, seq, c.n_heads, c.kv_heads(), c.head_dim(), c.rope_theta));
    EXPECT_LE(error, 1e-6) << name;
    std::cout << fmt::format("{}: max |onnx - reference| / max |reference| = {:.2e}\n", name, error);
  }
}

}  // namespace
}  // namespace dtrain::testing
