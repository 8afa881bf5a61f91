// GPU softmax cross-entropy over the last dimension (nn/cross_entropy.h gives
// the math): forward adds each row's loss and argmax hit into running totals
// in device memory (nn::CrossEntropyTotals), so a step needs no host
// synchronisation until the totals are read. Targets are checked on the host
// before they are staged (nn::Graph), so the kernels trust them. Device
// pointers; asynchronous on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "nn/cross_entropy.h"

namespace dtrain::nn::cuda {

// logits: [n, v] -> probs: [n, v] (softmax; may alias logits); targets: [n],
// each in [0, v). Adds the rows' -log p[target] and the rows whose argmax
// (the first on ties, as the CPU) is the target to *totals (unless null:
// backward recomputing probabilities).
void cross_entropy_forward(const float* logits, const std::int32_t* targets, float* probs, std::int64_t n,
                           std::int64_t v, CrossEntropyTotals* totals, cudaStream_t stream);

// d_logits = (probs - onehot(target)) * scale in place over probs.
void cross_entropy_backward(float* probs_to_grad, const std::int32_t* targets, std::int64_t n, std::int64_t v,
                            float scale, cudaStream_t stream);

}  // namespace dtrain::nn::cuda
