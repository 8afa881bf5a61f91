// The buffers a Transformer keeps for backward and the scratch its backward
// shares across layers, sized once for [batch, seq], for any buffer type:
// host memory (AlignedBuffer, nn/transformer_activations.h) or device memory
// (DeviceBuffer, nn/cuda/transformer_activations.h). Both models use the same
// buffers for the same things, so they are declared once here.
// Buffer<T> must be constructible from an element count and have size().
#pragma once

#include <cstdint>
#include <vector>

#include "nn/transformer.h"

namespace dtrain::nn {

template <class Buffer>
std::size_t bytes_of(const Buffer& b) {
  return b.size() * sizeof(*b.data());
}

// All f32 activations and backward scratch. In mixed precision (c.compute
// not f32) only the f32 state shared with HalfActivationBuffers is
// allocated: residual stream, final norm statistics, logits, the classifier
// head and the f32 backward scratch.
template <template <class> class Buffer>
struct ActivationBuffers {
  using F32 = Buffer<float>;
  struct Layer {
    F32 ln1, ln1_mean, ln1_rstd, qkv, q, k, v, probs, attn, mid;
    F32 ln2, ln2_mean, ln2_rstd, h, a;
  };
  std::vector<F32> resid;  // n_layers + 1 residual-stream states
  std::vector<Layer> layers;
  F32 lnf, lnf_mean, lnf_rstd, pooled, logits;
  // Backward scratch shared by all layers.
  F32 d_resid, d_tmp, d_branch, d_qkv, d_h, d_lnf, d_pooled;
  F32 d_heads, d_probs, dq, dk, dv;

  ActivationBuffers(const ModelConfig& c, std::int64_t B, std::int64_t T) {
    const bool f32 = c.compute == DType::f32;
    const auto bt = static_cast<std::size_t>(B * T);
    const auto d = static_cast<std::size_t>(c.d_model);
    const auto ff = static_cast<std::size_t>(f32 ? c.d_ff : 0);
    const auto heads = f32 ? bt * d : 0;
    const auto probs_n = static_cast<std::size_t>(f32 ? B * c.n_heads * T * T : 0);
    for (std::int64_t l = 0; l <= c.n_layers; ++l) resid.emplace_back(bt * d);
    layers.resize(static_cast<std::size_t>(f32 ? c.n_layers : 0));
    for (Layer& L : layers) {
      L.ln1 = F32(bt * d);
      L.ln1_mean = F32(bt);
      L.ln1_rstd = F32(bt);
      L.qkv = F32(bt * 3 * d);
      L.q = F32(heads);
      L.k = F32(heads);
      L.v = F32(heads);
      L.probs = F32(probs_n);
      L.attn = F32(bt * d);
      L.mid = F32(bt * d);
      L.ln2 = F32(bt * d);
      L.ln2_mean = F32(bt);
      L.ln2_rstd = F32(bt);
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
  }

  std::int64_t bytes() const {
    std::size_t n = 0;
    for (const F32* b : {&lnf, &lnf_mean, &lnf_rstd, &pooled, &logits, &d_resid, &d_tmp, &d_branch, &d_qkv,
                         &d_h, &d_lnf, &d_pooled, &d_heads, &d_probs, &dq, &dk, &dv}) {
      n += bytes_of(*b);
    }
    for (const F32& r : resid) n += bytes_of(r);
    for (const Layer& L : layers) {
      for (const F32* b : {&L.ln1, &L.ln1_mean, &L.ln1_rstd, &L.qkv, &L.q, &L.k, &L.v, &L.probs, &L.attn,
                           &L.mid, &L.ln2, &L.ln2_mean, &L.ln2_rstd, &L.h, &L.a}) {
        n += bytes_of(*b);
      }
    }
    return static_cast<std::int64_t>(n);
  }
};

// Mixed precision: the 16-bit activations every matmul reads, and 16-bit
// backward scratch (f32 state stays in ActivationBuffers).
template <template <class> class Buffer>
struct HalfActivationBuffers {
  using F32 = Buffer<float>;
  using Half = Buffer<std::uint16_t>;
  struct Layer {
    Half ln1, q, k, v, probs, attn, ln2, h, a;  // h holds gelu' after forward
    F32 ln1_mean, ln1_rstd, mid, ln2_mean, ln2_rstd;
  };
  std::vector<Layer> layers;
  Half qkv, heads, lnf;  // forward scratch (lnf: lm head input)
  F32 scores;            // forward scores, backward dP
  Half d_resid, d_h, d_attn, d_qkv, d_scores, dq, dk, dv, d_logits;

  HalfActivationBuffers(const ModelConfig& c, std::int64_t B, std::int64_t T) {
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
      L.ln1_mean = F32(bt);
      L.ln1_rstd = F32(bt);
      L.mid = F32(bt * d);
      L.ln2_mean = F32(bt);
      L.ln2_rstd = F32(bt);
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
    std::size_t n = bytes_of(qkv) + bytes_of(heads) + bytes_of(lnf) + bytes_of(scores);
    for (const Half* b : {&d_resid, &d_h, &d_attn, &d_qkv, &d_scores, &dq, &dk, &dv, &d_logits}) n += bytes_of(*b);
    for (const Layer& L : layers) {
      for (const Half* b : {&L.ln1, &L.q, &L.k, &L.v, &L.probs, &L.attn, &L.ln2, &L.h, &L.a}) n += bytes_of(*b);
      for (const F32* b : {&L.ln1_mean, &L.ln1_rstd, &L.mid, &L.ln2_mean, &L.ln2_rstd}) n += bytes_of(*b);
    }
    return static_cast<std::int64_t>(n);
  }
};

}  // namespace dtrain::nn
