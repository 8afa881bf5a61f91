#include "nn/rotary.h"

#include <omp.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "nn/cpu/convert.h"
#include "nn/cpu/parallel.h"

namespace dtrain::nn {

// Hugging Face's default rotary init, step by step in f32 (LlamaRotaryEmbedding:
// inv_freq = 1 / base ** (arange(0, hd, 2) / hd), freqs = inv_freq * position),
// so a model imported from a checkpoint sees the angles it was trained with.
// Only cos and sin of the f32 angle are taken in double (then rounded), where
// torch takes them in f32: within an ulp of torch's.
void rope_table(double theta, std::int64_t head_dim, std::int64_t positions, float* cos, float* sin) {
  DTRAIN_CHECK(head_dim > 0 && head_dim % 2 == 0, "rotary head_dim {} must be even and positive", head_dim);
  DTRAIN_CHECK(theta > 0.0, "rotary theta {} must be positive", theta);
  const std::int64_t half = head_dim / 2;
  std::vector<float> inv_freq(static_cast<std::size_t>(half));
  for (std::int64_t i = 0; i < half; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    inv_freq[i] = 1.0f / std::pow(static_cast<float>(theta), exponent);
  }
  for (std::int64_t p = 0; p < positions; ++p) {
    for (std::int64_t i = 0; i < half; ++i) {
      const float angle = static_cast<float>(p) * inv_freq[i];
      cos[p * half + i] = static_cast<float>(std::cos(static_cast<double>(angle)));
      sin[p * half + i] = static_cast<float>(std::sin(static_cast<double>(angle)));
    }
  }
}

namespace {

// One f32 head vector x of hd = 2 half elements, rotated in place forward
// (sign +1) or backward (sign -1, the transpose) by the angles whose cos and
// sin are c, s:
//   x[i] <- x[i] c - sign x[i + half] s,  x[i + half] <- x[i + half] c + sign x[i] s.
inline void rotate(float* x, const float* c, const float* s, std::int64_t half, float sign) {
  for (std::int64_t i = 0; i < half; ++i) {
    const float x0 = x[i], x1 = x[i + half], ss = sign * s[i];
    x[i] = x0 * c[i] - x1 * ss;
    x[i + half] = x1 * c[i] + x0 * ss;
  }
}

template <class F>
inline void load_row(const typename F::T* src, float* dst, std::int64_t n) {
  for (std::int64_t j = 0; j < n; ++j) dst[j] = F::load(src[j]);
}

template <class F>
inline void store_row(const float* src, typename F::T* dst, std::int64_t n) {
  for (std::int64_t j = 0; j < n; ++j) dst[j] = F::store(src[j]);
}

// The rotary table's rows for row t of a sequence, or null (no rotation).
struct Angles {
  const float* cos;
  const float* sin;
};

Angles angles_at(const HeadsShape& shape, const float* cos, const float* sin, std::int64_t t) {
  if (cos == nullptr) return {nullptr, nullptr};
  const std::int64_t offset = (shape.position + t) * (shape.head_dim / 2);
  return {cos + offset, sin + offset};
}

// A head vector x of format F rotated forward into y (no overlap), as
// rotate() in f32, each result rounded to F once.
template <class F>
inline void rotate_into(const typename F::T* __restrict x, typename F::T* __restrict y, const float* c,
                        const float* s, std::int64_t half) {
  for (std::int64_t i = 0; i < half; ++i) {
    const float x0 = F::load(x[i]), x1 = F::load(x[i + half]);
    y[i] = F::store(x0 * c[i] - x1 * s[i]);
    y[i + half] = F::store(x1 * c[i] + x0 * s[i]);
  }
}

// One row (b, t) of qkv_heads_forward: a repeated head is rotated once into
// its group's first slot, then copied.
template <class F>
void forward_row(const HeadsShape& shape, const typename F::T* packed, typename F::T* qkv, Angles a) {
  using T = typename F::T;
  const std::int64_t H = shape.heads, hkv = shape.kv_heads, hd = shape.head_dim, half = hd / 2;
  const std::int64_t group = shape.group();
  const auto bytes = static_cast<std::size_t>(hd) * sizeof(T);
  T* q = qkv;
  T* k = qkv + H * hd;
  T* v = qkv + 2 * H * hd;
  if (a.cos == nullptr) {
    std::memcpy(q, packed, static_cast<std::size_t>(H) * bytes);
  } else {
    for (std::int64_t h = 0; h < H; ++h) rotate_into<F>(packed + h * hd, q + h * hd, a.cos, a.sin, half);
  }
  for (std::int64_t g = 0; g < hkv; ++g) {
    T* first = k + g * group * hd;
    if (a.cos == nullptr) {
      std::memcpy(first, packed + (H + g) * hd, bytes);
    } else {
      rotate_into<F>(packed + (H + g) * hd, first, a.cos, a.sin, half);
    }
    for (std::int64_t h = g * group + 1; h < (g + 1) * group; ++h) std::memcpy(k + h * hd, first, bytes);
    const T* vsrc = packed + (H + hkv + g) * hd;
    for (std::int64_t h = g * group; h < (g + 1) * group; ++h) std::memcpy(v + h * hd, vsrc, bytes);
  }
}

// Packed head j (0 <= j < H + 2 Hkv) of one row of qkv_heads_backward: its
// gradient, in f32 in buf (hd), stored into d_packed_head and, when sums is
// given, added to sums (hd: that head's columns of d_bias).
template <class F>
void backward_head(const HeadsShape& shape, const typename F::T* d_qkv, typename F::T* d_packed_head, Angles a,
                   std::int64_t j, float* buf, float* sums) {
  const std::int64_t H = shape.heads, hkv = shape.kv_heads, hd = shape.head_dim, half = hd / 2;
  const std::int64_t group = shape.group();
  bool rotated = true;
  if (j < H) {
    load_row<F>(d_qkv + j * hd, buf, hd);
  } else {
    // A repeated key or value head: its group's gradients summed in head order.
    const bool key = j < H + hkv;
    rotated = key;
    const std::int64_t g = key ? j - H : j - H - hkv;
    const typename F::T* part = d_qkv + (key ? 1 : 2) * H * hd;
    load_row<F>(part + g * group * hd, buf, hd);
    for (std::int64_t h = g * group + 1; h < (g + 1) * group; ++h) {
      const typename F::T* src = part + h * hd;
      for (std::int64_t e = 0; e < hd; ++e) buf[e] += F::load(src[e]);
    }
  }
  if (rotated && a.cos != nullptr) rotate(buf, a.cos, a.sin, half, -1.0f);
  store_row<F>(buf, d_packed_head, hd);
  if (sums != nullptr) {
    for (std::int64_t e = 0; e < hd; ++e) sums[e] += buf[e];
  }
}

void check_shape(const HeadsShape& s, bool rotating) {
  DTRAIN_CHECK(s.heads > 0 && s.kv_heads > 0 && s.heads % s.kv_heads == 0,
               "heads {} must be a positive multiple of kv_heads {}", s.heads, s.kv_heads);
  DTRAIN_CHECK(s.head_dim > 0 && (!rotating || s.head_dim % 2 == 0),
               "head_dim {} must be positive, and even for rotary positions", s.head_dim);
}

}  // namespace

// Rows in parallel: each row's heads are independent of the others'.
template <class F>
void qkv_heads_forward(const HeadsShape& shape, const typename F::T* packed, typename F::T* qkv, const float* cos,
                       const float* sin) {
  check_shape(shape, cos != nullptr);
  const std::int64_t rows = shape.batch * shape.seq, hd = shape.head_dim;
  const std::int64_t in_w = shape.packed_width(), out_w = 3 * shape.heads * hd;
#pragma omp parallel for schedule(static) if (rows * out_w >= kParallelMin)
  for (std::int64_t r = 0; r < rows; ++r) {
    forward_row<F>(shape, packed + r * in_w, qkv + r * out_w, angles_at(shape, cos, sin, r % shape.seq));
  }
}

// Without d_bias, rows in parallel. With it, each thread takes a range of
// packed heads and goes over the rows in order, its heads of a row at once
// (contiguous columns): every column of d_bias then gets its rows added in
// order on one thread, the same sums whatever the thread count, in the same
// single pass.
template <class F>
void qkv_heads_backward(const HeadsShape& shape, const typename F::T* d_qkv, typename F::T* d_packed,
                        const float* cos, const float* sin, float* d_bias) {
  check_shape(shape, cos != nullptr);
  const std::int64_t rows = shape.batch * shape.seq, hd = shape.head_dim;
  const std::int64_t out_w = shape.packed_width(), in_w = 3 * shape.heads * hd;
  const std::int64_t packed_heads = shape.heads + 2 * shape.kv_heads;
  auto heads_of_row = [&](std::int64_t r, std::int64_t j0, std::int64_t j1, float* buf) {
    const Angles a = angles_at(shape, cos, sin, r % shape.seq);
    for (std::int64_t j = j0; j < j1; ++j) {
      backward_head<F>(shape, d_qkv + r * in_w, d_packed + r * out_w + j * hd, a, j, buf,
                       d_bias != nullptr ? d_bias + j * hd : nullptr);
    }
  };
#pragma omp parallel if (rows * out_w >= kParallelMin)
  {
    std::vector<float> buf(static_cast<std::size_t>(hd));
    if (d_bias == nullptr) {
#pragma omp for schedule(static)
      for (std::int64_t r = 0; r < rows; ++r) heads_of_row(r, 0, packed_heads, buf.data());
    } else {
      const std::int64_t t = omp_get_thread_num(), threads = omp_get_num_threads();
      const std::int64_t j0 = packed_heads * t / threads, j1 = packed_heads * (t + 1) / threads;
      for (std::int64_t r = 0; r < rows && j0 < j1; ++r) heads_of_row(r, j0, j1, buf.data());
    }
  }
}

#define DTRAIN_INSTANTIATE(F)                                                                          \
  template void qkv_heads_forward<F>(const HeadsShape&, const F::T*, F::T*, const float*, const float*); \
  template void qkv_heads_backward<F>(const HeadsShape&, const F::T*, F::T*, const float*, const float*, float*);
DTRAIN_FOR_EACH_FORMAT(DTRAIN_INSTANTIATE)
#undef DTRAIN_INSTANTIATE

}  // namespace dtrain::nn
