#include "nn/cuda/attention.h"

#include <cmath>
#include <type_traits>

#include "core/cuda/check.h"
#include "nn/attention_tile.h"
#include "nn/cuda/device_math.cuh"

namespace dtrain::nn::cuda {
namespace {

using detail::kBlock;
constexpr int kWarpsPerBlock = kBlock / 32;  // softmax: one warp per row

// One thread per head-major element of [B, H, T, hd]: kToHeads copies
// interleaved [B, T, parts, H, hd] part `part` into heads, else heads (of type
// Src, converted to Dst's format) back into it.
template <bool kToHeads, DType D, class Src, class Dst>
__global__ void copy_heads_kernel(std::int64_t heads_n, std::int64_t seq, std::int64_t hd, std::int64_t total,
                                  const Src* src, std::int64_t parts, std::int64_t part, Dst* dst) {
  const std::int64_t d_model = heads_n * hd;
  detail::for_each_index(total, [=](std::int64_t i) {
    const std::int64_t e = i % hd, t = (i / hd) % seq, h = (i / (hd * seq)) % heads_n;
    const std::int64_t b = i / (hd * seq * heads_n);
    const std::int64_t inter = (b * seq + t) * parts * d_model + part * d_model + h * hd + e;
    if constexpr (kToHeads) {
      dst[i] = src[inter];
    } else if constexpr (std::is_same_v<Src, Dst>) {
      dst[inter] = src[i];
    } else {
      dst[inter] = detail::Format<D>::store(src[i]);
    }
  });
}

// A tile's rows: row r of [pairs * rows, keys] is query row0 + r % rows of pair r / rows.
struct TileRows {
  std::int64_t seq, row0, rows, keys;
  bool causal;
  __device__ std::int64_t valid(std::int64_t r) const { return causal ? row0 + r % rows + 1 : keys; }
  __device__ std::int64_t lse_index(std::int64_t r) const { return (r / rows) * seq + row0 + r % rows; }
};

// One warp per row of the tile. p may alias scores (f32): every lane reads
// its columns' scores before the last pass writes them.
template <DType D>
__global__ void softmax_rows_kernel(const float* scores, Storage<D>* p, float* lse, std::int64_t n_rows,
                                    TileRows tile) {
  const std::int64_t r = blockIdx.x * std::int64_t{kWarpsPerBlock} + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= n_rows) return;  // whole warps leave together
  const float* in = scores + r * tile.keys;
  Storage<D>* row = p + r * tile.keys;
  const std::int64_t valid = tile.valid(r);
  float mx = -INFINITY;
  for (std::int64_t j = lane; j < valid; j += 32) mx = fmaxf(mx, in[j]);
  mx = detail::warp_max(mx);
  float sum = 0.0f;
  for (std::int64_t j = lane; j < valid; j += 32) sum += detail::fast_exp(in[j] - mx);
  sum = detail::warp_sum(sum);
  const float inv = 1.0f / sum;
  for (std::int64_t j = lane; j < tile.keys; j += 32) {
    row[j] = detail::Format<D>::store(j < valid ? detail::fast_exp(in[j] - mx) * inv : 0.0f);
  }
  if (lane == 0) lse[tile.lse_index(r)] = mx + logf(sum);
}

// P = exp(S - lse) per row, masked as softmax; p may alias scores (f32).
template <DType D>
__global__ void probs_rows_kernel(const float* scores, const float* lse, Storage<D>* p, std::int64_t n_rows,
                                  TileRows tile) {
  const std::int64_t r = blockIdx.x * std::int64_t{kWarpsPerBlock} + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= n_rows) return;
  const float* in = scores + r * tile.keys;
  Storage<D>* row = p + r * tile.keys;
  const std::int64_t valid = tile.valid(r);
  const float l = lse[tile.lse_index(r)];
  for (std::int64_t j = lane; j < tile.keys; j += 32) {
    row[j] = detail::Format<D>::store(j < valid ? detail::fast_exp(in[j] - l) : 0.0f);
  }
}

template <DType D>
__global__ void softmax_backward_rows_kernel(const Storage<D>* p, const float* dp, Storage<D>* ds, std::int64_t n_rows,
                                             std::int64_t keys) {
  using F = detail::Format<D>;
  const std::int64_t r = blockIdx.x * std::int64_t{kWarpsPerBlock} + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= n_rows) return;
  const Storage<D>* pr = p + r * keys;
  const float* dr = dp + r * keys;
  Storage<D>* out = ds + r * keys;
  float dot = 0.0f;
  for (std::int64_t j = lane; j < keys; j += 32) dot += F::load(pr[j]) * dr[j];
  dot = detail::warp_sum(dot);  // every lane has read its dP before any writes dS
  for (std::int64_t j = lane; j < keys; j += 32) out[j] = F::store(F::load(pr[j]) * (dr[j] - dot));
}

// The new rows' keys and values into the caches: one thread per element of [seq, H, hd].
template <class T>
__global__ void append_kv_kernel(const T* qkv, T* k_cache, T* v_cache, std::int64_t heads_n, std::int64_t cache_heads,
                                 std::int64_t hd, std::int64_t first, std::int64_t capacity, std::int64_t total) {
  const std::int64_t d = heads_n * hd, group = heads_n / cache_heads;
  detail::for_each_index(total, [=](std::int64_t x) {  // x over [seq, cache_heads, hd]
    const std::int64_t e = x % hd, c = (x / hd) % cache_heads, i = x / (cache_heads * hd), h = c * group;
    const std::int64_t at = (c * capacity + first + i) * hd + e;
    k_cache[at] = qkv[i * 3 * d + d + h * hd + e];
    v_cache[at] = qkv[i * 3 * d + 2 * d + h * hd + e];
  });
}

// One block per (row i, head h) of a decode pass: scores over the cached
// positions in shared memory, softmax, then the weighted sum of the values.
template <DType D>
__global__ void attend_cached_kernel(const Storage<D>* qkv, const Storage<D>* k_cache, const Storage<D>* v_cache,
                                     Storage<D>* out, std::int64_t heads_n, std::int64_t group, std::int64_t seq,
                                     std::int64_t hd, bool causal, std::int64_t first, std::int64_t capacity,
                                     float scale) {
  using F = detail::Format<D>;
  extern __shared__ float scores[];
  const std::int64_t i = blockIdx.x / heads_n, h = blockIdx.x % heads_n, d = heads_n * hd;
  const std::int64_t seen = causal ? first + i + 1 : first + seq;
  const Storage<D>* q = qkv + i * 3 * d + h * hd;
  const std::int64_t c = h / group;  // the cache head of h's group
  float mx = -INFINITY;
  for (std::int64_t j = threadIdx.x; j < seen; j += blockDim.x) {
    const Storage<D>* k = k_cache + (c * capacity + j) * hd;
    float dot = 0.0f;
    for (std::int64_t e = 0; e < hd; ++e) dot += F::load(q[e]) * F::load(k[e]);
    scores[j] = dot * scale;
    mx = fmaxf(mx, scores[j]);
  }
  mx = detail::block_max(mx);
  float sum = 0.0f;
  for (std::int64_t j = threadIdx.x; j < seen; j += blockDim.x) {
    scores[j] = detail::fast_exp(scores[j] - mx);
    sum += scores[j];
  }
  const float inv = 1.0f / detail::block_sum(sum);  // its barriers also publish every score
  for (std::int64_t e = threadIdx.x; e < hd; e += blockDim.x) {
    float acc = 0.0f;
    for (std::int64_t j = 0; j < seen; ++j) acc += scores[j] * inv * F::load(v_cache[(c * capacity + j) * hd + e]);
    out[i * d + h * hd + e] = F::store(acc);
  }
}

// ---- One pass per (pair, block of query rows): the online softmax ----
// A block of kFlashRows threads owns kFlashRows query rows of one pair, a
// thread per row; keys and values go through shared memory kFlashKeys rows
// at a time, as f32. HD (64 or 128) is the head dim rounded up: the rows
// are zero-padded to it, so any hd <= HD gives the same sums. Causal blocks
// stop at their last row's key. No [T, T] tensor: forward keeps each row's
// running max and sum; backward recomputes P from lse.
constexpr int kFlashRows = 64, kFlashKeys = 32;

// Row i of pair p = (b, h) in the layouts the kernels touch.
struct FlashLayout {
  std::int64_t heads, seq, hd;
  // [B, H, T, hd] (saved q, k, v)
  __device__ std::int64_t head_row(std::int64_t pair, std::int64_t i) const { return (pair * seq + i) * hd; }
  // [B, T, parts, H, hd] (out: parts 1, d_qkv: parts 3)
  __device__ std::int64_t interleaved_row(std::int64_t pair, std::int64_t i, int parts, int part) const {
    const std::int64_t b = pair / heads, h = pair % heads;
    return ((b * seq + i) * parts + part) * heads * hd + h * hd;
  }
};

// rows [first, first + kRows) of a [pair, T, hd] tensor into tile[kRows][HD + pad] as f32, zero-padded.
template <DType D, int HD, int kRows, int kPad>
__device__ void stage_rows(const Storage<D>* src, const FlashLayout& at, std::int64_t pair, std::int64_t first,
                           float (*tile)[HD + kPad]) {
  for (int x = threadIdx.x; x < kRows * HD; x += blockDim.x) {
    const int r = x / HD, e = x % HD;
    const std::int64_t i = first + r;
    tile[r][e] = i < at.seq && e < at.hd ? detail::Format<D>::load(src[at.head_row(pair, i) + e]) : 0.0f;
  }
}

template <DType D, int HD>
__device__ void load_row(const Storage<D>* row, std::int64_t hd, float (&out)[HD]) {
#pragma unroll
  for (int e = 0; e < HD; ++e) out[e] = e < hd ? detail::Format<D>::load(row[e]) : 0.0f;
}

template <int HD>
__device__ __forceinline__ float dot(const float (&a)[HD], const float* b) {
  float s = 0.0f;
#pragma unroll
  for (int e = 0; e < HD; ++e) s = fmaf(a[e], b[e], s);
  return s;
}

// Keys the query rows of block `blk` see: all, or up to its last row.
__device__ __forceinline__ std::int64_t flash_key_end(const FlashLayout& at, bool causal, std::int64_t blk) {
  return causal ? min(at.seq, (blk + 1) * std::int64_t{kFlashRows}) : at.seq;
}

// O and lse of each query row: grid (pairs, row blocks).
template <DType D, int HD>
__global__ void __launch_bounds__(kFlashRows)
    flash_forward_kernel(const Storage<D>* q, const Storage<D>* k, const Storage<D>* v, Storage<D>* out,
                         float* lse, FlashLayout at, bool causal, float scale) {
  __shared__ float ks[kFlashKeys][HD], vs[kFlashKeys][HD];
  __shared__ float row_scores[kFlashRows][kFlashKeys + 1];  // each thread's own; padded against bank conflicts
  const std::int64_t pair = blockIdx.x, i = blockIdx.y * std::int64_t{kFlashRows} + threadIdx.x;
  const bool active = i < at.seq;
  float* s = row_scores[threadIdx.x];
  float qr[HD], acc[HD];
  load_row<D, HD>(q + at.head_row(pair, active ? i : 0), at.hd, qr);
#pragma unroll
  for (int e = 0; e < HD; ++e) acc[e] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  const std::int64_t key_end = flash_key_end(at, causal, blockIdx.y);
  for (std::int64_t j0 = 0; j0 < key_end; j0 += kFlashKeys) {
    __syncthreads();  // the previous tile is no longer read
    stage_rows<D, HD, kFlashKeys, 0>(k, at, pair, j0, ks);
    stage_rows<D, HD, kFlashKeys, 0>(v, at, pair, j0, vs);
    __syncthreads();
    if (!active) continue;
    float tile_max = -INFINITY;
#pragma unroll 1
    for (int r = 0; r < kFlashKeys; ++r) {
      const std::int64_t j = j0 + r;
      const bool seen = j < at.seq && (!causal || j <= i);
      s[r] = seen ? dot<HD>(qr, ks[r]) * scale : -INFINITY;
      tile_max = fmaxf(tile_max, s[r]);
    }
    if (tile_max == -INFINITY) continue;  // every key of the tile is masked for this row
    const float m_new = fmaxf(m, tile_max);
    const float correction = m == -INFINITY ? 0.0f : detail::fast_exp(m - m_new);
    l *= correction;
#pragma unroll
    for (int e = 0; e < HD; ++e) acc[e] *= correction;
#pragma unroll 1
    for (int r = 0; r < kFlashKeys; ++r) {
      const float p = s[r] == -INFINITY ? 0.0f : detail::fast_exp(s[r] - m_new);
      l += p;
#pragma unroll
      for (int e = 0; e < HD; ++e) acc[e] = fmaf(p, vs[r][e], acc[e]);
    }
    m = m_new;
  }
  if (!active) return;
  const float inv = 1.0f / l;
  Storage<D>* o = out + at.interleaved_row(pair, i, 1, 0);
#pragma unroll
  for (int e = 0; e < HD; ++e) {
    if (e < at.hd) o[e] = detail::Format<D>::store(acc[e] * inv);
  }
  lse[pair * at.seq + i] = m + logf(l);
}

// dQ of each query row, and delta = rowsum(P * dP) for the dK/dV kernel:
// grid (pairs, row blocks). Two passes over the keys: delta, then dQ.
template <DType D, int HD>
__global__ void __launch_bounds__(kFlashRows)
    flash_backward_dq_kernel(const Storage<D>* q, const Storage<D>* k, const Storage<D>* v, const float* lse,
                             const Storage<D>* d_out, Storage<D>* d_qkv, float* delta, FlashLayout at, bool causal,
                             float scale) {
  __shared__ float ks[kFlashKeys][HD], vs[kFlashKeys][HD];
  const std::int64_t pair = blockIdx.x, i = blockIdx.y * std::int64_t{kFlashRows} + threadIdx.x;
  const bool active = i < at.seq;
  const std::int64_t row = active ? i : 0;
  float qr[HD], dor[HD], dq[HD];
  load_row<D, HD>(q + at.head_row(pair, row), at.hd, qr);
  load_row<D, HD>(d_out + at.interleaved_row(pair, row, 1, 0), at.hd, dor);
#pragma unroll
  for (int e = 0; e < HD; ++e) dq[e] = 0.0f;
  const float l = active ? lse[pair * at.seq + i] : 0.0f;
  const std::int64_t key_end = flash_key_end(at, causal, blockIdx.y);
  float dot_p_dp = 0.0f;
  for (int pass = 0; pass < 2; ++pass) {
    for (std::int64_t j0 = 0; j0 < key_end; j0 += kFlashKeys) {
      __syncthreads();
      stage_rows<D, HD, kFlashKeys, 0>(k, at, pair, j0, ks);
      stage_rows<D, HD, kFlashKeys, 0>(v, at, pair, j0, vs);
      __syncthreads();
      if (!active) continue;
#pragma unroll 1
      for (int r = 0; r < kFlashKeys; ++r) {
        const std::int64_t j = j0 + r;
        if (j >= at.seq || (causal && j > i)) continue;
        const float p = detail::fast_exp(dot<HD>(qr, ks[r]) * scale - l);
        const float dp = dot<HD>(dor, vs[r]);
        if (pass == 0) {
          dot_p_dp = fmaf(p, dp, dot_p_dp);
        } else {
          const float ds = p * (dp - dot_p_dp);
#pragma unroll
          for (int e = 0; e < HD; ++e) dq[e] = fmaf(ds, ks[r][e], dq[e]);
        }
      }
    }
  }
  if (!active) return;
  Storage<D>* out = d_qkv + at.interleaved_row(pair, i, 3, 0);
#pragma unroll
  for (int e = 0; e < HD; ++e) {
    if (e < at.hd) out[e] = detail::Format<D>::store(dq[e] * scale);
  }
  delta[pair * at.seq + i] = dot_p_dp;
}

// dK and dV of each key row: grid (pairs, key blocks), a thread per key row,
// the query rows that see them staged kFlashKeys at a time with their lse and
// delta. Shared memory (dynamic: flash_dkv_shared_bytes): the block's own key
// and value rows, padded against bank conflicts (threads read across rows),
// then the staged query tile.
template <int HD>
constexpr std::size_t flash_dkv_shared_bytes() {
  return sizeof(float) * (2 * kFlashRows * (HD + 1) + 2 * kFlashKeys * HD + 2 * kFlashKeys);
}

template <DType D, int HD>
__global__ void __launch_bounds__(kFlashRows)
    flash_backward_dkv_kernel(const Storage<D>* q, const Storage<D>* k, const Storage<D>* v, const float* lse,
                              const Storage<D>* d_out, const float* delta, Storage<D>* d_qkv, FlashLayout at,
                              bool causal, float scale) {
  extern __shared__ float shared[];
  auto own_k = reinterpret_cast<float (*)[HD + 1]>(shared);
  auto own_v = reinterpret_cast<float (*)[HD + 1]>(shared + kFlashRows * (HD + 1));
  auto qs = reinterpret_cast<float (*)[HD]>(shared + 2 * kFlashRows * (HD + 1));
  auto dos = qs + kFlashKeys;
  float* ls = shared + 2 * kFlashRows * (HD + 1) + 2 * kFlashKeys * HD;
  float* deltas = ls + kFlashKeys;
  const std::int64_t pair = blockIdx.x, first = blockIdx.y * std::int64_t{kFlashRows};
  const std::int64_t j = first + threadIdx.x;
  const bool active = j < at.seq;
  stage_rows<D, HD, kFlashRows, 1>(k, at, pair, first, own_k);
  stage_rows<D, HD, kFlashRows, 1>(v, at, pair, first, own_v);
  float dk[HD], dv[HD];
#pragma unroll
  for (int e = 0; e < HD; ++e) dk[e] = dv[e] = 0.0f;
  const float* kr = own_k[threadIdx.x];
  const float* vr = own_v[threadIdx.x];
  // Causal: the rows before the block's first key see none of its keys.
  const std::int64_t i_begin = causal ? first : 0;
  for (std::int64_t i0 = i_begin; i0 < at.seq; i0 += kFlashKeys) {
    __syncthreads();  // the own rows are staged; the previous query tile is no longer read
    for (int x = threadIdx.x; x < kFlashKeys * HD; x += blockDim.x) {
      const int r = x / HD, e = x % HD;
      const std::int64_t i = i0 + r;
      const bool in = i < at.seq && e < at.hd;
      qs[r][e] = in ? detail::Format<D>::load(q[at.head_row(pair, i) + e]) : 0.0f;
      dos[r][e] = in ? detail::Format<D>::load(d_out[at.interleaved_row(pair, i, 1, 0) + e]) : 0.0f;
    }
    for (int r = threadIdx.x; r < kFlashKeys; r += blockDim.x) {
      const bool in = i0 + r < at.seq;
      ls[r] = in ? lse[pair * at.seq + i0 + r] : 0.0f;
      deltas[r] = in ? delta[pair * at.seq + i0 + r] : 0.0f;
    }
    __syncthreads();
    if (!active) continue;
#pragma unroll 1
    for (int r = 0; r < kFlashKeys; ++r) {
      const std::int64_t i = i0 + r;
      if (i >= at.seq || (causal && j > i)) continue;
      float s = 0.0f, dp = 0.0f;
#pragma unroll
      for (int e = 0; e < HD; ++e) {
        s = fmaf(qs[r][e], kr[e], s);
        dp = fmaf(dos[r][e], vr[e], dp);
      }
      const float p = detail::fast_exp(s * scale - ls[r]);
      const float d_s = p * (dp - deltas[r]) * scale;
#pragma unroll
      for (int e = 0; e < HD; ++e) {
        dv[e] = fmaf(p, dos[r][e], dv[e]);
        dk[e] = fmaf(d_s, qs[r][e], dk[e]);
      }
    }
  }
  if (!active) return;
  Storage<D>* out_k = d_qkv + at.interleaved_row(pair, j, 3, 1);
  Storage<D>* out_v = d_qkv + at.interleaved_row(pair, j, 3, 2);
#pragma unroll
  for (int e = 0; e < HD; ++e) {
    if (e < at.hd) {
      out_k[e] = detail::Format<D>::store(dk[e]);
      out_v[e] = detail::Format<D>::store(dv[e]);
    }
  }
}

// fn(std::integral_constant<int, HD>) with HD 64 or 128, whichever holds hd.
template <class Fn>
void with_head_dim(std::int64_t hd, Fn fn) {
  if (hd <= 64) return fn(std::integral_constant<int, 64>{});
  fn(std::integral_constant<int, 128>{});
}

unsigned row_grid(std::int64_t rows) { return static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock); }

// Launches kernel(args...) with a warp per row of `rows` on `stream`, then
// checks the launch. For the softmax row kernels.
template <class... Params, class... Args>
void launch_rows(void (*kernel)(Params...), std::int64_t rows, cudaStream_t stream, Args... args) {
  kernel<<<row_grid(rows), kBlock, 0, stream>>>(args...);
  DTRAIN_CUDA_LAUNCHED();
}

// The one-pass kernels' grid: (pairs, blocks of kFlashRows rows).
dim3 flash_grid(std::int64_t pairs, std::int64_t seq) {
  return dim3(static_cast<unsigned>(pairs), static_cast<unsigned>((seq + kFlashRows - 1) / kFlashRows));
}

}  // namespace

template <DType D>
void AttentionOps<D>::gather(const AttentionGroup<T>& /*g*/, const T* interleaved, std::int64_t parts,
                             std::int64_t part, T* heads) {
  const std::int64_t total = batch_ * heads_ * seq_ * head_dim_;
  detail::launch(copy_heads_kernel<true, D, T, T>, total, stream_, heads_, seq_, head_dim_, total, interleaved, parts,
                 part, heads);
}

// One tile holds every row: O is [B, H, T, hd].
template <DType D>
void AttentionOps<D>::write_rows(const AttentionGroup<T>& /*g*/, const AttentionTile& /*tile*/, const T* o, T* out) {
  const std::int64_t total = batch_ * heads_ * seq_ * head_dim_;
  detail::launch(copy_heads_kernel<false, D, T, T>, total, stream_, heads_, seq_, head_dim_, total, o,
                 std::int64_t{1}, std::int64_t{0}, out);
}

template <DType D>
void AttentionOps<D>::write_grads(const AttentionGroup<T>& g, T* d_qkv) {
  const std::int64_t total = batch_ * heads_ * seq_ * head_dim_;
  const float* grads[3] = {g.dq, g.dk, g.dv};
  for (std::int64_t part = 0; part < 3; ++part) {
    detail::launch(copy_heads_kernel<false, D, float, T>, total, stream_, heads_, seq_, head_dim_, total,
                   grads[part], std::int64_t{3}, part, d_qkv);
  }
}

template <DType D>
void AttentionOps<D>::softmax(const AttentionGroup<T>& g, const AttentionTile& t) {
  const std::int64_t rows = g.pairs * t.rows;
  launch_rows(softmax_rows_kernel<D>, rows, stream_, g.scores, g.probs, g.lse, rows,
              TileRows{seq_, t.row0, t.rows, t.keys, causal_});
}

template <DType D>
void AttentionOps<D>::probs(const AttentionGroup<T>& g, const AttentionTile& t) {
  const std::int64_t rows = g.pairs * t.rows;
  launch_rows(probs_rows_kernel<D>, rows, stream_, g.scores, g.lse, g.probs, rows,
              TileRows{seq_, t.row0, t.rows, t.keys, causal_});
}

template <DType D>
void AttentionOps<D>::softmax_backward(const AttentionGroup<T>& g, const AttentionTile& t) {
  const std::int64_t rows = g.pairs * t.rows;
  launch_rows(softmax_backward_rows_kernel<D>, rows, stream_, g.probs, g.dp, g.d_scores, rows, t.keys);
}

template <DType D>
void AttentionOps<D>::launch_one_pass_forward(const T* q, const T* k, const T* v, T* out, float* lse) {
  const FlashLayout at{heads_, seq_, head_dim_};
  const dim3 grid = flash_grid(batch_ * heads_, seq_);
  const float scale = 1.0f / sqrtf(static_cast<float>(head_dim_));
  with_head_dim(head_dim_, [&](auto hd) {
    flash_forward_kernel<D, hd.value><<<grid, kFlashRows, 0, stream_>>>(q, k, v, out, lse, at, causal_, scale);
  });
  DTRAIN_CUDA_LAUNCHED();
}

template <DType D>
void AttentionOps<D>::launch_one_pass_backward(const T* q, const T* k, const T* v, const float* lse,
                                               const T* d_out, T* d_qkv, float* delta) {
  const FlashLayout at{heads_, seq_, head_dim_};
  const dim3 grid = flash_grid(batch_ * heads_, seq_);
  const float scale = 1.0f / sqrtf(static_cast<float>(head_dim_));
  with_head_dim(head_dim_, [&](auto hd) {
    flash_backward_dq_kernel<D, hd.value>
        <<<grid, kFlashRows, 0, stream_>>>(q, k, v, lse, d_out, d_qkv, delta, at, causal_, scale);
    DTRAIN_CUDA_LAUNCHED();
    constexpr std::size_t shared = flash_dkv_shared_bytes<hd.value>();
    static const bool opted_in = [&] {  // past the 48 KiB default: once per kernel
      DTRAIN_CUDA_CHECK(cudaFuncSetAttribute(flash_backward_dkv_kernel<D, hd.value>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared)));
      return true;
    }();
    (void)opted_in;
    flash_backward_dkv_kernel<D, hd.value>
        <<<grid, kFlashRows, shared, stream_>>>(q, k, v, lse, d_out, delta, d_qkv, at, causal_, scale);
  });
  DTRAIN_CUDA_LAUNCHED();
}

template <DType D>
void AttentionOps<D>::cached(std::int64_t first, std::int64_t capacity, const T* qkv, T* k_cache, T* v_cache,
                             T* out) {
  const std::int64_t elems = seq_ * cache_heads_ * head_dim_;
  detail::launch(append_kv_kernel<T>, elems, stream_, qkv, k_cache, v_cache, heads_, cache_heads_, head_dim_, first,
                 capacity, elems);
  // Rounded up to 16 bytes: the compiled kernel reads the scores with vector
  // loads that may reach past the last one to the end of its 16 bytes
  // (compute-sanitizer's memcheck flagged such reads at 9 scores).
  const auto bytes = static_cast<std::size_t>((first + seq_ + 3) / 4 * 4) * sizeof(float);
  if (bytes > 48 * 1024) {  // past the default: opt in (up to what the GPU has; an error names it beyond)
    DTRAIN_CUDA_CHECK(cudaFuncSetAttribute(attend_cached_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(bytes)));
  }
  const float scale = 1.0f / sqrtf(static_cast<float>(head_dim_));
  attend_cached_kernel<D><<<static_cast<unsigned>(seq_ * heads_), kBlock, bytes, stream_>>>(
      qkv, k_cache, v_cache, out, heads_, heads_ / cache_heads_, seq_, head_dim_, causal_, first, capacity, scale);
  DTRAIN_CUDA_LAUNCHED();
}

// The rest is in attention.cpp.
template class AttentionOps<DType::f32>;
template class AttentionOps<DType::bf16>;
template class AttentionOps<DType::f16>;

}  // namespace dtrain::nn::cuda
