#include "tools/bench_collectives_data.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "core/error.h"
#include "tools/bench_collectives_common.h"

namespace dtrain::tools {
namespace {

using comm::OpKind;
using comm::ReduceOp;

void store(DType dtype, std::byte* base, std::size_t i, float v) {
  switch (dtype) {
    case DType::f32: std::memcpy(base + i * 4, &v, 4); return;
    case DType::bf16: {
      const std::uint16_t h = f32_to_bf16(v);
      std::memcpy(base + i * 2, &h, 2);
      return;
    }
    case DType::f16: {
      const std::uint16_t h = f32_to_f16(v);
      std::memcpy(base + i * 2, &h, 2);
      return;
    }
    default: break;
  }
  throw Error(fmt::format("dtrain-bench: dtype {} is not benchmarked", dtype_name(dtype)));
}

float load(DType dtype, const std::byte* base, std::size_t i) {
  std::uint16_t h = 0;
  switch (dtype) {
    case DType::f32: {
      float v = 0.0f;
      std::memcpy(&v, base + i * 4, 4);
      return v;
    }
    case DType::bf16: std::memcpy(&h, base + i * 2, 2); return bf16_to_f32(h);
    case DType::f16: std::memcpy(&h, base + i * 2, 2); return f16_to_f32(h);
    default: break;
  }
  throw Error(fmt::format("dtrain-bench: dtype {} is not benchmarked", dtype_name(dtype)));
}

float round_to(DType dtype, float v) {
  std::byte tmp[4];
  store(dtype, tmp, 0, v);
  return load(dtype, tmp, 0);
}

bool narrow(DType dtype) { return dtype != DType::f32; }

bool reduces(OpKind kind) { return kind == OpKind::allreduce || kind == OpKind::reduce_scatter; }

// The result at `index` of this rank's result buffer, before rounding to the
// dtype (sums of the pattern's small integers are exact in f32).
float exact_result(const Pattern& p, const Layout& l, std::size_t index) {
  const bool nw = narrow(p.dtype);
  if (p.kind == OpKind::allgather) {
    return pattern_value(static_cast<int>(index / l.count), index % l.count, nw);
  }
  if (p.kind == OpKind::broadcast) return pattern_value(p.root, index, nw);
  // reduce_scatter leaves slice `rank` of the reduced input on this rank.
  const std::size_t global = p.kind == OpKind::reduce_scatter
                                 ? static_cast<std::size_t>(p.rank) * l.count + index
                                 : index;
  float sum = 0.0f, max = 0.0f;
  for (int q = 0; q < p.world_size; ++q) {
    const float v = pattern_value(q, global, nw);
    sum += v;
    max = std::max(max, v);
  }
  if (p.op == ReduceOp::max) return max;
  if (p.op == ReduceOp::avg) return sum / static_cast<float>(p.world_size);
  return sum;
}

// avg divides (or multiplies by 1/n) once, in f32 or in the dtype: allow two
// units in the last place of the dtype.
float avg_tolerance(DType dtype) {
  if (dtype == DType::bf16) return 0x1p-7f;
  if (dtype == DType::f16) return 0x1p-10f;
  return 0x1p-22f;
}

}  // namespace

Layout make_layout(OpKind kind, std::size_t bytes, std::size_t element_size, int world_size) {
  const auto ranks = static_cast<std::size_t>(world_size);
  Layout l;
  if (kind == OpKind::reduce_scatter || kind == OpKind::allgather) {
    l.count = bytes / (element_size * ranks);
    const bool scatter = kind == OpKind::reduce_scatter;
    l.in_elems = scatter ? l.count * ranks : l.count;
    l.out_elems = scatter ? l.count : l.count * ranks;
    l.bytes = l.count * ranks * element_size;
  } else {
    l.count = bytes / element_size;
    l.in_elems = l.count;
    l.bytes = l.count * element_size;
  }
  return l;
}

void fill_input(const Pattern& p, const Layout& l, std::byte* input) {
  const bool nw = narrow(p.dtype);
  for (std::size_t i = 0; i < l.in_elems; ++i) {
    store(p.dtype, input, i, pattern_value(p.rank, i, nw));
  }
}

void fill_value(DType dtype, std::byte* data, std::size_t count, float value) {
  for (std::size_t i = 0; i < count; ++i) store(dtype, data, i, value);
}

std::int64_t count_wrong(const Pattern& p, const Layout& l, const std::byte* result) {
  const std::size_t elems = l.out_elems > 0 ? l.out_elems : l.in_elems;
  const bool approximate = reduces(p.kind) && p.op == ReduceOp::avg;
  const float tolerance = avg_tolerance(p.dtype);
  std::int64_t wrong = 0;
  for (std::size_t i = 0; i < elems; ++i) {
    const float got = load(p.dtype, result, i);
    const float exact = exact_result(p, l, i);
    const bool ok = approximate ? std::fabs(got - exact) <= tolerance * std::fabs(exact)
                                : got == round_to(p.dtype, exact);
    if (!ok) ++wrong;
  }
  return wrong;
}

BenchBuffer::BenchBuffer(std::size_t bytes, nn::Device* device)
    : host_(bytes), device_(device), on_device_(device != nullptr ? nn::DeviceArray<std::byte>(*device, bytes)
                                                                  : nn::DeviceArray<std::byte>()) {
  if (device_ != nullptr) device_->synchronize();  // zero-filled before the first timed operation
}

void BenchBuffer::to_device(std::size_t bytes) {
  if (device_ == nullptr) return;
  device_->copy(on_device_.data(), host_.data(), bytes);
  device_->synchronize();
}

void BenchBuffer::to_host(std::size_t bytes) {
  if (device_ == nullptr) return;
  device_->copy(host_.data(), on_device_.data(), bytes);
  device_->synchronize();
}

}  // namespace dtrain::tools
