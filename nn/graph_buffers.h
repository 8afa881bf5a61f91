// The buffers of nn::Graph (nn/graph.h), in a device's memory, sized once
// for micro-batches of [batch, seq]: what forward keeps for backward, the
// scratch backward shares across layers, and the staged inputs with the loss
// totals. T is the storage of matmul operands and saved activations (float,
// or std::uint16_t for bf16/f16); the residual stream, norm statistics,
// logits and the gradients that feed f32 parameter gradients stay f32. With
// T = float, buffers that would only hold a copy of an f32 one are not
// allocated and the f32 buffer is used in their place (the *_t accessors).
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "nn/attention.h"
#include "nn/cross_entropy.h"
#include "nn/device.h"
#include "nn/transformer.h"

namespace dtrain::nn {

// The row strides of the MLP's wide activations (the kernel set's
// row_stride): h and its gradient d_h (fc1's output, fc1_width columns) and
// a and d_a (the activation fc2 reads, d_ff columns); the same for GELU,
// whose a is computed in place of h's layout.
struct MlpStrides {
  std::int64_t h = 0, a = 0;
};

template <class T>
struct GraphActivations {
  using F32 = DeviceArray<float>;
  using Store = DeviceArray<T>;
  static constexpr bool kF32 = std::is_same_v<T, float>;

  // Each piece's saved activations (nn/blocks.h), per layer.
  struct NormActs {
    Store y;          // the normalised rows the next product reads
    F32 mean, rstd;   // mean: LayerNorm only
  };
  struct AttentionActs {
    Store q, k, v;    // the heads in the kernels' layout (nn/attention.h), rotated under rope
    Store out;        // attention's output, which the output projection reads
    F32 lse;          // log-sum-exp per query row [B, H, T]
  };
  struct MlpActs {
    Store h;          // fc1's output (rows MlpStrides::h apart); GELU: gelu'(h) after forward
    Store a;          // the activation fc2 reads (rows MlpStrides::a apart); empty under recompute
  };
  struct Layer {
    NormActs norm1;
    AttentionActs attn;
    F32 mid;          // the residual stream between the attention and the MLP branch
    NormActs norm2;
    MlpActs mlp;
  };
  std::vector<F32> resid;  // n_layers + 1 residual-stream states
  // One Layer per layer; under full recompute one, which every layer's
  // forward (and its recompute in backward) overwrites.
  std::vector<Layer> layers;
  // Under selective or full recompute: the MLP's activation, computed again
  // in backward from h, one buffer for every layer.
  Store mlp_a;
  Store qkv, lnf;                                  // forward scratch (lnf: the lm head's input)
  F32 lnf_mean, lnf_rstd, lnf32, pooled, logits;  // lnf32, pooled: the classifier's f32 head
  std::int64_t logits_rows = 0;                   // rows of one logits tile (ModelConfig::logits_rows)
  F32 d_resid, d_tmp, d_branch, d_lnf, d_pooled;
  F32 d_resid_sums;  // [d]: d_resid's column sums, as the layernorm backward that wrote it left them
  // *16: only when T is 16-bit; d_h, d_a: rows MlpStrides apart (d_a: SwiGLU only, GELU works in place).
  Store d_resid16, d_h, d_a, d_attn, d_qkv, d_logits16;
  MlpStrides strides;
  // Attention scratch, as far as the kernel set asks for it (nn/attention.h
  // AttentionScratch): the whole batch's, or delta alone; empty otherwise.
  F32 scores, dp, dq, dk, dv, delta;
  Store heads, probs16, d_scores16;  // *16: only when T is 16-bit

  // scratch: what of the attention scratch to allocate; strides: the MLP's
  // row strides (the widths or more).
  GraphActivations(Device& dev, const ModelConfig& c, std::int64_t B, std::int64_t T_,
                   AttentionScratchKind scratch, MlpStrides strides_)
      : strides(strides_) {
    const auto bt = static_cast<std::size_t>(B * T_);
    const auto d = static_cast<std::size_t>(c.d_model);
    const auto hs = static_cast<std::size_t>(strides.h), as = static_cast<std::size_t>(strides.a);
    const auto rows = static_cast<std::size_t>(B * c.n_heads * T_);
    const bool lm = c.kind == ModelConfig::Kind::lm;
    const bool layernorm = c.norm == ModelConfig::Norm::layernorm;
    const bool swiglu = c.mlp == ModelConfig::Mlp::swiglu;
    const bool recompute_mlp = c.recompute != ModelConfig::Recompute::none;
    const std::size_t half_only = kF32 ? 0 : 1;
    for (std::int64_t l = 0; l <= c.n_layers; ++l) resid.emplace_back(dev, bt * d);
    const bool full = c.recompute == ModelConfig::Recompute::full;
    layers.resize(static_cast<std::size_t>(full ? std::min<std::int64_t>(c.n_layers, 1) : c.n_layers));
    for (Layer& L : layers) {
      for (NormActs* n : {&L.norm1, &L.norm2}) {
        n->y = Store(dev, bt * d);
        n->mean = F32(dev, layernorm ? bt : 0);
        n->rstd = F32(dev, bt);
      }
      for (Store* s : {&L.attn.q, &L.attn.k, &L.attn.v, &L.attn.out}) *s = Store(dev, bt * d);
      L.attn.lse = F32(dev, rows);
      L.mid = F32(dev, bt * d);
      L.mlp.h = Store(dev, bt * hs);
      L.mlp.a = Store(dev, recompute_mlp ? 0 : bt * as);
    }
    mlp_a = Store(dev, recompute_mlp ? bt * as : 0);
    qkv = Store(dev, bt * 3 * d);
    lnf = Store(dev, lm ? bt * d : 0);
    lnf_mean = F32(dev, layernorm ? bt : 0);
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
    d_h = Store(dev, bt * hs);
    d_a = Store(dev, swiglu ? bt * as : 0);
    d_qkv = Store(dev, bt * 3 * d);
    d_logits16 = Store(dev, lm ? half_only * static_cast<std::size_t>(logits_rows * c.vocab_size) : 0);
    const std::size_t batched = scratch == AttentionScratchKind::whole_batch ? 1 : 0;
    delta = F32(dev, scratch == AttentionScratchKind::rows ? rows : 0);
    for (F32* s : {&scores, &dp}) *s = F32(dev, batched * rows * static_cast<std::size_t>(T_));
    for (F32* s : {&dq, &dk, &dv}) *s = F32(dev, batched * bt * d);
    heads = Store(dev, batched * bt * d);
    for (Store* s : {&probs16, &d_scores16}) *s = Store(dev, batched * half_only * rows * static_cast<std::size_t>(T_));
  }

  // Layer l's activations (the one set under full recompute).
  Layer& layer(std::int64_t l) { return layers[layers.size() == 1 ? 0 : static_cast<std::size_t>(l)]; }
  // The MLP activation fc2 reads: the layer's own, or the shared one under recompute.
  T* mlp_out(Layer& L) { return L.mlp.a.size() != 0 ? L.mlp.a.data() : mlp_a.data(); }

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
      for (const Store* s : {&L.norm1.y, &L.attn.q, &L.attn.k, &L.attn.v, &L.attn.out, &L.norm2.y, &L.mlp.h,
                             &L.mlp.a}) {
        n += s->bytes();
      }
      for (const F32* s : {&L.norm1.mean, &L.norm1.rstd, &L.mid, &L.norm2.mean, &L.norm2.rstd, &L.attn.lse}) {
        n += s->bytes();
      }
    }
    for (const Store* s : {&mlp_a, &qkv, &heads, &lnf, &d_resid16, &d_h, &d_a, &d_attn, &d_qkv, &probs16,
                           &d_scores16, &d_logits16}) {
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
