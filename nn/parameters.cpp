#include "nn/parameters.h"

#include <atomic>
#include <cmath>
#include <cstring>
#include <random>

#include "core/error.h"

namespace dtrain::nn {

void ParameterLayout::begin_block(std::string name) {
  blocks_.push_back(BlockSpec{std::move(name), 0, static_cast<int>(params_.size()), 0});
  block_offsets_.push_back(total_);
}

int ParameterLayout::add(std::string name, std::vector<std::int64_t> shape, Init init,
                         bool decay) {
  DTRAIN_CHECK(!blocks_.empty(), "parameter {} declared before any block", name);
  BlockSpec& block = blocks_.back();
  std::int64_t numel = 1;
  for (std::int64_t d : shape) numel *= d;
  ParamSpec spec{std::move(name), std::move(shape), init, decay,
                 static_cast<int>(blocks_.size()) - 1, block.numel, numel};
  block.numel += numel;
  block.num_params += 1;
  total_ += numel;
  params_.push_back(std::move(spec));
  return static_cast<int>(params_.size()) - 1;
}

const ParamSpec& ParameterLayout::find(const std::string& name) const {
  for (const ParamSpec& p : params_) {
    if (p.name == name) return p;
  }
  throw Error(fmt::format("no parameter named '{}' in the model", name));
}

void init_parameter(const ParamSpec& spec, int index, std::uint64_t seed, float* data) {
  const auto n = static_cast<std::size_t>(spec.numel);
  switch (spec.init) {
    case Init::zeros:
      std::memset(data, 0, n * sizeof(float));
      return;
    case Init::ones:
      for (std::size_t i = 0; i < n; ++i) data[i] = 1.0f;
      return;
    case Init::normal:
      break;
  }
  // Box-Muller over mt19937_64, so the values are fixed by (seed, index) alone
  // and do not depend on a standard library's normal_distribution.
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ULL + static_cast<std::uint64_t>(index) + 1);
  constexpr double kStd = 0.02;
  constexpr double kTwoPi = 6.283185307179586;
  auto uniform = [&rng] { return (static_cast<double>(rng() >> 11) + 0.5) * 0x1.0p-53; };
  for (std::size_t i = 0; i < n; i += 2) {
    const double r = std::sqrt(-2.0 * std::log(uniform()));
    const double theta = kTwoPi * uniform();
    data[i] = static_cast<float>(kStd * r * std::cos(theta));
    if (i + 1 < n) data[i + 1] = static_cast<float>(kStd * r * std::sin(theta));
  }
}

ParameterStore::ParameterStore(const ParameterLayout& layout, std::uint64_t seed)
    : layout_(layout),
      params_(static_cast<std::size_t>(layout.total_numel())),
      grads_(static_cast<std::size_t>(layout.total_numel())),
      exp_avg_(static_cast<std::size_t>(layout.total_numel())),
      exp_avg_sq_(static_cast<std::size_t>(layout.total_numel())) {
  const auto& specs = layout.params();
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const ParamSpec& p = specs[i];
    init_parameter(p, static_cast<int>(i), seed,
                   params_.data() + layout.block_offset(p.block) + p.offset);
  }
}

BlockPointers ParameterStore::pointers() {
  BlockPointers ptrs;
  for (int b = 0; b < layout_.num_blocks(); ++b) {
    ptrs.params.push_back(params_.data() + layout_.block_offset(b));
    ptrs.grads.push_back(grads_.data() + layout_.block_offset(b));
  }
  return ptrs;
}

void ParameterStore::zero_grads() {
  std::memset(grads_.data(), 0, grads_.size() * sizeof(float));
}

std::uint64_t next_weights_version() {
  static std::atomic<std::uint64_t> last{0};
  return last.fetch_add(1, std::memory_order_relaxed) + 1;
}

}  // namespace dtrain::nn
