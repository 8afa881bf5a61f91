#include "nn/cross_entropy.h"

#include <cmath>

#include "core/error.h"
#include "nn/cpu/vec_math.h"

namespace dtrain::nn {

CrossEntropyResult cross_entropy_forward(const float* logits, const std::int32_t* targets,
                                         float* probs, std::int64_t n, std::int64_t v) {
  CrossEntropyResult result;
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int32_t target = targets[i];
    if (target < 0 || target >= v) {
      throw Error(fmt::format("target {} of row {} is outside [0, {}): check the labels "
                              "against model.num_classes / model.vocab_size",
                              target, i, v));
    }
    const float* x = logits + i * v;
    float* p = probs + i * v;
    // The first largest logit, as a scalar scan finds it (bounded: a NaN row has none).
    const float mx = cpu::max_of(x, v);
    std::int64_t argmax = 0;
    while (argmax < v - 1 && !(x[argmax] == mx)) ++argmax;
    const float target_logit = x[target];
    for (std::int64_t j = 0; j < v; ++j) p[j] = cpu::fast_exp(x[j] - mx);
    cpu::LaneSums lanes;
    lanes.add(v, [&](auto at) { return at(p); });
    const float sum = lanes.total();
    const float inv = 1.0f / sum;
    for (std::int64_t j = 0; j < v; ++j) p[j] *= inv;
    // -log softmax[target] = logsumexp - x[target], without forming log(p).
    result.loss_sum += static_cast<double>(std::log(sum) + mx - target_logit);
    if (argmax == target) ++result.correct;
  }
  return result;
}

void cross_entropy_backward(float* probs_to_grad, const std::int32_t* targets, std::int64_t n,
                            std::int64_t v, float scale) {
  for (std::int64_t i = 0; i < n; ++i) {
    float* g = probs_to_grad + i * v;
    for (std::int64_t j = 0; j < v; ++j) g[j] *= scale;
    g[targets[i]] -= scale;
  }
}

}  // namespace dtrain::nn
