// Ring reduce-scatter over gloo's unbound buffers (gloo 0.5 has only an
// old-style halving-doubling one that cannot take a deadline per call).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>

#include <gloo/context.h>

#include "comm/staging.h"

namespace dtrain::comm::gloo_backend {

// input: world*count floats (rank r's slice r is its own contribution);
// output: count floats, the reduction of every rank's slice `rank`.
// Uses staging slots 1 and 2. Throws gloo's exceptions.
void ring_reduce_scatter(::gloo::Context& context, const float* input, float* output,
                         std::size_t count, bool max, std::uint32_t tag,
                         std::chrono::steady_clock::time_point deadline, Staging& staging);

}  // namespace dtrain::comm::gloo_backend
