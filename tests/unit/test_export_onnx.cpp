// The export library without a runtime (tests/integration/test_onnx_*.cpp run
// the graphs in ONNX Runtime): per-channel int8 weights, the graph of every
// model kind and block (today's, GPT-2's, the LLaMA family's) in f32 and
// int8 (names, types, dims, parameters byte for byte, the rotary table,
// standard operators only), and the Triton config derived from it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "export/onnx_model.h"
#include "export/onnx_writer.h"
#include "export/quantize.h"
#include "export/triton_config.h"
#include "nn/rotary.h"

namespace dtrain::exporter {
namespace {

using nn::ModelConfig;

TEST(Quantize, RowsGetTheirOwnScaleAndRoundHalfToEven) {
  // Row 0: amax 127 -> scale 1, so 0.5 -> 0, 1.5 -> 2, -2.5 -> -2 (half to even).
  // Row 1: all zeros -> scale 1, q 0. Row 2: amax 2.54 -> scale 0.02.
  const std::vector<float> w = {127.0f, 0.5f, 1.5f, -2.5f, 0.0f, 0.0f, 0.0f, 0.0f, -2.54f, 1.0f, 0.01f, 2.54f};
  std::vector<std::int8_t> q(12);
  std::vector<float> scale(3);
  quantize_rows_transposed(w.data(), 3, 4, q.data(), scale.data());
  EXPECT_EQ(scale[0], 1.0f);
  EXPECT_EQ(scale[1], 1.0f);
  EXPECT_FLOAT_EQ(scale[2], 2.54f / 127.0f);
  // q is [cols, rows]: q[j * 3 + r].
  EXPECT_THAT(std::vector<int>({q[0], q[3], q[6], q[9]}), ::testing::ElementsAre(127, 0, 2, -2));
  EXPECT_THAT(std::vector<int>({q[1], q[4], q[7], q[10]}), ::testing::ElementsAre(0, 0, 0, 0));
  EXPECT_THAT(std::vector<int>({q[2], q[5], q[8], q[11]}), ::testing::ElementsAre(-127, 50, 0, 127));
}

TEST(Quantize, DequantizedWeightsAreWithinHalfAStep) {
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 0.05f);
  const std::int64_t rows = 37, cols = 53;
  std::vector<float> w(static_cast<std::size_t>(rows * cols));
  for (auto& x : w) x = dist(rng);
  std::vector<std::int8_t> q(w.size());
  std::vector<float> scale(static_cast<std::size_t>(rows));
  quantize_rows_transposed(w.data(), rows, cols, q.data(), scale.data());
  for (std::int64_t r = 0; r < rows; ++r) {
    int largest = 0;
    for (std::int64_t j = 0; j < cols; ++j) {
      const int v = q[static_cast<std::size_t>(j * rows + r)];
      largest = std::max(largest, std::abs(v));
      EXPECT_LE(std::fabs(w[static_cast<std::size_t>(r * cols + j)] - static_cast<float>(v) * scale[r]),
                0.5f * scale[r] * 1.0001f);
    }
    EXPECT_EQ(largest, kInt8Max) << "row " << r << ": the largest weight maps to 127";
  }
}

struct Kind {
  const char* name;
  ModelConfig config;
};

ModelConfig tiny(ModelConfig::Kind kind, ModelConfig::Input input, bool tied) {
  return ModelConfig{.kind = kind, .input = input, .vocab_size = 29, .d_model = 12, .n_heads = 3, .n_layers = 2,
                     .d_ff = 20, .max_seq_len = 9, .num_classes = 4,
                     .patch_dim = input == ModelConfig::Input::patches ? 6 : 0, .tie_embeddings = tied};
}

// The LLaMA family's block: RMSNorm, rotary positions, SwiGLU, no linear
// biases, 2 key/value heads for 4 query heads (head size 4).
ModelConfig llama(ModelConfig::Kind kind, bool tied) {
  ModelConfig c = tiny(kind, ModelConfig::Input::tokens, tied);
  c.d_model = 16;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.norm = ModelConfig::Norm::rmsnorm;
  c.norm_eps = 1e-6f;
  c.position = ModelConfig::Position::rope;
  c.rope_theta = 500.0;
  c.mlp = ModelConfig::Mlp::swiglu;
  c.bias = false;
  return c;
}

ModelConfig gpt2(bool tied) {
  ModelConfig c = tiny(ModelConfig::Kind::lm, ModelConfig::Input::tokens, tied);
  c.mlp = ModelConfig::Mlp::gelu_tanh;
  return c;
}

const std::vector<Kind> kKinds = {
    {"lm_tied", tiny(ModelConfig::Kind::lm, ModelConfig::Input::tokens, true)},
    {"lm_untied", tiny(ModelConfig::Kind::lm, ModelConfig::Input::tokens, false)},
    {"classifier_tokens", tiny(ModelConfig::Kind::classifier, ModelConfig::Input::tokens, false)},
    {"classifier_patches", tiny(ModelConfig::Kind::classifier, ModelConfig::Input::patches, false)},
    {"gpt2_tanh", gpt2(true)},
    {"llama_tied", llama(ModelConfig::Kind::lm, true)},
    {"llama_untied", llama(ModelConfig::Kind::lm, false)},
    {"llama_classifier", llama(ModelConfig::Kind::classifier, false)},
};

// Parameter i of block b holds values derived from (b, i), so a mix-up shows.
BlockReader fake_reader(const nn::ParameterLayout& layout) {
  return [&layout](int b, std::span<float> out) {
    EXPECT_EQ(static_cast<std::int64_t>(out.size()), layout.blocks()[static_cast<std::size_t>(b)].numel);
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = 0.001f * static_cast<float>(b * 1000 + static_cast<int>(i % 997));
  };
}

// The whole model as the writer streams it, parsed back.
onnx::ModelProto exported(const ModelConfig& c, const nn::ParameterLayout& layout, const BlockReader& read, bool int8) {
  const onnx::ModelProto graph = build_onnx_graph(c, layout, OnnxOptions{int8, "doc", {}});
  std::string bytes;
  const std::uint64_t n = write_onnx_model(graph, c, layout, read, int8, [&bytes](const void* data, std::size_t size) {
    bytes.append(static_cast<const char*>(data), size);
  });
  EXPECT_EQ(n, bytes.size());
  onnx::ModelProto model;
  EXPECT_TRUE(model.ParseFromString(bytes));
  return model;
}

std::map<std::string, const onnx::TensorProto*> initializers(const onnx::ModelProto& m) {
  std::map<std::string, const onnx::TensorProto*> out;
  for (const onnx::TensorProto& t : m.graph().initializer()) out[t.name()] = &t;
  return out;
}

std::vector<std::string> dims_of(const onnx::ValueInfoProto& v) {
  std::vector<std::string> out;
  for (const auto& d : v.type().tensor_type().shape().dim()) {
    out.push_back(d.has_dim_param() ? d.dim_param() : std::to_string(d.dim_value()));
  }
  return out;
}

TEST(OnnxModel, EveryKindHasTheNamedInputsOutputsAndParameters) {
  for (const Kind& k : kKinds) {
    for (bool int8 : {false, true}) {
      const std::string what = std::string(k.name) + (int8 ? " int8" : " f32");
      const nn::ParameterLayout layout = nn::declare_parameters(k.config);
      const BlockReader read = fake_reader(layout);
      const onnx::ModelProto m = exported(k.config, layout, read, int8);
      ASSERT_EQ(m.opset_import_size(), 1) << what;
      EXPECT_EQ(m.opset_import(0).version(), kOnnxOpset) << what;
      ASSERT_EQ(m.graph().input_size(), 1) << what;
      ASSERT_EQ(m.graph().output_size(), 1) << what;
      const onnx::ValueInfoProto& in = m.graph().input(0);
      const onnx::ValueInfoProto& out = m.graph().output(0);
      EXPECT_EQ(out.name(), "logits");
      const bool lm = k.config.kind == ModelConfig::Kind::lm;
      if (k.config.input == ModelConfig::Input::tokens) {
        EXPECT_EQ(in.name(), "tokens");
        EXPECT_EQ(in.type().tensor_type().elem_type(), onnx::TensorProto::INT64);
        EXPECT_THAT(dims_of(in), ::testing::ElementsAre("batch", "seq")) << what;
      } else {
        EXPECT_EQ(in.name(), "patches");
        EXPECT_EQ(in.type().tensor_type().elem_type(), onnx::TensorProto::FLOAT);
        EXPECT_THAT(dims_of(in), ::testing::ElementsAre("batch", "n_patches", "6")) << what;
      }
      const std::vector<std::string> logits_dims =
          lm ? std::vector<std::string>{"batch", "seq", "29"} : std::vector<std::string>{"batch", "4"};
      EXPECT_EQ(dims_of(out), logits_dims) << what;

      // Every parameter is there under its own name, f32 byte for byte unless it is an int8 Linear weight.
      const auto inits = initializers(m);
      for (int b = 0; b < layout.num_blocks(); ++b) {
        std::vector<float> block(static_cast<std::size_t>(layout.blocks()[static_cast<std::size_t>(b)].numel));
        read(b, block);
        const nn::BlockSpec& spec = layout.blocks()[static_cast<std::size_t>(b)];
        for (int i = spec.first_param; i < spec.first_param + spec.num_params; ++i) {
          const nn::ParamSpec& p = layout.params()[static_cast<std::size_t>(i)];
          const bool linear = p.shape.size() == 2 && p.name != "tok_emb" && p.name != "pos_emb" &&
                              p.name != "patch.weight";
          if (int8 && linear) {
            ASSERT_EQ(inits.count(p.name), 0u) << what << " " << p.name;
            const onnx::TensorProto* q = inits.at(p.name + "_quantized");
            EXPECT_EQ(q->data_type(), onnx::TensorProto::INT8);
            EXPECT_THAT(q->dims(), ::testing::ElementsAre(p.shape[1], p.shape[0])) << p.name;
            EXPECT_EQ(inits.at(p.name + "_scale")->dims(0), p.shape[0]) << p.name;
            continue;
          }
          ASSERT_EQ(inits.count(p.name), 1u) << what << " " << p.name;
          const onnx::TensorProto* t = inits.at(p.name);
          EXPECT_EQ(t->data_type(), onnx::TensorProto::FLOAT) << p.name;
          EXPECT_EQ(std::vector<std::int64_t>(t->dims().begin(), t->dims().end()), p.shape) << p.name;
          ASSERT_EQ(t->raw_data().size(), static_cast<std::size_t>(p.numel) * 4) << p.name;
          EXPECT_EQ(std::memcmp(t->raw_data().data(), block.data() + p.offset, t->raw_data().size()), 0) << p.name;
        }
      }
      // The tied lm head reads the embedding: in int8 through its own quantized copy.
      if (lm && k.config.tie_embeddings) {
        EXPECT_EQ(inits.count("tok_emb_quantized"), int8 ? 1u : 0u) << what;
      }
      // Rotary positions: nn::rope_table's rows, each half-width row twice.
      const bool rope = k.config.position == ModelConfig::Position::rope;
      ASSERT_EQ(inits.count("rope.cos"), rope ? 1u : 0u) << what;
      ASSERT_EQ(inits.count("rope.sin"), rope ? 1u : 0u) << what;
      if (rope) {
        const std::int64_t hd = k.config.head_dim(), half = hd / 2, rows = k.config.max_seq_len;
        std::vector<float> cos(static_cast<std::size_t>(rows * half)), sin(cos.size());
        nn::rope_table(k.config.rope_theta, hd, rows, cos.data(), sin.data());
        for (const auto& [name, want] : {std::pair{"rope.cos", &cos}, std::pair{"rope.sin", &sin}}) {
          const onnx::TensorProto* t = inits.at(name);
          EXPECT_THAT(t->dims(), ::testing::ElementsAre(rows, hd)) << what;
          ASSERT_EQ(t->raw_data().size(), static_cast<std::size_t>(rows * hd) * 4) << what;
          std::vector<float> got(static_cast<std::size_t>(rows * hd));
          std::memcpy(got.data(), t->raw_data().data(), t->raw_data().size());
          for (std::int64_t p = 0; p < rows; ++p) {
            for (std::int64_t i = 0; i < hd; ++i) {
              ASSERT_EQ(got[static_cast<std::size_t>(p * hd + i)], (*want)[static_cast<std::size_t>(p * half + i % half)])
                  << what << " " << name << " row " << p << " column " << i;
            }
          }
        }
      }
    }
  }
}

// docs/deploy.md lists these for TensorRT's ONNX parser; a new operator must be added there.
TEST(OnnxModel, OnlyStandardOperatorsFromTheDocumentedList) {
  const std::set<std::string> f32_ops = {"Shape",   "Concat", "Squeeze", "Range",     "Unsqueeze", "Less",
                                         "Slice",   "Gather", "Add",     "Reshape",   "Gemm",      "LayerNormalization",
                                         "Transpose", "Split", "MatMul", "Mul",       "Where",     "Softmax",
                                         "Erf",     "ReduceMean", "Sqrt", "Div",     "Neg",       "Expand",
                                         "Tanh",    "Sigmoid"};
  const std::set<std::string> int8_ops = {"DynamicQuantizeLinear", "MatMulInteger", "Cast"};
  for (const Kind& k : kKinds) {
    for (bool int8 : {false, true}) {
      const nn::ParameterLayout layout = nn::declare_parameters(k.config);
      const onnx::ModelProto m = build_onnx_graph(k.config, layout, OnnxOptions{int8, "", {}});
      for (const onnx::NodeProto& n : m.graph().node()) {
        EXPECT_EQ(n.domain(), "") << n.name();
        EXPECT_TRUE(f32_ops.count(n.op_type()) > 0 || (int8 && int8_ops.count(n.op_type()) > 0))
            << k.name << ": " << n.op_type() << " (" << n.name() << ")";
      }
    }
  }
}

TEST(OnnxModel, ReaderErrorsAndBadConfigsStopTheExport) {
  const ModelConfig c = kKinds[0].config;
  const nn::ParameterLayout layout = nn::declare_parameters(c);
  const BlockReader failing = [](int block, std::span<float>) {
    if (block == 2) throw IoError("block 2 is damaged");
  };
  EXPECT_THROW(exported(c, layout, failing, false), IoError);
  ModelConfig odd = c;
  odd.n_heads = 5;
  ModelConfig kv = kKinds[5].config;
  kv.n_kv_heads = 3;  // of 4
  ModelConfig odd_rope = kKinds[5].config;
  odd_rope.n_heads = 2;
  odd_rope.n_kv_heads = 1;
  odd_rope.d_model = 10;  // head size 5
  ModelConfig theta = kKinds[5].config;
  theta.rope_theta = 0.0;
  for (const auto& [config, field] : {std::pair{odd, "model.n_heads"}, std::pair{kv, "model.n_kv_heads"},
                                      std::pair{odd_rope, "model.position"}, std::pair{theta, "model.rope_theta"}}) {
    try {
      build_onnx_graph(config, nn::declare_parameters(config), {});
      FAIL() << field << ": a bad config was accepted";
    } catch (const ConfigError& e) {
      EXPECT_EQ(e.field(), field);
    }
  }
}

TEST(TritonConfig, FollowsTheGraphAndRoundTripsThroughTextFormat) {
  const ModelConfig c = kKinds[3].config;  // the patch classifier
  const nn::ParameterLayout layout = nn::declare_parameters(c);
  const onnx::ModelProto m = build_onnx_graph(c, layout, {});
  const triton::ModelConfig config = triton_config(m, TritonOptions{"fashion", 8, true});
  EXPECT_EQ(config.platform(), "onnxruntime_onnx");
  EXPECT_EQ(config.max_batch_size(), 8);
  ASSERT_EQ(config.input_size(), 1);
  EXPECT_EQ(config.input(0).name(), "patches");
  EXPECT_EQ(config.input(0).data_type(), triton::TYPE_FP32);
  EXPECT_THAT(config.input(0).dims(), ::testing::ElementsAre(-1, 6));
  ASSERT_EQ(config.output_size(), 1);
  EXPECT_EQ(config.output(0).name(), "logits");
  EXPECT_THAT(config.output(0).dims(), ::testing::ElementsAre(4));
  EXPECT_EQ(config.instance_group(0).kind(), triton::ModelInstanceGroup::KIND_CPU);
  EXPECT_TRUE(config.has_dynamic_batching());

  const std::string text = to_pbtxt(config);
  EXPECT_THAT(text, ::testing::HasSubstr("platform: \"onnxruntime_onnx\""));
  EXPECT_EQ(parse_pbtxt(text, "config.pbtxt").SerializeAsString(), config.SerializeAsString());
  try {
    parse_pbtxt("name: \"x\"\nmax_batch_size: lots\n", "bad/config.pbtxt");
    FAIL() << "a bad config parsed";
  } catch (const IoError& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("'bad/config.pbtxt' is not a Triton model config: line 2"));
  }
}

TEST(TritonConfig, RefusesBadNamesBatchesAndGraphsWithoutABatchDim) {
  const ModelConfig c = kKinds[0].config;
  const nn::ParameterLayout layout = nn::declare_parameters(c);
  onnx::ModelProto m = build_onnx_graph(c, layout, {});
  for (const std::string& name : std::vector<std::string>{"", ".hidden", "a/b", "..", std::string(129, 'x')}) {
    EXPECT_THROW(triton_config(m, TritonOptions{name, 8, false}), ConfigError) << name;
  }
  EXPECT_THROW(triton_config(m, TritonOptions{"lm", 0, false}), ConfigError);
  m.mutable_graph()->mutable_input(0)->mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim(0)->set_dim_value(4);
  EXPECT_THROW(triton_config(m, TritonOptions{"lm", 8, false}), Error);
}

}  // namespace
}  // namespace dtrain::exporter
