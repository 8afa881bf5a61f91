// Writes an ONNX file from a checked graph (build_onnx_graph) and the
// parameters, streaming them: each block is read once, its tensors written
// (f32 straight from the block's buffer, int8 quantized on the way) and the
// buffer released before the next block is read. Memory beyond the graph is
// one block plus one quantized tensor, whatever the model's size, as the
// safetensors export does.
//
// The file is a plain ModelProto: the model's fields, then the graph as one
// length-delimited field whose parameter initializers come after its other
// fields (protobuf readers accept fields in any order and keep repeated ones
// in the order read). Any thread; no shared state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include <onnx/onnx_pb.h>

#include "export/onnx_model.h"

namespace dtrain::exporter {

// Appends n bytes to the output (a file being written); throws on failure.
using ByteSink = std::function<void(const void* data, std::size_t n)>;

// Serializes `graph` (build_onnx_graph of `config` and `layout` with the same
// `int8`) to `sink` with every parameter initializer filled from `read`.
// Returns the bytes written. Throws what `read` and `sink` throw, and IoError
// before writing anything when the model would exceed the 2 GiB a protobuf
// may hold (ONNX's external data is not written by dtrain).
std::uint64_t write_onnx_model(const onnx::ModelProto& graph, const nn::ModelConfig& config,
                               const nn::ParameterLayout& layout, const BlockReader& read, bool int8,
                               const ByteSink& sink);

}  // namespace dtrain::exporter
