// Histogram: the values of a tensor as TensorBoard's HistogramProto, over
// TensorFlow's default bucket limits (tsl/lib/histogram/histogram.cc, which
// TensorBoard's histogram dashboard draws): 0, then +-1e-12 growing by 10%
// per bucket up to 1e20, then +-DBL_MAX. A value v counts in the bucket i
// with limit[i-1] <= v < limit[i]. NaN values are left out (counted in nan()).
// Threading: one thread owns a histogram.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "proto/tensorboard.pb.h"

namespace dtrain::telemetry {

// The limits, ascending: 1,551 of them, from -DBL_MAX to DBL_MAX.
std::span<const double> default_bucket_limits();

class Histogram {
 public:
  Histogram();

  void add(std::span<const float> values);
  // Writes min, max, num, sum, sum_squares and the buckets, each run of
  // empty buckets collapsed into one (as TensorFlow encodes them).
  void encode(tensorboard::HistogramProto& out) const;

  double num() const { return num_; }
  std::int64_t nan() const { return nan_; }

 private:
  std::vector<double> counts_;  // one per limit
  double min_, max_;
  double num_ = 0.0, sum_ = 0.0, sum_squares_ = 0.0;
  std::int64_t nan_ = 0;
};

}  // namespace dtrain::telemetry
