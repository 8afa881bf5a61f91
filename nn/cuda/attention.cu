#include "nn/cuda/attention.h"

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
__global__ void append_kv_kernel(const T* qkv, T* k_cache, T* v_cache, std::int64_t heads_n, std::int64_t hd,
                                 std::int64_t first, std::int64_t capacity, std::int64_t total) {
  const std::int64_t d = heads_n * hd;
  detail::for_each_index(total, [=](std::int64_t x) {
    const std::int64_t e = x % hd, h = (x / hd) % heads_n, i = x / d;
    const std::int64_t at = (h * capacity + first + i) * hd + e;
    k_cache[at] = qkv[i * 3 * d + d + h * hd + e];
    v_cache[at] = qkv[i * 3 * d + 2 * d + h * hd + e];
  });
}

// One block per (row i, head h) of a decode pass: scores over the cached
// positions in shared memory, softmax, then the weighted sum of the values.
template <DType D>
__global__ void attend_cached_kernel(const Storage<D>* qkv, const Storage<D>* k_cache, const Storage<D>* v_cache,
                                     Storage<D>* out, std::int64_t heads_n, std::int64_t seq, std::int64_t hd,
                                     bool causal, std::int64_t first, std::int64_t capacity, float scale) {
  using F = detail::Format<D>;
  extern __shared__ float scores[];
  const std::int64_t i = blockIdx.x / heads_n, h = blockIdx.x % heads_n, d = heads_n * hd;
  const std::int64_t seen = causal ? first + i + 1 : first + seq;
  const Storage<D>* q = qkv + i * 3 * d + h * hd;
  float mx = -INFINITY;
  for (std::int64_t j = threadIdx.x; j < seen; j += blockDim.x) {
    const Storage<D>* k = k_cache + (h * capacity + j) * hd;
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
    for (std::int64_t j = 0; j < seen; ++j) acc += scores[j] * inv * F::load(v_cache[(h * capacity + j) * hd + e]);
    out[i * d + h * hd + e] = F::store(acc);
  }
}

unsigned row_grid(std::int64_t rows) { return static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock); }

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
  const TileRows tile{seq_, t.row0, t.rows, t.keys, causal_};
  softmax_rows_kernel<D><<<row_grid(rows), kBlock, 0, stream_>>>(g.scores, g.probs, g.lse, rows, tile);
  DTRAIN_CUDA_LAUNCHED();
}

template <DType D>
void AttentionOps<D>::probs(const AttentionGroup<T>& g, const AttentionTile& t) {
  const std::int64_t rows = g.pairs * t.rows;
  const TileRows tile{seq_, t.row0, t.rows, t.keys, causal_};
  probs_rows_kernel<D><<<row_grid(rows), kBlock, 0, stream_>>>(g.scores, g.lse, g.probs, rows, tile);
  DTRAIN_CUDA_LAUNCHED();
}

template <DType D>
void AttentionOps<D>::softmax_backward(const AttentionGroup<T>& g, const AttentionTile& t) {
  const std::int64_t rows = g.pairs * t.rows;
  softmax_backward_rows_kernel<D><<<row_grid(rows), kBlock, 0, stream_>>>(g.probs, g.dp, g.d_scores, rows, t.keys);
  DTRAIN_CUDA_LAUNCHED();
}

template <DType D>
void AttentionOps<D>::cached(std::int64_t first, std::int64_t capacity, const T* qkv, T* k_cache, T* v_cache,
                             T* out) {
  const std::int64_t elems = seq_ * heads_ * head_dim_;
  detail::launch(append_kv_kernel<T>, elems, stream_, qkv, k_cache, v_cache, heads_, head_dim_, first, capacity,
                 elems);
  const auto bytes = static_cast<std::size_t>(first + seq_) * sizeof(float);
  if (bytes > 48 * 1024) {  // past the default: opt in (up to what the GPU has; an error names it beyond)
    DTRAIN_CUDA_CHECK(cudaFuncSetAttribute(attend_cached_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(bytes)));
  }
  const float scale = 1.0f / sqrtf(static_cast<float>(head_dim_));
  attend_cached_kernel<D><<<static_cast<unsigned>(seq_ * heads_), kBlock, bytes, stream_>>>(
      qkv, k_cache, v_cache, out, heads_, seq_, head_dim_, causal_, first, capacity, scale);
  DTRAIN_CUDA_LAUNCHED();
}

// The rest is in attention.cpp.
template class AttentionOps<DType::f32>;
template class AttentionOps<DType::bf16>;
template class AttentionOps<DType::f16>;

}  // namespace dtrain::nn::cuda
