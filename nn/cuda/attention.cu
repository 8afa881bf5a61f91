#include "nn/cuda/attention.h"

#include "core/cuda/check.h"
#include "nn/cuda/device_math.cuh"

namespace dtrain::nn::cuda {
namespace {

using detail::kBlock;
constexpr int kWarpsPerBlock = kBlock / 32;  // softmax: one warp per row

// One thread per head-major element of [B, H, T, hd].
template <bool kToHeads, class T>
__global__ void copy_heads_kernel(std::int64_t heads_n, std::int64_t seq, std::int64_t hd, std::int64_t total,
                                  T* interleaved, std::int64_t parts, std::int64_t part, T* heads) {
  const std::int64_t d_model = heads_n * hd;
  detail::for_each_index(total, [=](std::int64_t i) {
    const std::int64_t e = i % hd, t = (i / hd) % seq, h = (i / (hd * seq)) % heads_n;
    const std::int64_t b = i / (hd * seq * heads_n);
    T* inter = interleaved + (b * seq + t) * parts * d_model + part * d_model + h * hd + e;
    if (kToHeads) {
      heads[i] = *inter;
    } else {
      *inter = heads[i];
    }
  });
}

// One warp per row of [rows, seq]. p may alias scores (f32): every lane
// reads its columns' scores before the last pass writes them.
template <DType D>
__global__ void softmax_rows_kernel(const float* scores, Storage<D>* p, std::int64_t rows, std::int64_t seq,
                                    bool causal) {
  const std::int64_t r = blockIdx.x * std::int64_t{kWarpsPerBlock} + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;  // whole warps leave together
  const float* in = scores + r * seq;
  Storage<D>* row = p + r * seq;
  const std::int64_t valid = causal ? (r % seq) + 1 : seq;
  float mx = -INFINITY;
  for (std::int64_t j = lane; j < valid; j += 32) mx = fmaxf(mx, in[j]);
  mx = detail::warp_max(mx);
  float sum = 0.0f;
  for (std::int64_t j = lane; j < valid; j += 32) sum += detail::fast_exp(in[j] - mx);
  const float inv = 1.0f / detail::warp_sum(sum);
  for (std::int64_t j = lane; j < seq; j += 32) {
    row[j] = detail::Format<D>::store(j < valid ? detail::fast_exp(in[j] - mx) * inv : 0.0f);
  }
}

template <DType D>
__global__ void softmax_backward_rows_kernel(const Storage<D>* p, const float* dp, Storage<D>* ds, std::int64_t rows,
                                             std::int64_t seq) {
  using F = detail::Format<D>;
  const std::int64_t r = blockIdx.x * std::int64_t{kWarpsPerBlock} + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  const Storage<D>* pr = p + r * seq;
  const float* dr = dp + r * seq;
  Storage<D>* out = ds + r * seq;
  float dot = 0.0f;
  for (std::int64_t j = lane; j < seq; j += 32) dot += F::load(pr[j]) * dr[j];
  dot = detail::warp_sum(dot);  // every lane has read its dP before any writes dS
  for (std::int64_t j = lane; j < seq; j += 32) out[j] = F::store(F::load(pr[j]) * (dr[j] - dot));
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
void AttentionOps<D>::copy_heads(bool to_heads, T* interleaved, std::int64_t parts, std::int64_t part, T* heads) {
  detail::launch(to_heads ? copy_heads_kernel<true, T> : copy_heads_kernel<false, T>,
                 batch_ * heads_ * seq_ * head_dim_, stream_, heads_, seq_, head_dim_,
                 batch_ * heads_ * seq_ * head_dim_, interleaved, parts, part, heads);
}

// const_cast: the source is only read in either direction.
template <DType D>
void AttentionOps<D>::to_heads(const T* interleaved, std::int64_t parts, std::int64_t part, T* heads) {
  copy_heads(true, const_cast<T*>(interleaved), parts, part, heads);
}

template <DType D>
void AttentionOps<D>::from_heads(const T* heads, std::int64_t parts, std::int64_t part, T* interleaved) {
  copy_heads(false, interleaved, parts, part, const_cast<T*>(heads));
}

template <DType D>
void AttentionOps<D>::softmax(float* scores, T* probs) {
  const std::int64_t rows = batch_ * heads_ * seq_;
  softmax_rows_kernel<D><<<row_grid(rows), kBlock, 0, stream_>>>(scores, probs, rows, seq_, causal_);
  DTRAIN_CUDA_LAUNCHED();
}

template <DType D>
void AttentionOps<D>::softmax_backward(const T* probs, const float* dp, T* d_scores) {
  const std::int64_t rows = batch_ * heads_ * seq_;
  softmax_backward_rows_kernel<D><<<row_grid(rows), kBlock, 0, stream_>>>(probs, dp, d_scores, rows, seq_);
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
