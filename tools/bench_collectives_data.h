// The data side of `dtrain-bench <collective>` (tools/bench_collectives.cpp):
// message layouts, buffers that live where the backend needs them, and the
// input pattern whose results are known in closed form.
#pragma once

#include <cstddef>
#include <cstdint>

#include "comm/backend.h"
#include "core/aligned_buffer.h"
#include "core/dtype.h"
#include "nn/device.h"

namespace dtrain::tools {

// One message size of the sweep, in nccl-tests' terms (see BenchRow).
struct Layout {
  std::size_t count = 0;      // elements passed to the Communicator call
  std::size_t in_elems = 0;   // elements of this rank's input
  std::size_t out_elems = 0;  // elements of this rank's separate output; 0: in place
  std::size_t bytes = 0;      // the size the table reports
};

// `bytes` rounded down to whole elements (whole slices for reduce_scatter
// and allgather, where it is the total over ranks).
Layout make_layout(comm::OpKind kind, std::size_t bytes, std::size_t element_size,
                   int world_size);

// What one rank sends and expects back.
struct Pattern {
  comm::OpKind kind = comm::OpKind::allreduce;
  DType dtype = DType::f32;
  comm::ReduceOp op = comm::ReduceOp::sum;
  int root = 0;
  int rank = 0;
  int world_size = 1;
};

// Fills this rank's input of layout `l` (host memory) with pattern_value().
void fill_input(const Pattern& p, const Layout& l, std::byte* input);
// Sets `count` elements to `value`.
void fill_value(DType dtype, std::byte* data, std::size_t count, float value);
// Elements of this rank's result (the output, or the input when in place)
// that differ from the closed-form result. sum and max must match exactly;
// avg within the rounding of one division in the dtype.
std::int64_t count_wrong(const Pattern& p, const Layout& l, const std::byte* result);

// A buffer a collective runs on, with a host copy to fill and check. On a
// CPU backend (device null) the host copy is the buffer; for nccl the buffer
// is memory of `device` (a GPU, nn/cuda_device.h), which must outlive it.
// Allocated and touched once, at the largest size, so timed operations never
// fault in fresh pages.
class BenchBuffer {
 public:
  BenchBuffer(std::size_t bytes, nn::Device* device);

  void* data() { return device_ != nullptr ? static_cast<void*>(on_device_.data()) : host_.data(); }
  std::byte* host() { return host_.data(); }
  // Copy the first `bytes` between the host copy and the device, waiting for
  // the copy (no-ops on CPU).
  void to_device(std::size_t bytes);
  void to_host(std::size_t bytes);

 private:
  AlignedBuffer<std::byte> host_;
  nn::Device* device_;
  nn::DeviceArray<std::byte> on_device_;
};

}  // namespace dtrain::tools
