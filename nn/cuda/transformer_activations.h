// Private to nn/cuda/transformer*.cpp: the device activations, backward
// scratch and inputs of nn::cuda::Transformer, the same buffers as the CPU
// model's (nn/transformer_activations.h) in device memory, sized once.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "nn/cuda/cross_entropy.h"
#include "nn/cuda/device_buffer.h"
#include "nn/cuda/transformer.h"

namespace dtrain::nn::cuda {

using F32 = DeviceBuffer<float>;
using Half = DeviceBuffer<std::uint16_t>;

struct Transformer::Activations {
  struct Layer {
    F32 ln1, ln1_mean, ln1_rstd, qkv, q, k, v, probs, attn, mid;
    F32 ln2, ln2_mean, ln2_rstd, h, a;
  };
  std::vector<F32> resid;  // n_layers + 1 residual-stream states
  std::vector<Layer> layers;
  F32 lnf, lnf_mean, lnf_rstd, pooled, logits;
  F32 d_resid, d_tmp, d_branch, d_qkv, d_h, d_lnf, d_pooled;
  F32 d_heads, d_probs, dq, dk, dv;
  F32 d_bias;  // mixed precision: a 16-bit bias gradient widened before its column sums

  // In mixed precision only the f32 state shared with HalfActivations is
  // allocated (as on the CPU).
  Activations(const ModelConfig& c, std::int64_t B, std::int64_t T) {
    const bool f32 = c.compute == DType::f32;
    const auto bt = static_cast<std::size_t>(B * T);
    const auto d = static_cast<std::size_t>(c.d_model);
    const auto ff = static_cast<std::size_t>(f32 ? c.d_ff : 0);
    const auto heads = f32 ? bt * d : 0;
    const auto probs_n = static_cast<std::size_t>(f32 ? B * c.n_heads * T * T : 0);
    for (std::int64_t l = 0; l <= c.n_layers; ++l) resid.emplace_back(bt * d);
    layers.resize(static_cast<std::size_t>(f32 ? c.n_layers : 0));
    for (Layer& L : layers) {
      for (F32* buf : {&L.ln1, &L.attn, &L.mid, &L.ln2}) *buf = F32(bt * d);
      for (F32* buf : {&L.ln1_mean, &L.ln1_rstd, &L.ln2_mean, &L.ln2_rstd}) *buf = F32(bt);
      L.qkv = F32(bt * 3 * d);
      for (F32* buf : {&L.q, &L.k, &L.v}) *buf = F32(heads);
      L.probs = F32(probs_n);
      L.h = F32(bt * ff);
      L.a = F32(bt * ff);
    }
    const bool lm = c.kind == ModelConfig::Kind::lm;
    lnf = F32(f32 || !lm ? bt * d : 0);
    lnf_mean = F32(bt);
    lnf_rstd = F32(bt);
    pooled = F32(static_cast<std::size_t>(B) * d);
    logits = F32((lm ? bt : static_cast<std::size_t>(B)) * static_cast<std::size_t>(c.outputs()));
    d_resid = F32(bt * d);
    d_tmp = F32(bt * d);
    d_branch = F32(c.dropout > 0.0f ? bt * d : 0);
    d_qkv = F32(f32 ? bt * 3 * d : 0);
    d_h = F32(bt * ff);
    d_lnf = F32(bt * d);
    d_pooled = F32(static_cast<std::size_t>(B) * d);
    d_heads = F32(heads);
    d_probs = F32(probs_n);
    dq = F32(heads);
    dk = F32(heads);
    dv = F32(heads);
    d_bias = F32(f32 ? 0 : bt * std::max<std::size_t>(3 * d, static_cast<std::size_t>(c.d_ff)));
  }

  std::int64_t bytes() const {
    std::size_t n = lnf.bytes() + lnf_mean.bytes() + lnf_rstd.bytes() + pooled.bytes() + logits.bytes();
    for (const F32* b : {&d_resid, &d_tmp, &d_branch, &d_qkv, &d_h, &d_lnf, &d_pooled, &d_heads,
                         &d_probs, &dq, &dk, &dv, &d_bias}) {
      n += b->bytes();
    }
    for (const F32& r : resid) n += r.bytes();
    for (const Layer& L : layers) {
      for (const F32* b : {&L.ln1, &L.ln1_mean, &L.ln1_rstd, &L.qkv, &L.q, &L.k, &L.v, &L.probs,
                           &L.attn, &L.mid, &L.ln2, &L.ln2_mean, &L.ln2_rstd, &L.h, &L.a}) {
        n += b->bytes();
      }
    }
    return static_cast<std::int64_t>(n);
  }
};

// Mixed precision: the 16-bit activations every matmul reads and 16-bit
// backward scratch (nn::Transformer::HalfActivations on the device).
struct Transformer::HalfActivations {
  struct Layer {
    Half ln1, q, k, v, probs, attn, ln2, h, a;  // h holds gelu' after forward
    F32 ln1_mean, ln1_rstd, mid, ln2_mean, ln2_rstd;
  };
  std::vector<Layer> layers;
  Half qkv, heads, lnf;
  F32 scores;  // forward scores, backward dP
  Half d_resid, d_h, d_attn, d_qkv, d_scores, dq, dk, dv, d_logits;

  HalfActivations(const ModelConfig& c, std::int64_t B, std::int64_t T) {
    const auto bt = static_cast<std::size_t>(B * T);
    const auto d = static_cast<std::size_t>(c.d_model);
    const auto ff = static_cast<std::size_t>(c.d_ff);
    const auto probs_n = static_cast<std::size_t>(B * c.n_heads * T * T);
    const bool lm = c.kind == ModelConfig::Kind::lm;
    layers.resize(static_cast<std::size_t>(c.n_layers));
    for (Layer& L : layers) {
      for (Half* buf : {&L.ln1, &L.q, &L.k, &L.v, &L.attn, &L.ln2}) *buf = Half(bt * d);
      L.probs = Half(probs_n);
      L.h = Half(bt * ff);
      L.a = Half(bt * ff);
      for (F32* buf : {&L.ln1_mean, &L.ln1_rstd, &L.ln2_mean, &L.ln2_rstd}) *buf = F32(bt);
      L.mid = F32(bt * d);
    }
    qkv = Half(bt * 3 * d);
    heads = Half(bt * d);
    lnf = Half(lm ? bt * d : 0);
    scores = F32(probs_n);
    for (Half* buf : {&d_resid, &d_attn, &dq, &dk, &dv}) *buf = Half(bt * d);
    d_h = Half(bt * ff);
    d_qkv = Half(bt * 3 * d);
    d_scores = Half(probs_n);
    d_logits = Half(lm ? bt * static_cast<std::size_t>(c.vocab_size) : 0);
  }

  std::int64_t bytes() const {
    std::size_t n = qkv.bytes() + heads.bytes() + lnf.bytes() + scores.bytes();
    for (const Half* b : {&d_resid, &d_h, &d_attn, &d_qkv, &d_scores, &dq, &dk, &dv, &d_logits}) {
      n += b->bytes();
    }
    for (const Layer& L : layers) {
      for (const Half* b : {&L.ln1, &L.q, &L.k, &L.v, &L.probs, &L.attn, &L.ln2, &L.h, &L.a}) {
        n += b->bytes();
      }
      for (const F32* b : {&L.ln1_mean, &L.ln1_rstd, &L.mid, &L.ln2_mean, &L.ln2_rstd}) {
        n += b->bytes();
      }
    }
    return static_cast<std::int64_t>(n);
  }
};

// Pinned host memory of `n` elements (cudaHostAlloc), so that copies from it
// are truly asynchronous.
template <class T>
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(std::size_t n) : size_(n) {
    if (n > 0) DTRAIN_CUDA_TRY(cudaHostAlloc(reinterpret_cast<void**>(&data_), n * sizeof(T), cudaHostAllocDefault));
  }
  ~PinnedBuffer() {
    if (data_ != nullptr) cudaFreeHost(data_);  // no throw from a destructor
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  PinnedBuffer(PinnedBuffer&& o) noexcept : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    return *this;
  }
  T* data() { return data_; }
  std::size_t size() const { return size_; }

 private:
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

// One micro-batch's inputs on the device, the two pinned slots they are
// staged through (slot i is refilled once the copy recorded by copied[i] is
// done), and the device-side loss accumulator with its pinned read-back.
struct Transformer::Inputs {
  struct Slot {
    PinnedBuffer<std::int32_t> tokens, targets;
    PinnedBuffer<float> patches;
    cudaEvent_t copied = nullptr;
  };
  Slot slots[2];
  int next = 0;
  DeviceBuffer<std::int32_t> tokens, targets;
  F32 patches;
  DeviceBuffer<CrossEntropyDeviceResult> result;
  DeviceBuffer<std::int32_t> bad_index;
  PinnedBuffer<CrossEntropyDeviceResult> host_result;
  PinnedBuffer<std::int32_t> host_bad_index;

  Inputs(std::size_t n_tokens, std::size_t n_patches, std::size_t n_targets)
      : tokens(n_tokens), targets(n_targets), patches(n_patches), result(1), bad_index(1),
        host_result(1), host_bad_index(1) {
    for (Slot& s : slots) {
      s.tokens = PinnedBuffer<std::int32_t>(n_tokens);
      s.targets = PinnedBuffer<std::int32_t>(n_targets);
      s.patches = PinnedBuffer<float>(n_patches);
      DTRAIN_CUDA_TRY(cudaEventCreateWithFlags(&s.copied, cudaEventDisableTiming));
    }
  }
  ~Inputs() {
    for (Slot& s : slots) {
      if (s.copied != nullptr) cudaEventDestroy(s.copied);
    }
  }
  Inputs(const Inputs&) = delete;
  Inputs& operator=(const Inputs&) = delete;

  std::int64_t bytes() const {
    return static_cast<std::int64_t>(tokens.bytes() + targets.bytes() + patches.bytes() + result.bytes() +
                                     bad_index.bytes());
  }
};

}  // namespace dtrain::nn::cuda
