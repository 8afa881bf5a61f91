#include "nn/attention.h"

#include <omp.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <type_traits>
#include <vector>

#include "nn/attention_steps.h"
#include "nn/linear.h"
#include "nn/cpu/kernel_profile.h"
#include "nn/cpu/matmul.h"
#include "nn/cpu/parallel.h"
#include "nn/cpu/vec_math.h"

namespace dtrain::nn {

using cpu::Gemm;

namespace {

// Query rows per tile: a tile's S, dP, P and dS (4 x 64 x T floats) stay in
// L2 for the sequence lengths dtrain trains at. Measured against 32 and 128
// (causal, f32, one thread, B * T = 2048, 4 heads of 64, T = 128 to 1024):
// 64 was the fastest or within 3% of it in forward and backward at every T;
// 32 was up to 15% slower in backward, 128 up to 12% at T = 128.
constexpr std::int64_t kQueryBlock = 64;

// How many rows ahead the head gathers and scatters ask for the strided rows
// of an interleaved buffer (PREFETCHW for stores). Without it the scatter of
// dQ, dK, dV stalled on its stores: attention's backward outside its products
// took 10.4 ms per lm-small step, 7.3-7.9 with 4, 8 or 16 rows ahead (and
// the forward 9.5 ms, 8.5-9.3 with 8).
constexpr std::int64_t kRowsAhead = 8;

// How many cache lines of the next pair's inputs each softmax row asks for
// (NextPair). A pair's products read its Q, K, V (and in backward its dO)
// cold: written by the projections for every pair before attention starts.
// In an lm-small step (f32, one thread) the tile products ran at 91-92
// GFLOP/s, against 146-179 for the same products on data in cache. Asking
// for all of the next pair's inputs at once (1536-2048 lines) before its
// products raised them to 110-120 GFLOP/s but stalled on the requests as
// long as it saved; spread over the rows, 8 lines a row gained 105-107
// GFLOP/s for 0.9 ms per step of requests (4 lines: 97-100; 16: 103-113
// for 2.1 ms).
constexpr int kNextPairLinesPerRow = 8;

// The inputs of the pair this thread works on next, asked for into L2 a few
// lines at a time (ask) while the current pair's softmax rows compute.
class NextPair {
 public:
  // Up to four buffers of `bytes` each; null ones are skipped.
  void start(std::initializer_list<const void*> buffers, std::size_t bytes) {
    left_ = 0;
    for (const void* b : buffers) {
      if (b != nullptr) buffers_[left_++] = static_cast<const char*>(b);
    }
    at_ = 0;
    bytes_ = bytes;
  }
  void stop() { left_ = 0; }
  void ask(int lines) {
    for (int i = 0; i < lines && left_ > 0; ++i) {
      __builtin_prefetch(buffers_[left_ - 1] + at_, 0, 2);  // PREFETCHT1: into L2
      at_ += 64;
      if (at_ >= bytes_) {
        at_ = 0;
        --left_;
      }
    }
  }

 private:
  std::array<const char*, 4> buffers_{};
  int left_ = 0;
  std::size_t at_ = 0, bytes_ = 0;
};

// One thread's tile buffers (grown on first use, then reused).
struct ThreadScratch {
  std::vector<float> scores, dp, dq, dk, dv;
  std::vector<std::uint16_t> probs16, d_scores16, o16;
  std::vector<float> o32;
  NextPair next_pair;
};

ThreadScratch& thread_scratch() {
  thread_local ThreadScratch scratch;
  return scratch;
}

// The tile products of the pair this thread works on, when profiling: a
// worker thread has no profile of its own (nn/cpu/kernel_profile.h).
struct GemmTally {
  double seconds = 0.0, flops = 0.0;
  std::int64_t calls = 0;
};
thread_local GemmTally* gemm_tally = nullptr;

template <class V>
auto* sized(V& v, std::int64_t n) {
  if (v.size() < static_cast<std::size_t>(n)) v.resize(static_cast<std::size_t>(n));
  return v.data();
}

// The CPU's operations for the shared steps (nn/attention_steps.h): one pair
// per group, one thread per pair, tiles of kQueryBlock rows.
template <class F>
struct HostOps {
  using T = typename F::T;
  const AttentionShape& s;
  // Backward with a bias gradient: each pair's column sums of its dQ, dK, dV
  // as stored, [pairs, 3, hd] (write_grads), added up by add_bias_sums.
  float* pair_sums = nullptr;
  // Backward's dO already in the heads' layout (attention_output_grad), or null.
  T* d_out_heads = nullptr;

  std::int64_t query_block() const { return kQueryBlock; }

  void gemm(const Gemm& g, const void* a, const void* b, void* c) {
    if (gemm_tally == nullptr) return cpu::gemm(g, a, b, c);
    const auto start = std::chrono::steady_clock::now();
    cpu::gemm(g, a, b, c);
    gemm_tally->seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    gemm_tally->flops += 2.0 * static_cast<double>(g.m * g.n * g.k * g.batch);
    gemm_tally->calls += 1;
  }

  template <class Fn>
  void for_each_group(const AttentionSaved<T>& saved, bool backward, Fn fn) {
    const std::int64_t pairs = s.pairs(), seq = s.seq, hd = s.head_dim;
    const std::int64_t block = std::min(kQueryBlock, seq);
    const bool parallel = pairs > 1 && pairs * seq * seq * hd >= kParallelMin;
    // Every thread tallies its products alike (the profile sees them all, whatever the thread count).
    cpu::KernelProfile* profile = cpu::set_thread_profile(nullptr);
    const bool tally = profile != nullptr;
    double seconds = 0.0, flops = 0.0;
    std::int64_t calls = 0;
    int team = 1;
#pragma omp parallel for schedule(static) if (parallel) reduction(+ : seconds, flops, calls) reduction(max : team)
    for (std::int64_t p = 0; p < pairs; ++p) {
      team = std::max(team, omp_get_num_threads());
      // The tile products run on this thread alone: nested regions would only
      // oversubscribe, and oneDNN tunes the primitives it creates here for one thread.
      if (omp_get_num_threads() > 1) omp_set_num_threads(1);
      ThreadScratch& ts = thread_scratch();
      if (p + 1 < pairs) {
        const std::int64_t next_at = head_major(p + 1) * seq * hd;
        const T* next_d_out = backward && d_out_heads != nullptr ? d_out_heads + next_at : nullptr;
        ts.next_pair.start({saved.q + next_at, saved.k + next_at, saved.v + next_at, next_d_out},
                           static_cast<std::size_t>(seq * hd) * sizeof(T));
      } else {
        ts.next_pair.stop();
      }
      AttentionGroup<T> g{};
      g.pair0 = p;
      g.pairs = 1;
      const std::int64_t heads_at = head_major(p) * seq * hd;
      g.q = saved.q + heads_at;
      g.k = saved.k + heads_at;
      g.v = saved.v + heads_at;
      g.lse = saved.lse + p * seq;
      g.scores = sized(ts.scores, block * seq);
      if constexpr (std::is_same_v<T, float>) {
        g.probs = g.scores;
        g.o = sized(ts.o32, (backward ? seq : block) * hd);
      } else {
        g.probs = sized(ts.probs16, block * seq);
        g.o = sized(ts.o16, (backward ? seq : block) * hd);
      }
      if (backward) {
        g.dp = sized(ts.dp, block * seq);
        if constexpr (std::is_same_v<T, float>) {
          g.d_scores = g.dp;
        } else {
          g.d_scores = sized(ts.d_scores16, block * seq);
        }
        if (d_out_heads != nullptr) g.o = d_out_heads + heads_at;
        g.dq = sized(ts.dq, seq * hd);
        g.dk = sized(ts.dk, seq * hd);
        g.dv = sized(ts.dv, seq * hd);
      }
      GemmTally pair_gemms;
      gemm_tally = tally ? &pair_gemms : nullptr;
      fn(static_cast<const AttentionGroup<T>&>(g));
      gemm_tally = nullptr;
      seconds += pair_gemms.seconds;
      flops += pair_gemms.flops;
      calls += pair_gemms.calls;
    }
    cpu::set_thread_profile(profile);
    if (tally) cpu::KernelTimer::credit(cpu::KernelKind::gemm, seconds / team, calls, flops);
  }

  // Where pair p = b * H + h keeps its Q, K, V: [H, B, T, hd] (nn/attention.h).
  std::int64_t head_major(std::int64_t p) const { return (p % s.heads) * s.batch + p / s.heads; }

  // Rows of head h of the pair, in an interleaved [B, T, parts, H, hd] buffer.
  template <class U>
  U* interleaved_row(U* base, const AttentionGroup<T>& g, std::int64_t parts, std::int64_t part,
                     std::int64_t t) const {
    const std::int64_t b = g.pair0 / s.heads, h = g.pair0 % s.heads, d = s.d_model();
    return base + (b * s.seq + t) * parts * d + part * d + h * s.head_dim;
  }

  // One head's row of an interleaved buffer, asked for ahead of its use.
  void prefetch_head_row(const T* row, bool for_write) const {
    const char* p = reinterpret_cast<const char*>(row);
    for (std::size_t l = 0; l < static_cast<std::size_t>(s.head_dim) * sizeof(T); l += 64) {
      if (for_write) {
        __builtin_prefetch(p + l, 1);
      } else {
        __builtin_prefetch(p + l, 0);
      }
    }
  }

  // interleaved null: the heads are in place already (attention_project).
  void gather(const AttentionGroup<T>& g, const T* interleaved, std::int64_t parts, std::int64_t part, T* heads) {
    if (interleaved == nullptr) return;
    const auto bytes = static_cast<std::size_t>(s.head_dim) * sizeof(T);
    for (std::int64_t t = 0; t < s.seq; ++t) {
      if (t + kRowsAhead < s.seq) prefetch_head_row(interleaved_row(interleaved, g, parts, part, t + kRowsAhead), false);
      std::memcpy(heads + t * s.head_dim, interleaved_row(interleaved, g, parts, part, t), bytes);
    }
  }

  void write_rows(const AttentionGroup<T>& g, const AttentionTile& tile, const T* o, T* out) {
    const auto bytes = static_cast<std::size_t>(s.head_dim) * sizeof(T);
    for (std::int64_t i = 0; i < tile.rows; ++i) {
      if (i + kRowsAhead < tile.rows) prefetch_head_row(interleaved_row(out, g, 1, 0, tile.row0 + i + kRowsAhead), true);
      std::memcpy(interleaved_row(out, g, 1, 0, tile.row0 + i), o + i * s.head_dim, bytes);
    }
  }

  void write_grads(const AttentionGroup<T>& g, T* d_qkv) {
    const std::int64_t hd = s.head_dim;
    const float* grads[3] = {g.dq, g.dk, g.dv};
    for (int part = 0; part < 3; ++part) {
      float* sums = pair_sums != nullptr ? pair_sums + (g.pair0 * 3 + part) * hd : nullptr;
      if (sums != nullptr) std::fill(sums, sums + hd, 0.0f);
      for (std::int64_t t = 0; t < s.seq; ++t) {
        T* dst = interleaved_row(d_qkv, g, 3, part, t);
        if (t + kRowsAhead < s.seq) prefetch_head_row(interleaved_row(d_qkv, g, 3, part, t + kRowsAhead), true);
        const float* src = grads[part] + t * hd;
        if (sums == nullptr) {
          for (std::int64_t e = 0; e < hd; ++e) dst[e] = F::store(src[e]);
          continue;
        }
        float* __restrict__ acc = sums;  // apart from dst: no check, no reload
        for (std::int64_t e = 0; e < hd; ++e) {
          const T stored = F::store(src[e]);
          dst[e] = stored;
          acc[e] += F::load(stored);
        }
      }
    }
  }

  // d_bias[part, h, e] += the pairs' sums, batch by batch in order.
  void add_bias_sums(float* d_bias) const {
    const std::int64_t hd = s.head_dim;
    for (std::int64_t b = 0; b < s.batch; ++b) {
      for (std::int64_t h = 0; h < s.heads; ++h) {
        for (std::int64_t part = 0; part < 3; ++part) {
          const float* sums = pair_sums + ((b * s.heads + h) * 3 + part) * hd;
          float* out = d_bias + part * s.d_model() + h * hd;
          for (std::int64_t e = 0; e < hd; ++e) out[e] += sums[e];
        }
      }
    }
  }

  // Keys row i of the tile sees.
  std::int64_t valid(const AttentionTile& tile, std::int64_t i) const {
    return s.causal ? tile.row0 + i + 1 : tile.keys;
  }

  // P = softmax(S) per row in f32: the exps go back into scores first, so
  // probs may alias scores; lse = max + log(sum).
  void softmax(const AttentionGroup<T>& g, const AttentionTile& tile) {
    NextPair& next_pair = thread_scratch().next_pair;
    for (std::int64_t i = 0; i < tile.rows; ++i) {
      float* e = g.scores + i * tile.keys;
      T* p = g.probs + i * tile.keys;
      const std::int64_t valid = this->valid(tile, i);
      next_pair.ask(kNextPairLinesPerRow);
      const float mx = cpu::max_of(e, valid);
      cpu::LaneSums lanes;
      for (std::int64_t j = 0; j < valid; ++j) e[j] = cpu::fast_exp(e[j] - mx);
      lanes.add(valid, [&](auto at) { return at(e); });
      const float sum = lanes.total(), inv = 1.0f / sum;
      for (std::int64_t j = 0; j < valid; ++j) p[j] = F::store(e[j] * inv);
      for (std::int64_t j = valid; j < tile.keys; ++j) p[j] = F::store(0.0f);
      g.lse[tile.row0 + i] = mx + std::log(sum);
    }
  }

  // P = exp(S - lse); probs may alias scores.
  void probs(const AttentionGroup<T>& g, const AttentionTile& tile) {
    NextPair& next_pair = thread_scratch().next_pair;
    for (std::int64_t i = 0; i < tile.rows; ++i) {
      const float* e = g.scores + i * tile.keys;
      T* p = g.probs + i * tile.keys;
      const std::int64_t valid = this->valid(tile, i);
      const float lse = g.lse[tile.row0 + i];
      next_pair.ask(kNextPairLinesPerRow);
      for (std::int64_t j = 0; j < valid; ++j) p[j] = F::store(cpu::fast_exp(e[j] - lse));
      for (std::int64_t j = valid; j < tile.keys; ++j) p[j] = F::store(0.0f);
    }
  }

  // dS = P * (dP - rowsum(P * dP)); d_scores may alias dp.
  void softmax_backward(const AttentionGroup<T>& g, const AttentionTile& tile) {
    NextPair& next_pair = thread_scratch().next_pair;
    for (std::int64_t i = 0; i < tile.rows; ++i) {
      const T* pr = g.probs + i * tile.keys;
      const float* dr = g.dp + i * tile.keys;
      T* out = g.d_scores + i * tile.keys;
      const std::int64_t valid = this->valid(tile, i);
      next_pair.ask(kNextPairLinesPerRow);
      cpu::LaneSums lanes;
      lanes.add(valid, [&](auto at) { return at(pr, F::load) * at(dr); });
      const float dot = lanes.total();
      for (std::int64_t j = 0; j < valid; ++j) out[j] = F::store(F::load(pr[j]) * (dr[j] - dot));
      for (std::int64_t j = valid; j < tile.keys; ++j) out[j] = F::store(0.0f);
    }
  }
};

}  // namespace

// Timed as one kernel each, less their products (credited to gemm). Work:
// every input read once, every result written once.
template <class F>
void attention_forward(const AttentionShape& s, const typename F::T* qkv, typename F::T* out,
                       const AttentionSaved<typename F::T>& saved) {
  const std::int64_t heads = qkv != nullptr ? 7 : 4;  // qkv in, q, k, v out (or q, k, v in); out
  const double bytes = static_cast<double>(s.head_elems() * heads * sizeof(typename F::T) + s.row_elems() * 4);
  const cpu::KernelTimer timer(cpu::KernelKind::attention_forward, bytes);  // and lse out
  HostOps<F> ops{s};
  attention_forward_steps<F::kDType>(ops, s, qkv, out, saved);
}

template <class F>
void attention_backward(const AttentionShape& s, const typename F::T* d_out, typename F::T* d_qkv,
                        const AttentionSaved<typename F::T>& saved, float* d_bias, typename F::T* d_out_heads) {
  const double bytes = static_cast<double>(s.head_elems() * 7 * sizeof(typename F::T) + s.row_elems() * 4);
  const cpu::KernelTimer timer(cpu::KernelKind::attention_backward, bytes);  // q, k, v, d_out, lse in; d_qkv out
  HostOps<F> ops{s};
  ops.d_out_heads = d_out_heads;
  thread_local std::vector<float> pair_sums;  // grown once, then reused
  if (d_bias != nullptr) ops.pair_sums = sized(pair_sums, s.pairs() * 3 * s.head_dim);
  attention_backward_steps<F::kDType>(ops, s, d_out, d_qkv, saved);
  if (d_bias != nullptr) ops.add_bias_sums(d_bias);
}

template <class F>
void attention_project(const AttentionShape& s, const typename F::T* x, const typename F::T* w, const float* b,
                       std::uint64_t w_version, const AttentionSaved<typename F::T>& saved) {
  const std::int64_t n = s.batch * s.seq, d = s.d_model(), hd = s.head_dim;
  const Gemm g = typed(linear_forward_gemm(n, d, hd, false), F::kDType, F::kDType);
  typename F::T* const parts[3] = {saved.q, saved.k, saved.v};
  for (std::int64_t part = 0; part < 3; ++part) {
    for (std::int64_t h = 0; h < s.heads; ++h) {
      const std::int64_t row = part * d + h * hd;  // the head's first row of W and entry of b
      cpu::gemm_weights(g, x, w + row * d, w_version, parts[part] + h * n * hd, b != nullptr ? b + row : nullptr);
    }
  }
}

template <class F>
void attention_output_grad(const AttentionShape& s, const typename F::T* dy, const typename F::T* w,
                           std::uint64_t w_version, typename F::T* d_out_heads) {
  const std::int64_t n = s.batch * s.seq, d = s.d_model(), hd = s.head_dim;
  Gemm g = typed(linear_input_grad_gemm(n, hd, d, false), F::kDType, F::kDType);
  g.ldb = d;  // the head's columns of W
  for (std::int64_t h = 0; h < s.heads; ++h) {
    cpu::gemm_weights(g, dy, w + h * hd, w_version, d_out_heads + h * n * hd);
  }
}

template <class F>
void attention_cached(const AttentionShape& s, std::int64_t first, std::int64_t capacity, const typename F::T* qkv,
                      typename F::T* k_cache, typename F::T* v_cache, typename F::T* out, float* scores) {
  const std::int64_t hd = s.head_dim, d = s.d_model();
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const std::int64_t group = s.group();
  for (std::int64_t i = 0; i < s.seq; ++i) {  // the new rows' keys and values join the cache
    for (std::int64_t c = 0; c < s.cache_heads(); ++c) {
      const auto bytes = static_cast<std::size_t>(hd) * sizeof(typename F::T);
      const std::int64_t h = c * group;  // the group's first query head carries its keys and values
      std::memcpy(k_cache + (c * capacity + first + i) * hd, qkv + i * 3 * d + d + h * hd, bytes);
      std::memcpy(v_cache + (c * capacity + first + i) * hd, qkv + i * 3 * d + 2 * d + h * hd, bytes);
    }
  }
  for (std::int64_t i = 0; i < s.seq; ++i) {
    const std::int64_t seen = s.causal ? first + i + 1 : first + s.seq;
    for (std::int64_t h = 0; h < s.heads; ++h) {
      const typename F::T* q = qkv + i * 3 * d + h * hd;
      const std::int64_t c = h / group;
      float mx = -INFINITY;
      for (std::int64_t j = 0; j < seen; ++j) {
        const typename F::T* k = k_cache + (c * capacity + j) * hd;
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
        for (std::int64_t j = 0; j < seen; ++j) acc += scores[j] * inv * F::load(v_cache[(c * capacity + j) * hd + e]);
        o[e] = F::store(acc);
      }
    }
  }
}

#define DTRAIN_INSTANTIATE(F)                                                                          \
  template void attention_forward<F>(const AttentionShape&, const F::T*, F::T*, const AttentionSaved<F::T>&); \
  template void attention_backward<F>(const AttentionShape&, const F::T*, F::T*, const AttentionSaved<F::T>&,  \
                                      float*, F::T*);                                                        \
  template void attention_output_grad<F>(const AttentionShape&, const F::T*, const F::T*, std::uint64_t, F::T*);  \
  template void attention_project<F>(const AttentionShape&, const F::T*, const F::T*, const float*, std::uint64_t, \
                                     const AttentionSaved<F::T>&);                                            \
  template void attention_cached<F>(const AttentionShape&, std::int64_t, std::int64_t, const F::T*, F::T*, F::T*, \
                                    F::T*, float*);
DTRAIN_FOR_EACH_FORMAT(DTRAIN_INSTANTIATE)
#undef DTRAIN_INSTANTIATE

std::int64_t attention_scratch_limit(const char* mb) {
  return (mb != nullptr && *mb != '\0' ? std::atoll(mb) : std::int64_t{1024}) << 20;
}

std::int64_t attention_scratch_limit() {
  static const std::int64_t limit = attention_scratch_limit(std::getenv("DTRAIN_ATTENTION_SCRATCH_MB"));
  return limit;
}

AttentionScratchKind gpu_attention_scratch(std::int64_t pairs, std::int64_t seq, std::int64_t head_dim,
                                           std::int64_t limit) {
  if (head_dim > kOnePassMaxHeadDim) return AttentionScratchKind::whole_batch;
  const double whole = 8.0 * static_cast<double>(pairs) * static_cast<double>(seq) * static_cast<double>(seq);
  return whole <= static_cast<double>(limit) ? AttentionScratchKind::whole_batch : AttentionScratchKind::rows;
}

}  // namespace dtrain::nn
