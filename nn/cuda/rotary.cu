#include "nn/cuda/rotary.h"

#include "core/cuda/check.h"
#include "nn/cuda/device_math.cuh"

namespace dtrain::nn::cuda {
namespace {

// The shape as the kernels use it; row r of the batch is (b, t) = (r / seq, r % seq).
struct Heads {
  std::int64_t seq, heads, kv_heads, head_dim, position;
  const float* cos;  // null: no rotation
  const float* sin;
  __device__ std::int64_t group() const { return heads / kv_heads; }
  __device__ std::int64_t packed_width() const { return (heads + 2 * kv_heads) * head_dim; }
  // The table's entry for element e of a head in row r (of its half: e mod head_dim / 2).
  __device__ std::int64_t angle(std::int64_t r, std::int64_t e) const {
    const std::int64_t half = head_dim / 2;
    return (position + r % seq) * half + e % half;
  }
};

// Element e of a head vector v (v(i): its element i, f32) rotated forwards
// (sign 1) or backwards (sign -1, the transpose) by the angle of row r:
//   forwards:  y[i] = v[i] c - v[i + half] s,  y[i + half] = v[i + half] c + v[i] s
//   backwards: y[i] = v[i] c + v[i + half] s,  y[i + half] = v[i + half] c - v[i] s
// __fmul_rn / __fadd_rn: no contraction into FMAs the CPU code does not use.
template <class Vec>
__device__ float rotated(const Heads& h, std::int64_t r, std::int64_t e, Vec v, float sign) {
  const std::int64_t half = h.head_dim / 2, k = h.angle(r, e);
  const float c = h.cos[k], s = __fmul_rn(sign, h.sin[k]);
  if (e < half) return __fsub_rn(__fmul_rn(v(e), c), __fmul_rn(v(e + half), s));
  return __fadd_rn(__fmul_rn(v(e), c), __fmul_rn(v(e - half), s));
}

// One thread per element of qkv [rows, 3, H, hd]; it reads its source
// element (and the partner of the rotation) from the packed row.
template <DType D>
__global__ void qkv_heads_forward_kernel(const Storage<D>* packed, Storage<D>* qkv, Heads h, std::int64_t n) {
  using F = detail::Format<D>;
  detail::for_each_index(n, [=](std::int64_t i) {
    const std::int64_t e = i % h.head_dim, head = i / h.head_dim % h.heads;
    const std::int64_t part = i / (h.head_dim * h.heads) % 3, r = i / (3 * h.heads * h.head_dim);
    const std::int64_t source = part == 0 ? head : h.heads + (part - 1) * h.kv_heads + head / h.group();
    const Storage<D>* x = packed + r * h.packed_width() + source * h.head_dim;
    if (part == 2 || h.cos == nullptr) {
      qkv[i] = x[e];  // a copy: the same bits
      return;
    }
    qkv[i] = F::store(rotated(h, r, e, [=](std::int64_t k) { return F::load(x[k]); }, 1.0f));
  });
}

// d_packed's element (r, col) in f32: the query head's gradient, or the sum
// over the group of a key or value head's (in head order), then the
// rotation backwards for queries and keys.
template <DType D>
__device__ float packed_grad(const Storage<D>* d_qkv, const Heads& h, std::int64_t r, std::int64_t col) {
  using F = detail::Format<D>;
  const std::int64_t e = col % h.head_dim, j = col / h.head_dim;
  const std::int64_t part = j < h.heads ? 0 : (j < h.heads + h.kv_heads ? 1 : 2);
  const std::int64_t first = part == 0 ? j : (j - h.heads - (part - 1) * h.kv_heads) * h.group();
  const std::int64_t count = part == 0 ? 1 : h.group();
  const Storage<D>* g = d_qkv + (r * 3 + part) * h.heads * h.head_dim + first * h.head_dim;
  auto summed = [=](std::int64_t k) {
    float s = 0.0f;
    for (std::int64_t m = 0; m < count; ++m) s = __fadd_rn(s, F::load(g[m * h.head_dim + k]));
    return s;
  };
  if (part == 2 || h.cos == nullptr) return summed(e);
  return rotated(h, r, e, summed, -1.0f);
}

template <DType D>
__global__ void qkv_heads_backward_kernel(const Storage<D>* d_qkv, Storage<D>* d_packed, Heads h, std::int64_t n) {
  detail::for_each_index(n, [=](std::int64_t i) {
    const std::int64_t w = h.packed_width();
    d_packed[i] = detail::Format<D>::store(packed_grad<D>(d_qkv, h, i / w, i % w));
  });
}

// Each element once, by the thread that owns its column (device_math.cuh's
// add_column_sums), which also adds it to the column's sum.
template <DType D>
__global__ void qkv_heads_backward_bias_kernel(const Storage<D>* d_qkv, Storage<D>* d_packed, float* d_bias, Heads h,
                                               std::int64_t rows) {
  float* const out[1] = {d_bias};
  const std::int64_t w = h.packed_width();
  detail::add_column_sums<1>(
      [=](std::int64_t r, std::int64_t col) {
        const float v = packed_grad<D>(d_qkv, h, r, col);
        d_packed[r * w + col] = detail::Format<D>::store(v);
        return detail::Sums<1>{{v}};
      },
      rows, w, out);
}

}  // namespace

template <DType D>
void qkv_heads_forward(const Storage<D>* packed, Storage<D>* qkv, const float* cos, const float* sin,
                       std::int64_t batch, std::int64_t seq, std::int64_t heads, std::int64_t kv_heads,
                       std::int64_t head_dim, std::int64_t position, cudaStream_t stream) {
  const Heads h{seq, heads, kv_heads, head_dim, position, cos, sin};
  const std::int64_t n = batch * seq * 3 * heads * head_dim;
  detail::launch(qkv_heads_forward_kernel<D>, n, stream, packed, qkv, h, n);
}

template <DType D>
void qkv_heads_backward(const Storage<D>* d_qkv, Storage<D>* d_packed, const float* cos, const float* sin,
                        float* d_bias, std::int64_t batch, std::int64_t seq, std::int64_t heads,
                        std::int64_t kv_heads, std::int64_t head_dim, std::int64_t position, cudaStream_t stream) {
  const Heads h{seq, heads, kv_heads, head_dim, position, cos, sin};
  const std::int64_t rows = batch * seq, width = (heads + 2 * kv_heads) * head_dim;
  if (d_bias == nullptr) {
    return detail::launch(qkv_heads_backward_kernel<D>, rows * width, stream, d_qkv, d_packed, h, rows * width);
  }
  if (rows == 0 || width == 0) return;
  qkv_heads_backward_bias_kernel<D><<<detail::column_sum_grid(width), dim3(detail::kSumCols, detail::kSumLanes), 0,
                                      stream>>>(d_qkv, d_packed, d_bias, h, rows);
  DTRAIN_CUDA_LAUNCHED();
}

#define DTRAIN_INSTANTIATE(D)                                                                                  \
  template void qkv_heads_forward<D>(const Storage<D>*, Storage<D>*, const float*, const float*, std::int64_t, \
                                     std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,    \
                                     cudaStream_t);                                                           \
  template void qkv_heads_backward<D>(const Storage<D>*, Storage<D>*, const float*, const float*, float*,      \
                                      std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,   \
                                      std::int64_t, cudaStream_t);
DTRAIN_CUDA_FOR_EACH_FORMAT(DTRAIN_INSTANTIATE)
#undef DTRAIN_INSTANTIATE

}  // namespace dtrain::nn::cuda
