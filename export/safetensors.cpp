#include "export/safetensors.h"

#include <cstdint>
#include <vector>

namespace dtrain::exporter {

std::string safetensors_header(const nn::ParameterLayout& layout, const nlohmann::ordered_json& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  std::uint64_t offset = 0;
  for (const nn::ParamSpec& p : layout.params()) {
    const std::uint64_t bytes = static_cast<std::uint64_t>(p.numel) * sizeof(float);
    header[p.name] = {{"dtype", "F32"}, {"shape", p.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  header["__metadata__"] = metadata;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

void write_safetensors(const nn::ParameterLayout& layout, const nlohmann::ordered_json& metadata,
                       const BlockReader& read, const std::function<void(const void*, std::size_t)>& append) {
  const std::string header = safetensors_header(layout, metadata);
  const std::uint64_t n = header.size();
  unsigned char size_le[8];
  for (int i = 0; i < 8; ++i) size_le[i] = static_cast<unsigned char>(n >> (8 * i));
  append(size_le, sizeof size_le);
  append(header.data(), header.size());
  for (int b = 0; b < layout.num_blocks(); ++b) {
    std::vector<float> block(static_cast<std::size_t>(layout.blocks()[static_cast<std::size_t>(b)].numel));
    read(b, block);
    append(block.data(), block.size() * sizeof(float));  // the block's params, back to back in layout order
  }
}

}  // namespace dtrain::exporter
