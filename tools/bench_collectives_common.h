// What `dtrain-bench allreduce|reduce_scatter|allgather|broadcast` and its
// raw-library baseline (bench/raw_collectives.cpp) share, so that both print
// tables a script can put side by side: the size sweep, nccl-tests'
// bandwidth definitions, the data pattern and the table format.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

namespace dtrain::tools {

// Message sizes in bytes: min, min*factor, ... while <= max. Each size is at
// least one byte larger than the one before, so any factor > 1 terminates.
inline std::vector<std::size_t> sweep_sizes(std::size_t min_bytes, std::size_t max_bytes,
                                            double factor) {
  std::vector<std::size_t> sizes;
  for (std::size_t s = std::max<std::size_t>(min_bytes, 1); s <= max_bytes;) {
    sizes.push_back(s);
    const auto next = static_cast<std::size_t>(std::ceil(static_cast<double>(s) * factor));
    s = std::max(next, s + 1);
  }
  return sizes;
}

// nccl-tests' bus bandwidth factor (doc/PERFORMANCE.md): the bytes each rank
// moves in a ring algorithm per byte of `size`, so busbw compares across
// world sizes and against link speed.
inline double bus_factor(std::string_view collective, int world_size) {
  const double n = world_size;
  if (collective == "allreduce") return 2.0 * (n - 1.0) / n;
  if (collective == "reduce_scatter" || collective == "allgather") return (n - 1.0) / n;
  return 1.0;  // broadcast
}

// Input element `index` of `rank`: small non-negative integers, so sums over
// ranks are exact in f32 accumulation and, for up to 17 ranks, representable
// in bf16 (8 significant bits) and f16. `narrow` selects the 16-bit range;
// the f32 range has a longer period to catch misplaced elements.
inline float pattern_value(int rank, std::size_t index, bool narrow) {
  const std::size_t period = narrow ? 13 : 1021;
  const std::size_t modulus = narrow ? 16 : 1024;
  const auto r = static_cast<std::size_t>(rank) + 1;
  return static_cast<float>(r * (index % period + 1) % modulus);
}

// One row of the table. `bytes` and `count` follow nccl-tests: for
// allreduce and broadcast the per-rank buffer; for reduce_scatter the whole
// input and for allgather the whole output, with `count` the elements of one
// rank's slice.
struct BenchRow {
  std::size_t bytes = 0;
  std::size_t count = 0;
  std::string_view type;
  std::string_view redop;
  double time_us = 0.0;
  double algbw = 0.0;  // GB/s (1e9 bytes per second)
  double busbw = 0.0;
  std::int64_t wrong = 0;
};

inline BenchRow make_row(std::size_t bytes, std::size_t count, std::string_view type,
                         std::string_view redop, double time_us, double factor,
                         std::int64_t wrong) {
  const double algbw = time_us > 0.0 ? static_cast<double>(bytes) / (time_us * 1e3) : 0.0;
  return {bytes, count, type, redop, time_us, algbw, algbw * factor, wrong};
}

inline std::string table_header() {
  return fmt::format("#{:>12} {:>12} {:>6} {:>6} {:>12} {:>12} {:>12} {:>7}\n", "size(B)",
                     "count", "type", "redop", "time(us)", "algbw(GB/s)", "busbw(GB/s)",
                     "#wrong");
}

inline std::string format_row(const BenchRow& row) {
  return fmt::format(" {:>12} {:>12} {:>6} {:>6} {:>12.2f} {:>12.3f} {:>12.3f} {:>7}\n",
                     row.bytes, row.count, row.type, row.redop, row.time_us, row.algbw,
                     row.busbw, row.wrong);
}

// The `name: value` lines after the table (docs/performance.md, "How the figures are measured").
class BenchSummary {
 public:
  void add(const BenchRow& row) {
    busbw_sum_ += row.busbw;
    wrong_total_ += row.wrong;
    ++rows_;
  }
  std::int64_t wrong_total() const { return wrong_total_; }
  double busbw_avg() const { return rows_ > 0 ? busbw_sum_ / static_cast<double>(rows_) : 0.0; }

  std::string lines(std::string_view backend, int world_size) const {
    return fmt::format("busbw_avg: {:.3f}\nwrong_total: {}\nworld_size: {}\nbackend: {}\n",
                       busbw_avg(), wrong_total_, world_size, backend);
  }

 private:
  double busbw_sum_ = 0.0;
  std::int64_t wrong_total_ = 0;
  int rows_ = 0;
};

}  // namespace dtrain::tools
