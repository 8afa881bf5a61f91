// Which GELU: the exact erf form (BERT, today's default) or the tanh
// approximation GPT-2 was trained with (PyTorch's approximate="tanh"):
//   erf:  gelu(x) = 0.5 x (1 + erf(x / sqrt 2))
//   tanh: gelu(x) = 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))
// A header of its own, with no dependencies, so that the CUDA kernels'
// headers (compiled by nvcc) share it with the CPU's.
#pragma once

#include <cstdint>

namespace dtrain::nn {

enum class GeluForm : std::uint8_t { erf, tanh };

}  // namespace dtrain::nn
