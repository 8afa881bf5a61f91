// Dynamic int8 quantization of a Linear, as torch.quantization.quantize_dynamic
// does it with per-channel weights:
//   weights   int8, one scale per output channel, symmetric (zero point 0),
//             values in [-127, 127]; quantized once, at export;
//   inputs    quantized at run time per tensor to uint8 with a scale and zero
//             point of their own range (DynamicQuantizeLinear);
//   product   MatMulInteger in int32, then Cast to float and one multiply by
//             input scale x weight scale per output channel, then the bias.
// This is the operator form ONNX Runtime's own quantize_dynamic writes (its
// graph optimizer fuses it into one int8 kernel); docs/deploy.md says why it
// is preferred here to the QDQ form.
//
// Initializers of a quantized weight W [out, in] named NAME:
//   NAME_quantized  int8 [in, out]  (W transposed: MatMulInteger's B is [K, N])
//   NAME_scale      float [out]
// export/onnx_writer.h fills them with quantize_rows_transposed. Functions
// are pure or append to the caller's GraphBuilder; any thread.
#pragma once

#include <cstdint>
#include <string>

#include "export/onnx_graph.h"

namespace dtrain::exporter {

inline constexpr int kInt8Max = 127;

// Quantizes the Linear weight w [rows, cols] (rows = output channels,
// PyTorch's [out, in]) row by row: scale[r] = max_j |w[r, j]| / 127 (1 for an
// all-zero row), q = w / scale rounded half to even. Writes q transposed,
// q_t [cols, rows], and scale [rows]; so w[r, j] ~= q_t[j, r] * scale[r]
// within scale[r] / 2. REQUIRES: w finite; q_t and scale hold cols * rows and
// rows elements.
void quantize_rows_transposed(const float* w, std::int64_t rows, std::int64_t cols, std::int8_t* q_t,
                              float* scale);

// out [N, rows] = x [N, cols] W^T (+ bias [rows] unless bias is ""), with W
// the int8 weight `weight` (its two initializers above). Value names start with out.
std::string int8_linear(GraphBuilder& g, const std::string& x, const std::string& weight, const std::string& bias,
                        const std::string& out);

}  // namespace dtrain::exporter
