#include "export/quantize.h"

#include <algorithm>
#include <cmath>

namespace dtrain::exporter {

void quantize_rows_transposed(const float* w, std::int64_t rows, std::int64_t cols, std::int8_t* q_t,
                              float* scale) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* row = w + r * cols;
    float amax = 0.0f;
    for (std::int64_t j = 0; j < cols; ++j) amax = std::max(amax, std::fabs(row[j]));
    const float s = amax > 0.0f ? amax / static_cast<float>(kInt8Max) : 1.0f;
    scale[r] = s;
    for (std::int64_t j = 0; j < cols; ++j) {
      // nearbyint rounds half to even in the default rounding mode, as torch's quantize_per_channel does.
      const float q = std::nearbyint(row[j] / s);
      q_t[j * rows + r] =
          static_cast<std::int8_t>(std::clamp(q, -static_cast<float>(kInt8Max), static_cast<float>(kInt8Max)));
    }
  }
}

std::string int8_linear(GraphBuilder& g, const std::string& x, const std::string& weight, const std::string& bias,
                        const std::string& out) {
  const std::string xq = out + ".x_quantized", xs = out + ".x_scale", xz = out + ".x_zero_point";
  g.node("DynamicQuantizeLinear", {x}, std::vector<std::string>{xq, xs, xz});
  // The weights' zero point is 0 (symmetric), MatMulInteger's default.
  g.node("MatMulInteger", {xq, weight + "_quantized", xz}, out + ".int32");
  g.node("Cast", {out + ".int32"}, out + ".float", {{"to", std::int64_t{onnx::TensorProto::FLOAT}}});
  g.node("Mul", {xs, weight + "_scale"}, out + ".scale");
  const std::string scaled = bias.empty() ? out : out + ".no_bias";
  g.node("Mul", {out + ".float", out + ".scale"}, scaled);
  if (!bias.empty()) g.node("Add", {scaled, bias}, out);
  return out;
}

}  // namespace dtrain::exporter
