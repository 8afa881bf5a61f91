// Softmax cross-entropy over the last dimension, mean over rows.
#pragma once

#include <cstdint>

namespace dtrain::nn {

struct CrossEntropyResult {
  double loss_sum = 0.0;      // sum over rows of -log p[target]
  std::int64_t correct = 0;   // rows whose argmax equals the target
};

// Running totals of a model's forwards, kept in device memory (a model's
// kernels add each forward's result; all-zero bytes are the empty totals).
struct CrossEntropyTotals {
  double loss_sum;         // sum over rows of -log p[target]
  std::uint64_t correct;   // rows whose argmax equals the target
};

// logits: [n, v] -> probs: [n, v] (softmax; may alias logits); targets: [n].
// Throws dtrain::Error naming the row if a target is outside [0, v).
CrossEntropyResult cross_entropy_forward(const float* logits, const std::int32_t* targets,
                                         float* probs, std::int64_t n, std::int64_t v);

// d_logits = (probs - onehot(target)) * scale, in place over probs
// (scale = 1/n for the mean, times any accumulation factor).
void cross_entropy_backward(float* probs_to_grad, const std::int32_t* targets, std::int64_t n,
                            std::int64_t v, float scale);

}  // namespace dtrain::nn
