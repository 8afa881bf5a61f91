// The buffers of nn::Graph (nn/graph.h), in a device's memory, sized once
// for micro-batches of [batch, seq]: what forward keeps for backward, the
// scratch backward shares across layers, and the staged inputs with the loss
// totals. T is the storage of matmul operands and saved activations (float,
// or std::uint16_t for bf16/f16); the residual stream, norm statistics,
// logits and the gradients that feed f32 parameter gradients stay f32. With
// T = float, buffers that would only hold a copy of an f32 one are not
// allocated and the f32 buffer is used in their place (the *_t accessors).
#pragma once

#include <cstdint>
#include <type_traits>
#include <vector>

#include "nn/attention.h"
#include "nn/cross_entropy.h"
#include "nn/device.h"
#include "nn/transformer.h"

namespace dtrain::nn {

template <class T>
struct GraphActivations {
  using F32 = DeviceArray<float>;
  using Store = DeviceArray<T>;
  static constexpr bool kF32 = std::is_same_v<T, float>;

  struct Layer {
    Store ln1, q, k, v, attn, ln2, h, a;  // h holds gelu' after forward; h, a: rows ff_stride apart
    F32 ln1_mean, ln1_rstd, mid, ln2_mean, ln2_rstd;
    F32 lse;  // attention's log-sum-exp per query row [B, H, T]
  };
  std::vector<F32> resid;  // n_layers + 1 residual-stream states
  std::vector<Layer> layers;
  Store qkv, lnf;                                  // forward scratch (lnf: the lm head's input)
  F32 lnf_mean, lnf_rstd, lnf32, pooled, logits;  // lnf32, pooled: the classifier's f32 head
  std::int64_t logits_rows = 0;                   // rows of one logits tile (ModelConfig::logits_rows)
  F32 d_resid, d_tmp, d_branch, d_lnf, d_pooled;
  F32 d_resid_sums;  // [d]: d_resid's column sums, as the layernorm backward that wrote it left them
  Store d_resid16, d_h, d_attn, d_qkv, d_logits16;  // *16: only when T is 16-bit; d_h: rows ff_stride apart
  // The row stride of the d_ff-wide activations (the kernel set's row_stride(d_ff)).
  std::int64_t ff_stride = 0;
  // Attention scratch, as far as the kernel set asks for it (nn/attention.h
  // AttentionScratch): the whole batch's, or delta alone; empty otherwise.
  F32 scores, dp, dq, dk, dv, delta;
  Store heads, probs16, d_scores16;  // *16: only when T is 16-bit

  // scratch: what of the attention scratch to allocate; ff_stride_: the row
  // stride of h, a and d_h (d_ff or more).
  GraphActivations(Device& dev, const ModelConfig& c, std::int64_t B, std::int64_t T_,
                   AttentionScratchKind scratch, std::int64_t ff_stride_)
      : ff_stride(ff_stride_) {
    const auto bt = static_cast<std::size_t>(B * T_);
    const auto d = static_cast<std::size_t>(c.d_model);
    const auto ffs = static_cast<std::size_t>(ff_stride);
    const auto rows = static_cast<std::size_t>(B * c.n_heads * T_);
    const bool lm = c.kind == ModelConfig::Kind::lm;
    const std::size_t half_only = kF32 ? 0 : 1;
    for (std::int64_t l = 0; l <= c.n_layers; ++l) resid.emplace_back(dev, bt * d);
    layers.resize(static_cast<std::size_t>(c.n_layers));
    for (Layer& L : layers) {
      for (Store* s : {&L.ln1, &L.q, &L.k, &L.v, &L.attn, &L.ln2}) *s = Store(dev, bt * d);
      L.h = Store(dev, bt * ffs);
      L.a = Store(dev, bt * ffs);
      for (F32* s : {&L.ln1_mean, &L.ln1_rstd, &L.ln2_mean, &L.ln2_rstd}) *s = F32(dev, bt);
      L.mid = F32(dev, bt * d);
      L.lse = F32(dev, rows);
    }
    qkv = Store(dev, bt * 3 * d);
    lnf = Store(dev, lm ? bt * d : 0);
    lnf_mean = F32(dev, bt);
    lnf_rstd = F32(dev, bt);
    lnf32 = F32(dev, lm ? 0 : bt * d);
    pooled = F32(dev, lm ? 0 : static_cast<std::size_t>(B) * d);
    d_pooled = F32(dev, lm ? 0 : static_cast<std::size_t>(B) * d);
    logits_rows = lm ? c.logits_rows(B * T_) : B;
    logits = F32(dev, static_cast<std::size_t>(logits_rows * c.outputs()));
    for (F32* s : {&d_resid, &d_tmp, &d_lnf}) *s = F32(dev, bt * d);
    d_branch = F32(dev, c.dropout > 0.0f ? bt * d : 0);
    d_resid_sums = F32(dev, c.dropout > 0.0f ? 0 : d);
    d_attn = Store(dev, bt * d);
    d_resid16 = Store(dev, half_only * bt * d);
    d_h = Store(dev, bt * ffs);
    d_qkv = Store(dev, bt * 3 * d);
    d_logits16 = Store(dev, lm ? half_only * static_cast<std::size_t>(logits_rows * c.vocab_size) : 0);
    const std::size_t batched = scratch == AttentionScratchKind::whole_batch ? 1 : 0;
    delta = F32(dev, scratch == AttentionScratchKind::rows ? rows : 0);
    for (F32* s : {&scores, &dp}) *s = F32(dev, batched * rows * static_cast<std::size_t>(T_));
    for (F32* s : {&dq, &dk, &dv}) *s = F32(dev, batched * bt * d);
    heads = Store(dev, batched * bt * d);
    for (Store* s : {&probs16, &d_scores16}) *s = Store(dev, batched * half_only * rows * static_cast<std::size_t>(T_));
  }

  // The scratch as the attention kernels take it: P over S and dS over dP when T is f32.
  AttentionScratch<T> attention_scratch() {
    if constexpr (kF32) {
      return {scores.data(), dp.data(), scores.data(), dp.data(), heads.data(), dq.data(), dk.data(), dv.data(),
              delta.data()};
    } else {
      return {scores.data(), dp.data(), probs16.data(), d_scores16.data(), heads.data(), dq.data(), dk.data(),
              dv.data(), delta.data()};
    }
  }

  std::int64_t bytes() const {
    std::size_t n = 0;
    for (const F32& r : resid) n += r.bytes();
    for (const Layer& L : layers) {
      for (const Store* s : {&L.ln1, &L.q, &L.k, &L.v, &L.attn, &L.ln2, &L.h, &L.a}) n += s->bytes();
      for (const F32* s : {&L.ln1_mean, &L.ln1_rstd, &L.mid, &L.ln2_mean, &L.ln2_rstd, &L.lse}) n += s->bytes();
    }
    for (const Store* s : {&qkv, &heads, &lnf, &d_resid16, &d_h, &d_attn, &d_qkv, &probs16, &d_scores16,
                           &d_logits16}) {
      n += s->bytes();
    }
    for (const F32* s : {&scores, &dp, &dq, &dk, &dv, &delta, &lnf_mean, &lnf_rstd, &lnf32, &pooled, &logits,
                         &d_resid, &d_tmp, &d_branch, &d_lnf, &d_pooled, &d_resid_sums}) {
      n += s->bytes();
    }
    return static_cast<std::int64_t>(n);
  }
};

// One micro-batch's inputs on the device and the two host slots they are
// staged through: slot i is refilled on the host once the device has copied
// out of it (its fence), so the loader's batch can change right after
// forward() returns while the device still runs behind. Also the loss totals
// (device) and where collect() reads them (host).
struct GraphInputs {
  struct Slot {
    HostArray<std::int32_t> tokens, targets;
    HostArray<float> patches;
    FencePtr copied;
  };
  Slot slots[2];
  int next = 0;
  DeviceArray<std::int32_t> tokens, targets;
  DeviceArray<float> patches;
  DeviceArray<CrossEntropyTotals> totals;
  HostArray<CrossEntropyTotals> host_totals;

  GraphInputs(Device& dev, std::size_t n_tokens, std::size_t n_patches, std::size_t n_targets)
      : tokens(dev, n_tokens), targets(dev, n_targets), patches(dev, n_patches), totals(dev, 1),
        host_totals(dev, 1) {
    for (Slot& s : slots) {
      s.tokens = HostArray<std::int32_t>(dev, n_tokens);
      s.targets = HostArray<std::int32_t>(dev, n_targets);
      s.patches = HostArray<float>(dev, n_patches);
    }
  }

  std::int64_t bytes() const {
    return static_cast<std::int64_t>(tokens.bytes() + targets.bytes() + patches.bytes() + totals.bytes());
  }
};

}  // namespace dtrain::nn
