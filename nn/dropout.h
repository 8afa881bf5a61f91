// Inverted dropout with a counter-based RNG: element i of a call with key k is
// kept iff hash(k, i) >= p, so backward recomputes the same mask from the key
// instead of storing it, and a run is reproducible from train.seed.
#pragma once

#include <cstdint>

namespace dtrain::nn {

// Derives the key of one dropout site from (seed, step, micro-step, site).
// `first_element` is the global index of the buffer's first element (a
// rank's row offset times the elements per row), so the mask of a global
// row is the same whichever rank holds it: N ranks x B rows drop exactly
// what 1 rank x N*B rows drops.
std::uint64_t dropout_key(std::uint64_t seed, std::int64_t step, std::int64_t micro,
                          std::int64_t site, std::int64_t first_element = 0);

// x[i] = kept ? x[i] / (1 - p) : 0. Used on activations in forward and on their
// gradients in backward with the same key. p == 0 leaves x untouched.
void dropout_apply(float* x, std::int64_t n, float p, std::uint64_t key);

}  // namespace dtrain::nn
