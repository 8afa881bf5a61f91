#include "export/onnx_model.h"

#include <string_view>

#include <fmt/format.h>
#include <onnx/checker.h>
#include <onnx/defs/schema.h>
#include <onnx/shape_inference/implementation.h>

#include "core/error.h"
#include "dtrain/config.h"
#include "export/onnx_layers.h"

namespace dtrain::exporter {
namespace {

using Kind = nn::ModelConfig::Kind;

// Weights of Linear layers: int8 under --quantize int8. The patch projection
// is the classifier's embedding and stays f32, as the token embedding does.
bool is_linear_weight(std::string_view name) {
  for (std::string_view linear : {"qkv.weight", "proj.weight", "fc1.weight", "fc2.weight", "head.weight",
                                  "cls.weight"}) {
    if (name == linear || (name.ends_with(linear) && name[name.size() - linear.size() - 1] == '.')) return true;
  }
  return false;
}

// Builds the graph: its inputs, the runtime shapes, the parameters' empty
// initializers, then the nodes of every block in order.
class OnnxBuilder {
 public:
  OnnxBuilder(const nn::ModelConfig& config, const nn::ParameterLayout& layout, bool int8, bool with_past,
              onnx::GraphProto* graph)
      : c_(config), layout_(layout), int8_(int8), with_past_(with_past), g_(graph) {}

  void build() {
    declare_io();
    shapes_ = runtime_shapes(g_, input_name(c_), c_, with_past_ ? past_name(0, "key") : "");
    for (const ParameterTensor& t : parameter_tensors(c_, layout_, int8_)) declare(t);
    x_ = embeddings();
    for (int l = 0; l < c_.n_layers; ++l) x_ = layer(l);
    head();
  }

 private:
  void declare_io() {
    const bool tokens = c_.input == nn::ModelConfig::Input::tokens;
    const std::string seq = tokens ? "seq" : "n_patches";
    if (tokens) {
      g_.input(kTokensInput, onnx::TensorProto::INT64, {0, 0}, {"batch", seq});
    } else {
      g_.input(kPatchesInput, onnx::TensorProto::FLOAT, {0, 0, c_.patch_dim}, {"batch", seq, ""});
    }
    if (c_.kind == Kind::lm) {
      g_.output(kLogitsOutput, onnx::TensorProto::FLOAT, {0, 0, c_.vocab_size}, {"batch", seq, ""});
    } else {
      g_.output(kLogitsOutput, onnx::TensorProto::FLOAT, {0, c_.num_classes}, {"batch", ""});
    }
    if (!with_past_) return;
    const std::vector<std::int64_t> dims = {0, c_.kv_heads(), 0, c_.head_dim()};
    for (int l = 0; l < c_.n_layers; ++l) {
      for (const char* what : {"key", "value"}) {
        g_.input(past_name(l, what), onnx::TensorProto::FLOAT, dims, {"batch", "", "past_seq", ""});
      }
    }
    for (int l = 0; l < c_.n_layers; ++l) {
      for (const char* what : {"key", "value"}) {
        g_.output(present_name(l, what), onnx::TensorProto::FLOAT, dims, {"batch", "", "total_seq", ""});
      }
    }
  }

  // The initializers of one parameter, their data left empty for write_onnx_model.
  void declare(const ParameterTensor& t) {
    const nn::ParamSpec& p = layout_.params()[static_cast<std::size_t>(t.param)];
    if (!t.int8) {
      g_.initializer(p.name, onnx::TensorProto::FLOAT, p.shape)->set_raw_data("");
      return;
    }
    g_.initializer(p.name + "_quantized", onnx::TensorProto::INT8, {p.shape[1], p.shape[0]})->set_raw_data("");
    g_.initializer(p.name + "_scale", onnx::TensorProto::FLOAT, {p.shape[0]})->set_raw_data("");
  }

  // Embeddings (+ the first seq learned positions, or rows past .. past + seq
  // - 1 in the cached decoder) as the residual stream [N, d].
  std::string embeddings() {
    const bool learned = c_.position == nn::ModelConfig::Position::learned;
    const std::string pos =
        !learned   ? ""
        : with_past_ ? g_.node("Slice", {"pos_emb", shapes_.past, shapes_.end, shapes_.axis0}, "embed.positions")
                     : g_.node("Slice", {"pos_emb", g_.constant_i64("const.0_1d", {0}, {1}), shapes_.seq, shapes_.axis0},
                               "embed.positions");
    std::string by_token;
    if (c_.input == nn::ModelConfig::Input::tokens) {
      by_token = g_.node("Gather", {"tok_emb", kTokensInput}, "embed.tokens", {{"axis", std::int64_t{0}}});
    } else {
      const std::string flat = g_.node(
          "Reshape", {kPatchesInput, g_.constant_i64("shape.rows_by_patch", {-1, c_.patch_dim}, {2})}, "embed.flat");
      const std::string projected = linear(g_, flat, "patch.weight", "patch.bias", false, "embed.patches");
      by_token = g_.node("Reshape", {projected, shapes_.by_d}, "embed.patches_by_token");
    }
    const std::string sum = learned ? g_.node("Add", {by_token, pos}, "embed.sum") : by_token;
    return g_.node("Reshape", {sum, shapes_.rows_by_d}, "embed.out");
  }

  // x_mid = x + proj(attn(norm1(x))); x_out = x_mid + fc2(act(fc1(norm2(x_mid)))) (nn/graph_forward.h).
  std::string layer(int l) {
    const std::string p = fmt::format("layer.{}.", l);
    const std::string ln1 = norm(g_, c_, x_, p + "ln1", p + "ln1");
    const std::string qkv = linear_layer(ln1, p + "qkv", p + "qkv");
    const KvCache cache{past_name(l, "key"), past_name(l, "value"), present_name(l, "key"),
                        present_name(l, "value")};
    const std::string attn = attention(g_, shapes_, qkv, p + "attn", with_past_ ? &cache : nullptr);
    const std::string proj = linear_layer(attn, p + "proj", p + "proj");
    const std::string mid = g_.node("Add", {x_, proj}, p + "mid");
    const std::string ln2 = norm(g_, c_, mid, p + "ln2", p + "ln2");
    const std::string fc1 = linear_layer(ln2, p + "fc1", p + "fc1");
    const std::string act = mlp_activation(g_, c_, fc1, p);
    const std::string fc2 = linear_layer(act, p + "fc2", p + "fc2");
    return g_.node("Add", {mid, fc2}, p + "out");
  }

  // A layer's Linear `name` (name.weight, and name.bias with model.bias).
  std::string linear_layer(const std::string& x, const std::string& name, const std::string& out) {
    return linear(g_, x, name + ".weight", c_.bias ? name + ".bias" : "", int8_, out);
  }

  // lm: logits = lnf(x) W^T (no bias; W = tok_emb when tied). Classifier:
  // logits = cls(mean over seq of lnf(x)).
  void head() {
    const std::string lnf = norm(g_, c_, x_, "lnf", "lnf");
    if (c_.kind == Kind::lm) {
      const std::string weight = c_.tie_embeddings ? "tok_emb" : "head.weight";
      const std::string flat = linear(g_, lnf, weight, "", int8_, "head");
      const std::string by_vocab = g_.node(
          "Concat", {shapes_.batch_seq, g_.constant_i64("shape.vocab", {c_.vocab_size}, {1})}, "shape.by_vocab",
          {{"axis", std::int64_t{0}}});
      g_.node("Reshape", {flat, by_vocab}, kLogitsOutput);
      return;
    }
    const std::string by_token = g_.node("Reshape", {lnf, shapes_.by_d}, "lnf.by_token");
    const std::string pooled = g_.node("ReduceMean", {by_token}, "pool",
                                       {{"axes", std::vector<std::int64_t>{1}}, {"keepdims", std::int64_t{0}}});
    linear(g_, pooled, "cls.weight", "cls.bias", int8_, kLogitsOutput);
  }

  const nn::ModelConfig& c_;
  const nn::ParameterLayout& layout_;
  bool int8_;
  bool with_past_;
  GraphBuilder g_;
  RuntimeShapes shapes_;
  std::string x_;  // the residual stream after the blocks built so far
};

void check_config(const nn::ModelConfig& c) {
  if (c.n_heads <= 0 || c.d_model % c.n_heads != 0) {
    throw ConfigError("model.n_heads", fmt::format("{} heads do not divide d_model {}", c.n_heads, c.d_model));
  }
  if (c.input == nn::ModelConfig::Input::patches && c.kind == Kind::lm) {
    throw ConfigError("model.input", "an lm reads tokens; patches are for the classifier");
  }
  if (c.input == nn::ModelConfig::Input::patches && c.patch_dim <= 0) {
    throw ConfigError("model.patch_size", "a patch classifier needs model.patch_size >= 1");
  }
  if (c.n_kv_heads < 0 || c.n_heads % c.kv_heads() != 0) {
    throw ConfigError("model.n_kv_heads", fmt::format("{} key/value heads do not divide n_heads {}", c.kv_heads(),
                                                      c.n_heads));
  }
  if (c.position == nn::ModelConfig::Position::rope) {
    if (c.head_dim() % 2 != 0) {
      throw ConfigError("model.position", fmt::format("rope needs an even head size, not {}", c.head_dim()));
    }
    if (!(c.rope_theta > 0)) throw ConfigError("model.rope_theta", "must be > 0");
  }
}

// Replaces every initializer without data (the parameters) by a graph input
// of its type and dims.
void parameters_as_inputs(onnx::GraphProto& graph) {
  google::protobuf::RepeatedPtrField<onnx::TensorProto> constants;
  for (onnx::TensorProto& t : *graph.mutable_initializer()) {
    if (!t.raw_data().empty()) {
      *constants.Add() = std::move(t);
      continue;
    }
    onnx::ValueInfoProto* in = graph.add_input();
    in->set_name(t.name());
    onnx::TypeProto_Tensor* type = in->mutable_type()->mutable_tensor_type();
    type->set_elem_type(t.data_type());
    for (std::int64_t d : t.dims()) type->mutable_shape()->add_dim()->set_dim_value(d);
  }
  graph.mutable_initializer()->Swap(&constants);
}

}  // namespace

std::string past_name(int layer, const char* what) { return fmt::format("past_key_values.{}.{}", layer, what); }

std::string present_name(int layer, const char* what) { return fmt::format("present.{}.{}", layer, what); }

const char* input_name(const nn::ModelConfig& config) {
  return config.input == nn::ModelConfig::Input::tokens ? kTokensInput : kPatchesInput;
}

std::vector<ParameterTensor> parameter_tensors(const nn::ModelConfig& config, const nn::ParameterLayout& layout,
                                               bool int8) {
  std::vector<ParameterTensor> tensors;
  for (int i = 0; i < static_cast<int>(layout.params().size()); ++i) {
    const std::string& name = layout.params()[static_cast<std::size_t>(i)].name;
    tensors.push_back({i, int8 && is_linear_weight(name)});
    // The tied lm head multiplies by tok_emb: under int8 through a quantized copy, the embedding staying f32.
    if (int8 && name == "tok_emb" && config.kind == Kind::lm && config.tie_embeddings) tensors.push_back({i, true});
  }
  return tensors;
}

onnx::ModelProto build_onnx_graph(const nn::ModelConfig& config, const nn::ParameterLayout& layout,
                                  const OnnxOptions& options) {
  check_config(config);
  if (options.with_past && config.kind != Kind::lm) {
    throw ConfigError("--with-past", "the key/value cache is a language model's (model.kind lm); a classifier "
                                     "reads its whole input at once: export it without --with-past");
  }
  onnx::ModelProto model;
  model.set_ir_version(onnx::IR_VERSION);
  model.set_producer_name("dtrain");
  model.set_producer_version(DTRAIN_VERSION);
  model.set_doc_string(options.doc);
  onnx::OperatorSetIdProto* opset = model.add_opset_import();
  opset->set_domain("");
  opset->set_version(kOnnxOpset);
  auto meta = [&](const std::string& key, const std::string& value) {
    onnx::StringStringEntryProto* entry = model.add_metadata_props();
    entry->set_key(key);
    entry->set_value(value);
  };
  meta("dtrain.kind", config.kind == Kind::lm ? "lm" : "classifier");
  meta("dtrain.max_seq_len", std::to_string(config.max_seq_len));
  meta("dtrain.quantization", options.int8 ? "int8 dynamic (per-channel weights)" : "none");
  if (options.with_past) meta("dtrain.with_past", "past_key_values.<layer>.key/value in, present.<layer>.key/value out");
  for (const auto& [key, value] : options.metadata) meta(key, value);

  onnx::GraphProto* graph = model.mutable_graph();
  graph->set_name(config.kind == Kind::lm ? (options.with_past ? "dtrain_lm_with_past" : "dtrain_lm")
                                          : "dtrain_classifier");
  OnnxBuilder(config, layout, options.int8, options.with_past, graph).build();
  // ONNX checks initializers' data, which is not there yet: the checks run on
  // the same graph with the parameters as typed graph inputs instead, and the
  // shapes they infer are kept.
  onnx::ModelProto checked = model;
  parameters_as_inputs(*checked.mutable_graph());
  check_onnx(checked);
  *graph->mutable_value_info() = checked.graph().value_info();
  return model;
}

void check_onnx(onnx::ModelProto& model) {
  try {
    onnx::checker::check_model(model);
    onnx::shape_inference::InferShapes(model, onnx::OpSchemaRegistry::Instance(),
                                       onnx::ShapeInferenceOptions{true, 1, true});
  } catch (const onnx::checker::ValidationError& e) {
    throw Error(fmt::format("the ONNX graph of '{}' fails ONNX's checker: {} (a bug of dtrain's exporter: please "
                            "report it with the command)", model.graph().name(), e.what()));
  } catch (const onnx::InferenceError& e) {
    throw Error(fmt::format("the ONNX graph of '{}' fails ONNX's shape inference: {} (a bug of dtrain's "
                            "exporter: please report it with the command)", model.graph().name(), e.what()));
  }
}

}  // namespace dtrain::exporter
