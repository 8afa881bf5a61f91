// GPU softmax cross-entropy over the last dimension (nn/cross_entropy.h gives
// the math): the loss sum and the count of correct rows stay on the device
// until the caller reads them, so a step needs no host synchronisation.
// Device pointers; asynchronous on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace dtrain::nn::cuda {

// Lives in device memory; cross_entropy_reset() prepares it, forward adds to it.
struct CrossEntropyDeviceResult {
  double loss_sum;             // sum over rows of -log p[target]
  unsigned long long correct;  // rows whose argmax (first on ties) equals the target
  std::int32_t bad_row;        // -1, or one row whose target is outside [0, v)
  std::int32_t padding;
};

// result = {0, 0, -1}.
void cross_entropy_reset(CrossEntropyDeviceResult* result, cudaStream_t stream);

// logits: [n, v] -> probs: [n, v] (softmax; may alias logits); targets: [n].
// Adds the rows' loss and correct count to *result. A target outside [0, v)
// cannot throw from the device: the row adds nothing and bad_row names it
// (the CPU kernel throws); the caller checks once the result is read.
void cross_entropy_forward(const float* logits, const std::int32_t* targets, float* probs,
                           std::int64_t n, std::int64_t v, CrossEntropyDeviceResult* result,
                           cudaStream_t stream);

// d_logits = (probs - onehot(target)) * scale in place over probs (scale =
// 1/n for the mean, times any accumulation factor); rows with a bad target
// get only probs * scale.
void cross_entropy_backward(float* probs_to_grad, const std::int32_t* targets, std::int64_t n,
                            std::int64_t v, float scale, cudaStream_t stream);

}  // namespace dtrain::nn::cuda
