#include "export/triton_config.h"

#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>

#include <fmt/format.h>

#include "core/error.h"

namespace dtrain::exporter {
namespace {

// Collects the text-format parser's complaints, which it otherwise logs.
class ParseErrors : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, int column, const std::string& message) override {
    if (text.empty()) text = fmt::format("line {}, column {}: {}", line + 1, column + 1, message);
  }
  std::string text;
};

// dims of one graph input or output without its leading batch dim.
template <class Tensor>
void fill(Tensor* out, const onnx::ValueInfoProto& value, bool batched) {
  out->set_name(value.name());
  const onnx::TypeProto_Tensor& tensor = value.type().tensor_type();
  out->set_data_type(triton_type(tensor.elem_type()));
  if (out->data_type() == triton::TYPE_INVALID) {
    throw Error(fmt::format("ONNX value '{}' has element type {}, which Triton has no type for", value.name(),
                            tensor.elem_type()));
  }
  const onnx::TensorShapeProto& shape = tensor.shape();
  if (batched && (shape.dim_size() == 0 || !shape.dim(0).has_dim_param())) {
    throw Error(fmt::format("ONNX value '{}' has no leading symbolic batch dimension; Triton's max_batch_size "
                            "needs one", value.name()));
  }
  for (int i = batched ? 1 : 0; i < shape.dim_size(); ++i) {
    const onnx::TensorShapeProto_Dimension& dim = shape.dim(i);
    out->add_dims(dim.has_dim_value() ? dim.dim_value() : -1);
  }
}

}  // namespace

void check_triton_model_name(const std::string& name) {
  const bool ok = !name.empty() && name.size() <= 128 && name.front() != '.' &&
                  name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.") ==
                      std::string::npos;
  if (!ok) {
    throw ConfigError("--name", fmt::format("'{}' cannot name a Triton model directory: use 1-128 letters, digits, "
                                            "'_', '-' or '.', not starting with '.'", name));
  }
}

triton::DataType triton_type(int onnx_elem_type) {
  switch (onnx_elem_type) {
    case onnx::TensorProto::BOOL: return triton::TYPE_BOOL;
    case onnx::TensorProto::UINT8: return triton::TYPE_UINT8;
    case onnx::TensorProto::UINT16: return triton::TYPE_UINT16;
    case onnx::TensorProto::UINT32: return triton::TYPE_UINT32;
    case onnx::TensorProto::UINT64: return triton::TYPE_UINT64;
    case onnx::TensorProto::INT8: return triton::TYPE_INT8;
    case onnx::TensorProto::INT16: return triton::TYPE_INT16;
    case onnx::TensorProto::INT32: return triton::TYPE_INT32;
    case onnx::TensorProto::INT64: return triton::TYPE_INT64;
    case onnx::TensorProto::FLOAT16: return triton::TYPE_FP16;
    case onnx::TensorProto::FLOAT: return triton::TYPE_FP32;
    case onnx::TensorProto::DOUBLE: return triton::TYPE_FP64;
    case onnx::TensorProto::STRING: return triton::TYPE_STRING;
    case onnx::TensorProto::BFLOAT16: return triton::TYPE_BF16;
    default: return triton::TYPE_INVALID;
  }
}

triton::ModelConfig triton_config(const onnx::ModelProto& model, const TritonOptions& options) {
  check_triton_model_name(options.name);
  if (options.max_batch < 1) {
    throw ConfigError("--max-batch", fmt::format("{} is not a batch size: use 1 or more", options.max_batch));
  }
  triton::ModelConfig config;
  config.set_name(options.name);
  config.set_platform(kTritonPlatform);
  config.set_max_batch_size(options.max_batch);
  const onnx::GraphProto& graph = model.graph();
  for (const onnx::ValueInfoProto& in : graph.input()) fill(config.add_input(), in, true);
  for (const onnx::ValueInfoProto& out : graph.output()) fill(config.add_output(), out, true);
  config.mutable_dynamic_batching()->set_max_queue_delay_microseconds(kTritonQueueDelayUs);
  triton::ModelInstanceGroup* group = config.add_instance_group();
  group->set_count(1);
  group->set_kind(options.cpu_only ? triton::ModelInstanceGroup::KIND_CPU : triton::ModelInstanceGroup::KIND_AUTO);
  return config;
}

std::string to_pbtxt(const triton::ModelConfig& config) {
  std::string text;
  DTRAIN_CHECK(google::protobuf::TextFormat::PrintToString(config, &text), "TextFormat could not print '{}'",
               config.name());
  return text;
}

triton::ModelConfig parse_pbtxt(const std::string& text, const std::string& where) {
  triton::ModelConfig config;
  google::protobuf::TextFormat::Parser parser;
  ParseErrors errors;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(text, &config)) {
    throw IoError(fmt::format("'{}' is not a Triton model config: {}", where, errors.text));
  }
  return config;
}

}  // namespace dtrain::exporter
