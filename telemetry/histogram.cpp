#include "telemetry/histogram.h"

#include <algorithm>
#include <cfloat>
#include <cmath>

namespace dtrain::telemetry {
namespace {

std::vector<double> make_limits() {
  std::vector<double> positive;
  for (double v = 1.0e-12; v < 1.0e20; v *= 1.1) positive.push_back(v);
  positive.push_back(DBL_MAX);
  std::vector<double> limits;
  limits.reserve(2 * positive.size() + 1);
  for (auto it = positive.rbegin(); it != positive.rend(); ++it) limits.push_back(-*it);
  limits.push_back(0.0);
  limits.insert(limits.end(), positive.begin(), positive.end());
  return limits;
}

}  // namespace

std::span<const double> default_bucket_limits() {
  static const std::vector<double> limits = make_limits();
  return limits;
}

Histogram::Histogram() : counts_(default_bucket_limits().size(), 0.0), min_(DBL_MAX), max_(-DBL_MAX) {}

void Histogram::add(std::span<const float> values) {
  const std::span<const double> limits = default_bucket_limits();
  const std::size_t last = limits.size() - 1;
  for (const float f : values) {
    if (std::isnan(f)) {
      ++nan_;
      continue;
    }
    const double v = f;
    const auto i = static_cast<std::size_t>(std::upper_bound(limits.begin(), limits.end(), v) - limits.begin());
    counts_[std::min(i, last)] += 1.0;  // +inf is not below DBL_MAX: the last bucket
    min_ = std::min(min_, v);
    max_ = std::max(max_, v);
    num_ += 1.0;
    sum_ += v;
    sum_squares_ += v * v;
  }
}

void Histogram::encode(tensorboard::HistogramProto& out) const {
  out.Clear();
  out.set_min(min_);
  out.set_max(max_);
  out.set_num(num_);
  out.set_sum(sum_);
  out.set_sum_squares(sum_squares_);
  const std::span<const double> limits = default_bucket_limits();
  for (std::size_t i = 0; i < counts_.size();) {
    double end = limits[i];
    double count = counts_[i];
    ++i;
    if (count <= 0.0) {  // a run of empty buckets: one bucket up to its last limit
      while (i < counts_.size() && counts_[i] <= 0.0) end = limits[i++];
    }
    out.add_bucket_limit(end);
    out.add_bucket(count);
  }
}

}  // namespace dtrain::telemetry
