#include "export/onnx_writer.h"

#include <climits>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "export/quantize.h"

namespace dtrain::exporter {
namespace {

// Field numbers of onnx.proto used here, all length-delimited (wire type 2).
constexpr std::uint32_t kModelGraph = 7;        // ModelProto.graph
constexpr std::uint32_t kGraphInitializer = 5;  // GraphProto.initializer
constexpr std::uint32_t kTensorRawData = 9;     // TensorProto.raw_data

std::size_t varint_size(std::uint64_t v) {
  std::size_t n = 1;
  for (; v >= 0x80; v >>= 7) ++n;
  return n;
}

// Bytes of a length-delimited field holding `length` bytes.
std::uint64_t field_size(std::uint32_t field, std::uint64_t length) {
  return varint_size(field << 3 | 2) + varint_size(length) + length;
}

// Counts what it passes on, so the total can be checked against the plan.
class Output {
 public:
  explicit Output(const ByteSink& sink) : sink_(sink) {}
  void bytes(const void* data, std::size_t n) {
    if (n > 0) sink_(data, n);
    written_ += n;
  }
  void bytes(const std::string& s) { bytes(s.data(), s.size()); }
  // A length-delimited field's key and length; its `length` bytes follow.
  void field_header(std::uint32_t field, std::uint64_t length) {
    unsigned char buf[20];
    std::size_t n = 0;
    for (std::uint64_t v : {std::uint64_t{field << 3 | 2}, length}) {
      for (; v >= 0x80; v >>= 7) buf[n++] = static_cast<unsigned char>(v | 0x80);
      buf[n++] = static_cast<unsigned char>(v);
    }
    bytes(buf, n);
  }
  std::uint64_t written() const { return written_; }

 private:
  const ByteSink& sink_;
  std::uint64_t written_ = 0;
};

// One initializer to fill: its declaration (no data) and its data's size.
struct Slot {
  onnx::TensorProto header;  // name, type, dims; raw_data cleared
  std::uint64_t data_bytes = 0;
  std::uint64_t size() const { return header.ByteSizeLong() + field_size(kTensorRawData, data_bytes); }
};

void write_tensor(Output& out, const Slot& slot, const void* data) {
  out.field_header(kGraphInitializer, slot.size());
  out.bytes(slot.header.SerializeAsString());
  out.field_header(kTensorRawData, slot.data_bytes);
  out.bytes(data, slot.data_bytes);
}

}  // namespace

std::uint64_t write_onnx_model(const onnx::ModelProto& graph, const nn::ModelConfig& config,
                               const nn::ParameterLayout& layout, const BlockReader& read, bool int8,
                               const ByteSink& sink) {
  std::map<std::string, const onnx::TensorProto*> declared;
  for (const onnx::TensorProto& t : graph.graph().initializer()) declared[t.name()] = &t;
  auto slot = [&](const std::string& name, std::uint64_t data_bytes) {
    const auto it = declared.find(name);
    DTRAIN_CHECK(it != declared.end(), "the graph declares no initializer '{}'", name);
    Slot s{*it->second, data_bytes};
    s.header.clear_raw_data();
    declared.erase(it);  // what remains are the graph's own constants
    return s;
  };

  // The plan: every parameter's slots in block order, then the sizes.
  const std::vector<ParameterTensor> tensors = parameter_tensors(config, layout, int8);
  std::vector<std::vector<Slot>> slots;  // per tensor: [values] or [int8 values, scales]
  for (const ParameterTensor& t : tensors) {
    const nn::ParamSpec& p = layout.params()[static_cast<std::size_t>(t.param)];
    if (t.int8) {
      slots.push_back({slot(p.name + "_quantized", static_cast<std::uint64_t>(p.numel)),
                       slot(p.name + "_scale", static_cast<std::uint64_t>(p.shape[0]) * sizeof(float))});
    } else {
      slots.push_back({slot(p.name, static_cast<std::uint64_t>(p.numel) * sizeof(float))});
    }
  }
  onnx::GraphProto rest = graph.graph();  // the graph without the parameters
  rest.clear_initializer();
  for (const onnx::TensorProto& t : graph.graph().initializer()) {
    if (declared.count(t.name()) > 0) *rest.add_initializer() = t;
  }
  onnx::ModelProto shell = graph;
  shell.clear_graph();
  std::uint64_t graph_bytes = rest.ByteSizeLong();
  for (const auto& group : slots) {
    for (const Slot& s : group) graph_bytes += field_size(kGraphInitializer, s.size());
  }
  const std::uint64_t total = shell.ByteSizeLong() + field_size(kModelGraph, graph_bytes);
  if (total > static_cast<std::uint64_t>(INT_MAX)) {
    throw IoError(fmt::format("the ONNX model would be {} bytes, over the 2 GiB a protobuf file can hold; ONNX's "
                              "external data format is not written by dtrain", total));
  }

  Output out(sink);
  out.bytes(shell.SerializeAsString());
  out.field_header(kModelGraph, graph_bytes);
  out.bytes(rest.SerializeAsString());
  std::size_t next = 0;  // the next tensor to write; tensors are in block order
  std::vector<std::int8_t> q;
  std::vector<float> scale;
  for (int b = 0; b < layout.num_blocks(); ++b) {
    std::vector<float> block(static_cast<std::size_t>(layout.blocks()[static_cast<std::size_t>(b)].numel));
    read(b, block);
    for (; next < tensors.size() && layout.params()[static_cast<std::size_t>(tensors[next].param)].block == b; ++next) {
      const nn::ParamSpec& p = layout.params()[static_cast<std::size_t>(tensors[next].param)];
      const float* data = block.data() + p.offset;
      if (!tensors[next].int8) {
        write_tensor(out, slots[next][0], data);
        continue;
      }
      q.resize(static_cast<std::size_t>(p.numel));
      scale.resize(static_cast<std::size_t>(p.shape[0]));
      quantize_rows_transposed(data, p.shape[0], p.shape[1], q.data(), scale.data());
      write_tensor(out, slots[next][0], q.data());
      write_tensor(out, slots[next][1], scale.data());
    }
  }
  DTRAIN_CHECK(next == tensors.size() && out.written() == total, "wrote {} of {} tensors, {} of {} bytes", next,
               tensors.size(), out.written(), total);
  return total;
}

}  // namespace dtrain::exporter
