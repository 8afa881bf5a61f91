// Private to nn/transformer*.cpp: the activations a Transformer keeps for
// backward and the scratch its backward shares across layers.
#pragma once

#include <vector>

#include "core/aligned_buffer.h"
#include "nn/transformer.h"

namespace dtrain::nn {

// All activations and backward scratch, sized once for [batch, seq].
struct Transformer::Activations {
  struct Layer {
    AlignedBuffer<float> ln1, ln1_mean, ln1_rstd, qkv, q, k, v, probs, attn, mid;
    AlignedBuffer<float> ln2, ln2_mean, ln2_rstd, h, a;
  };
  std::vector<AlignedBuffer<float>> resid;  // n_layers + 1 residual-stream states
  std::vector<Layer> layers;
  AlignedBuffer<float> lnf, lnf_mean, lnf_rstd, pooled, logits;
  // Backward scratch shared by all layers.
  AlignedBuffer<float> d_resid, d_tmp, d_branch, d_qkv, d_h, d_lnf, d_pooled;
  AlignedBuffer<float> d_heads, d_probs, dq, dk, dv;

  // In mixed precision (c.compute not f32) only the f32 state shared with
  // HalfActivations is allocated: residual stream, final norm statistics,
  // logits, the classifier head and the f32 backward scratch.
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
      L.ln1 = AlignedBuffer<float>(bt * d);
      L.ln1_mean = AlignedBuffer<float>(bt);
      L.ln1_rstd = AlignedBuffer<float>(bt);
      L.qkv = AlignedBuffer<float>(bt * 3 * d);
      L.q = AlignedBuffer<float>(heads);
      L.k = AlignedBuffer<float>(heads);
      L.v = AlignedBuffer<float>(heads);
      L.probs = AlignedBuffer<float>(probs_n);
      L.attn = AlignedBuffer<float>(bt * d);
      L.mid = AlignedBuffer<float>(bt * d);
      L.ln2 = AlignedBuffer<float>(bt * d);
      L.ln2_mean = AlignedBuffer<float>(bt);
      L.ln2_rstd = AlignedBuffer<float>(bt);
      L.h = AlignedBuffer<float>(bt * ff);
      L.a = AlignedBuffer<float>(bt * ff);
    }
    const bool lm = c.kind == ModelConfig::Kind::lm;
    lnf = AlignedBuffer<float>(f32 || !lm ? bt * d : 0);
    lnf_mean = AlignedBuffer<float>(bt);
    lnf_rstd = AlignedBuffer<float>(bt);
    pooled = AlignedBuffer<float>(static_cast<std::size_t>(B) * d);
    logits = AlignedBuffer<float>((lm ? bt : static_cast<std::size_t>(B)) *
                                  static_cast<std::size_t>(c.outputs()));
    d_resid = AlignedBuffer<float>(bt * d);
    d_tmp = AlignedBuffer<float>(bt * d);
    d_branch = AlignedBuffer<float>(c.dropout > 0.0f ? bt * d : 0);
    d_qkv = AlignedBuffer<float>(f32 ? bt * 3 * d : 0);
    d_h = AlignedBuffer<float>(bt * ff);
    d_lnf = AlignedBuffer<float>(bt * d);
    d_pooled = AlignedBuffer<float>(static_cast<std::size_t>(B) * d);
    d_heads = AlignedBuffer<float>(heads);
    d_probs = AlignedBuffer<float>(probs_n);
    dq = AlignedBuffer<float>(heads);
    dk = AlignedBuffer<float>(heads);
    dv = AlignedBuffer<float>(heads);
  }
};

// Mixed precision: the 16-bit activations every matmul reads, and 16-bit
// backward scratch, sized once for [batch, seq] (f32 state stays in Activations).
struct Transformer::HalfActivations {
  using Half = AlignedBuffer<std::uint16_t>;
  struct Layer {
    Half ln1, q, k, v, probs, attn, ln2, h, a;  // h holds gelu' after forward
    AlignedBuffer<float> ln1_mean, ln1_rstd, mid, ln2_mean, ln2_rstd;
  };
  std::vector<Layer> layers;
  Half qkv, heads, lnf;                       // forward scratch (lnf: lm head input)
  AlignedBuffer<float> scores;                // forward scores, backward dP
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
      L.ln1_mean = AlignedBuffer<float>(bt);
      L.ln1_rstd = AlignedBuffer<float>(bt);
      L.mid = AlignedBuffer<float>(bt * d);
      L.ln2_mean = AlignedBuffer<float>(bt);
      L.ln2_rstd = AlignedBuffer<float>(bt);
    }
    qkv = Half(bt * 3 * d);
    heads = Half(bt * d);
    lnf = Half(lm ? bt * d : 0);
    scores = AlignedBuffer<float>(probs_n);
    for (Half* buf : {&d_resid, &d_attn, &dq, &dk, &dv}) *buf = Half(bt * d);
    d_h = Half(bt * ff);
    d_qkv = Half(bt * 3 * d);
    d_scores = Half(probs_n);
    d_logits = Half(lm ? bt * static_cast<std::size_t>(c.vocab_size) : 0);
  }
};

}  // namespace dtrain::nn
