// A model's parameters as a safetensors file: every parameter an F32 tensor
// of its name and shape, in layout order, back to back (so the data is the
// blocks' flat ranges one after the other), after the header: its length
// (8 bytes, little-endian), then the JSON naming each tensor's dtype, shape
// and byte range and the "__metadata__" strings, padded with spaces to a
// multiple of 8 bytes.
#pragma once

#include <cstddef>
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "export/onnx_model.h"
#include "nn/parameters.h"

namespace dtrain::exporter {

// The header's JSON text (without its length), padded.
std::string safetensors_header(const nn::ParameterLayout& layout, const nlohmann::ordered_json& metadata);

// The whole file through `append`, one block read at a time (peak memory:
// the largest block).
void write_safetensors(const nn::ParameterLayout& layout, const nlohmann::ordered_json& metadata,
                       const BlockReader& read, const std::function<void(const void*, std::size_t)>& append);

}  // namespace dtrain::exporter
