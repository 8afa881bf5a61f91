// Shared by the test_checkpoint_*.cpp files: a temporary root, a small model
// of two blocks and a ZeRO-like layout that splits the flat concatenation of
// all blocks evenly over the ranks, so rank boundaries fall inside blocks.
#pragma once

#include <stdlib.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "checkpoint/checkpoint.h"

namespace dtrain::checkpoint::testing {

class TempDir {
 public:
  TempDir() {
    std::string templ = (std::filesystem::temp_directory_path() / "dtrain_ckpt_XXXXXX").string();
    path_ = ::mkdtemp(templ.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

inline const std::vector<std::int64_t> kBlockNumel = {10, 7};
inline const std::vector<std::string> kTensors = {"params", "exp_avg", "exp_avg_sq"};

// The value element i of tensor t in block b holds in the checkpoint of `step`.
inline float value(std::int64_t step, int t, int b, std::int64_t i) {
  return static_cast<float>(step) + 1000.0f * static_cast<float>(t) + 100.0f * static_cast<float>(b) +
         static_cast<float>(i) + 0.25f;
}

// The ranges rank `rank` of `world` holds: its share of the flat concatenation.
inline std::vector<Range> layout(int world, int rank) {
  std::int64_t total = 0;
  for (auto n : kBlockNumel) total += n;
  const std::int64_t per = (total + world - 1) / world;
  const std::int64_t lo = std::min(total, rank * per), hi = std::min(total, (rank + 1) * per);
  std::vector<Range> ranges;
  std::int64_t base = 0;
  for (int b = 0; b < static_cast<int>(kBlockNumel.size()); ++b) {
    const std::int64_t begin = std::max(lo, base), end = std::min(hi, base + kBlockNumel[b]);
    for (const auto& tensor : kTensors) {
      if (begin < end) ranges.push_back({tensor, b, begin - base, end - begin});
    }
    base += kBlockNumel[b];
  }
  return ranges;
}

inline int tensor_index(const std::string& tensor) {
  return static_cast<int>(std::find(kTensors.begin(), kTensors.end(), tensor) - kTensors.begin());
}

inline std::vector<float> expected(std::int64_t step, const Range& r) {
  std::vector<float> v(r.count);
  for (std::int64_t i = 0; i < r.count; ++i) {
    v[i] = value(step, tensor_index(r.tensor), r.block, r.begin + i);
  }
  return v;
}

// Writes every rank's file of `step`; returns the manifest commit_step wants.
inline Manifest write_ranks(Env& env, const std::filesystem::path& root, std::int64_t step, int world) {
  prepare_step(env, root, step);
  Manifest manifest;
  manifest.set_step(step);
  manifest.set_world_size(world);
  for (std::size_t b = 0; b < kBlockNumel.size(); ++b) {
    Block* block = manifest.add_blocks();
    block->set_name("block" + std::to_string(b));
    block->set_numel(kBlockNumel[b]);
  }
  for (int rank = 0; rank < world; ++rank) {
    const std::vector<Range> ranges = layout(world, rank);
    std::vector<std::vector<float>> values;
    std::vector<RangeData> data;
    for (const Range& r : ranges) values.push_back(expected(step, r));
    for (std::size_t i = 0; i < ranges.size(); ++i) data.push_back({ranges[i], values[i].data()});
    add_records(write_rank_file(env, pending_dir(root, step), rank, data), &manifest);
  }
  return manifest;
}

inline void save_step(Env& env, const std::filesystem::path& root, std::int64_t step, int world) {
  commit_step(env, root, write_ranks(env, root, step, world));
}

inline std::vector<float> read(Env& env, const std::filesystem::path& dir, const Manifest& m,
                               const Range& r) {
  std::vector<float> out(r.count, -1.0f);
  read_range(env, dir, m, r, out.data());
  return out;
}

// Flips one bit of the byte at `offset`, in place, behind the Env's back.
inline void flip_byte(const std::filesystem::path& path, std::uint64_t offset) {
  std::string bytes = default_env()->read_file(path);
  bytes[offset] = static_cast<char>(bytes[offset] ^ 0x01);
  std::filesystem::remove(path);
  default_env()->write_file(path, bytes, false);
}

}  // namespace dtrain::checkpoint::testing
