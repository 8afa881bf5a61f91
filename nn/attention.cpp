#include "nn/attention.h"

#include <cmath>
#include <cstring>

#include "nn/attention_steps.h"
#include "nn/cpu/kernel_profile.h"
#include "nn/cpu/matmul.h"
#include "nn/cpu/parallel.h"
#include "nn/cpu/vec_math.h"

namespace dtrain::nn {

using cpu::Gemm;

namespace {

// Copies part `part` of an interleaved [B, T, parts, H, hd] buffer to
// head-major [B, H, T, hd] (to_heads) or back; dense operands keep oneDNN on
// brgemm.
template <class T>
void copy_heads(const AttentionShape& s, bool to_heads, T* interleaved, std::int64_t parts, std::int64_t part,
                T* heads) {
  const std::int64_t hd = s.head_dim;
  const std::int64_t row = parts * s.d_model();
  const auto bytes = static_cast<std::size_t>(hd) * sizeof(T);
  const cpu::KernelTimer timer(cpu::KernelKind::head_copy, 2.0 * static_cast<double>(s.head_elems() * sizeof(T)));
#pragma omp parallel for collapse(2) schedule(static) if (s.head_elems() >= kParallelMin)
  for (std::int64_t b = 0; b < s.batch; ++b) {
    for (std::int64_t h = 0; h < s.heads; ++h) {
      for (std::int64_t t = 0; t < s.seq; ++t) {
        T* inter = interleaved + (b * s.seq + t) * row + part * s.d_model() + h * hd;
        T* head = heads + ((b * s.heads + h) * s.seq + t) * hd;
        if (to_heads) {
          std::memcpy(head, inter, bytes);
        } else {
          std::memcpy(inter, head, bytes);
        }
      }
    }
  }
}

template <class T>
void to_heads(const AttentionShape& s, const T* src, std::int64_t parts, std::int64_t part, T* dst) {
  copy_heads(s, true, const_cast<T*>(src), parts, part, dst);  // only read in this direction
}

template <class T>
void from_heads(const AttentionShape& s, const T* src, std::int64_t parts, std::int64_t part, T* dst) {
  copy_heads(s, false, dst, parts, part, const_cast<T*>(src));  // only read in this direction
}

// fn(r) for every row r of the [B*H*T, T] score matrices, across threads.
template <class Fn>
void for_each_score_row(const AttentionShape& s, Fn fn) {
  const std::int64_t rows = s.batch * s.heads * s.seq;
#pragma omp parallel for schedule(static) if (rows * s.seq >= kParallelMin)
  for (std::int64_t r = 0; r < rows; ++r) fn(r);
}

// probs = softmax(scores) row-wise; causal rows keep columns <= i. The exps
// go back into scores (f32) first, so probs may alias scores.
template <class F>
void softmax_rows(const AttentionShape& s, float* scores, typename F::T* probs) {
  const std::int64_t T = s.seq;
  const double elems = static_cast<double>(s.batch * s.heads * T * T);
  const cpu::KernelTimer timer(cpu::KernelKind::softmax_forward, elems * (4 + sizeof(typename F::T)));  // S in, P out
  for_each_score_row(s, [&](std::int64_t r) {
    float* e = scores + r * T;
    typename F::T* p = probs + r * T;
    const std::int64_t valid = s.causal ? (r % T) + 1 : T;
    float mx = e[0];
    for (std::int64_t j = 1; j < valid; ++j) mx = e[j] > mx ? e[j] : mx;
    float sum = 0.0f;
    for (std::int64_t j = 0; j < valid; ++j) {
      e[j] = cpu::fast_exp(e[j] - mx);
      sum += e[j];
    }
    const float inv = 1.0f / sum;
    for (std::int64_t j = 0; j < valid; ++j) p[j] = F::store(e[j] * inv);
    for (std::int64_t j = valid; j < T; ++j) p[j] = F::store(0.0f);
  });
}

// dS = P * (dP - rowsum(P * dP)); d_scores may alias dp.
template <class F>
void softmax_backward_rows(const AttentionShape& s, const typename F::T* probs, const float* dp,
                           typename F::T* d_scores) {
  const std::int64_t T = s.seq;
  const double elems = static_cast<double>(s.batch * s.heads * T * T);
  const cpu::KernelTimer timer(cpu::KernelKind::softmax_backward,
                               elems * (4 + 2 * sizeof(typename F::T)));  // P and dP in, dS out
  for_each_score_row(s, [&](std::int64_t r) {
    const typename F::T* pr = probs + r * T;
    const float* dr = dp + r * T;
    typename F::T* out = d_scores + r * T;
    float dot = 0.0f;
    for (std::int64_t j = 0; j < T; ++j) dot += F::load(pr[j]) * dr[j];
    for (std::int64_t j = 0; j < T; ++j) out[j] = F::store(F::load(pr[j]) * (dr[j] - dot));
  });
}

// The CPU's operations for the shared steps (nn/attention_steps.h).
template <class F>
struct HostOps {
  using T = typename F::T;
  const AttentionShape& s;
  void gemm(const Gemm& g, const void* a, const void* b, void* c) { cpu::gemm(g, a, b, c); }
  void to_heads(const T* src, std::int64_t parts, std::int64_t part, T* dst) { nn::to_heads(s, src, parts, part, dst); }
  void from_heads(const T* src, std::int64_t parts, std::int64_t part, T* dst) {
    nn::from_heads(s, src, parts, part, dst);
  }
  void softmax(float* scores, T* probs) { softmax_rows<F>(s, scores, probs); }
  void softmax_backward(const T* probs, const float* dp, T* ds) { softmax_backward_rows<F>(s, probs, dp, ds); }
};

}  // namespace

template <class F>
void attention_forward(const AttentionShape& s, const typename F::T* qkv, typename F::T* out,
                       const AttentionSaved<typename F::T>& saved,
                       const AttentionScratch<typename F::T>& scratch) {
  HostOps<F> ops{s};
  attention_forward_steps<F::kDType>(ops, s, qkv, out, saved, scratch);
}

template <class F>
void attention_backward(const AttentionShape& s, const typename F::T* d_out, typename F::T* d_qkv,
                        const AttentionSaved<typename F::T>& saved,
                        const AttentionScratch<typename F::T>& scratch) {
  HostOps<F> ops{s};
  attention_backward_steps<F::kDType>(ops, s, d_out, d_qkv, saved, scratch);
}

template <class F>
void attention_cached(const AttentionShape& s, std::int64_t first, std::int64_t capacity, const typename F::T* qkv,
                      typename F::T* k_cache, typename F::T* v_cache, typename F::T* out, float* scores) {
  const std::int64_t hd = s.head_dim, d = s.d_model();
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for (std::int64_t i = 0; i < s.seq; ++i) {  // the new rows' keys and values join the cache
    for (std::int64_t h = 0; h < s.heads; ++h) {
      const auto bytes = static_cast<std::size_t>(hd) * sizeof(typename F::T);
      std::memcpy(k_cache + (h * capacity + first + i) * hd, qkv + i * 3 * d + d + h * hd, bytes);
      std::memcpy(v_cache + (h * capacity + first + i) * hd, qkv + i * 3 * d + 2 * d + h * hd, bytes);
    }
  }
  for (std::int64_t i = 0; i < s.seq; ++i) {
    const std::int64_t seen = s.causal ? first + i + 1 : first + s.seq;
    for (std::int64_t h = 0; h < s.heads; ++h) {
      const typename F::T* q = qkv + i * 3 * d + h * hd;
      float mx = -INFINITY;
      for (std::int64_t j = 0; j < seen; ++j) {
        const typename F::T* k = k_cache + (h * capacity + j) * hd;
        float dot = 0.0f;
        for (std::int64_t e = 0; e < hd; ++e) dot += F::load(q[e]) * F::load(k[e]);
        scores[j] = dot * scale;
        mx = scores[j] > mx ? scores[j] : mx;
      }
      float sum = 0.0f;
      for (std::int64_t j = 0; j < seen; ++j) {
        scores[j] = cpu::fast_exp(scores[j] - mx);
        sum += scores[j];
      }
      const float inv = 1.0f / sum;
      typename F::T* o = out + i * d + h * hd;
      for (std::int64_t e = 0; e < hd; ++e) {
        float acc = 0.0f;
        for (std::int64_t j = 0; j < seen; ++j) acc += scores[j] * inv * F::load(v_cache[(h * capacity + j) * hd + e]);
        o[e] = F::store(acc);
      }
    }
  }
}

#define DTRAIN_INSTANTIATE(F)                                                                          \
  template void attention_forward<F>(const AttentionShape&, const F::T*, F::T*, const AttentionSaved<F::T>&, \
                                     const AttentionScratch<F::T>&);                                   \
  template void attention_backward<F>(const AttentionShape&, const F::T*, F::T*,                       \
                                      const AttentionSaved<F::T>&, const AttentionScratch<F::T>&);  \
  template void attention_cached<F>(const AttentionShape&, std::int64_t, std::int64_t, const F::T*, F::T*, F::T*, \
                                    F::T*, float*);
DTRAIN_FOR_EACH_FORMAT(DTRAIN_INSTANTIATE)
#undef DTRAIN_INSTANTIATE

}  // namespace dtrain::nn
