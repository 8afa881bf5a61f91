// A Triton Inference Server model repository entry for an exported ONNX model:
//
//   REPO/NAME/config.pbtxt   a ModelConfig (proto/triton_model_config.proto) in
//                            protobuf text format, written by TextFormat
//   REPO/NAME/1/model.onnx   the model (version 1)
//
// The config is derived from the ONNX graph itself (its inputs and outputs,
// names, element types and dims, the batch dimension left out as Triton wants
// when max_batch_size > 0), so the two cannot disagree. Pure functions, any thread.
#pragma once

#include <string>

#include <onnx/onnx_pb.h>

#include "proto/triton_model_config.pb.h"

namespace dtrain::exporter {

inline constexpr const char* kTritonPlatform = "onnxruntime_onnx";
inline constexpr const char* kTritonConfigFile = "config.pbtxt";
inline constexpr const char* kTritonVersionDir = "1";
inline constexpr const char* kTritonModelFile = "model.onnx";
inline constexpr int kTritonQueueDelayUs = 100;

struct TritonOptions {
  std::string name;    // the model's name, which is also its directory
  int max_batch = 32;  // Triton's max_batch_size (>= 1)
  // Instances on CPUs (int8 dynamic quantization is a CPU technique) rather
  // than KIND_AUTO (a GPU when the server has one).
  bool cpu_only = false;
};

// Throws ConfigError("--name") unless `name` can be a model directory: 1-128
// characters of letters, digits, '_', '-' and '.', not starting with '.'.
void check_triton_model_name(const std::string& name);

// The config for `model`: platform onnxruntime_onnx, max_batch_size, every
// graph input and output (TYPE_* of its element type, its dims after the
// leading batch dim, -1 where a dim is symbolic), dynamic_batching and one
// instance. Throws ConfigError for options out of range and Error when a
// graph input or output has no leading symbolic batch dim.
triton::ModelConfig triton_config(const onnx::ModelProto& model, const TritonOptions& options);

// Triton's data type for an ONNX element type (TYPE_INVALID when none).
triton::DataType triton_type(int onnx_elem_type);

// Protobuf text format, as Triton reads config.pbtxt.
std::string to_pbtxt(const triton::ModelConfig& config);
// Parses config.pbtxt text; IoError naming `where` and the parser's complaint.
triton::ModelConfig parse_pbtxt(const std::string& text, const std::string& where);

}  // namespace dtrain::exporter
