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

  Activations(const ModelConfig& c, std::int64_t B, std::int64_t T) {
    const auto bt = static_cast<std::size_t>(B * T);
    const auto d = static_cast<std::size_t>(c.d_model);
    const auto ff = static_cast<std::size_t>(c.d_ff);
    const auto heads = bt * d;
    const auto probs_n = static_cast<std::size_t>(B * c.n_heads * T * T);
    for (std::int64_t l = 0; l <= c.n_layers; ++l) resid.emplace_back(bt * d);
    layers.resize(static_cast<std::size_t>(c.n_layers));
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
    lnf = AlignedBuffer<float>(bt * d);
    lnf_mean = AlignedBuffer<float>(bt);
    lnf_rstd = AlignedBuffer<float>(bt);
    pooled = AlignedBuffer<float>(static_cast<std::size_t>(B) * d);
    logits = AlignedBuffer<float>((lm ? bt : static_cast<std::size_t>(B)) *
                                  static_cast<std::size_t>(c.outputs()));
    d_resid = AlignedBuffer<float>(bt * d);
    d_tmp = AlignedBuffer<float>(bt * d);
    d_branch = AlignedBuffer<float>(c.dropout > 0.0f ? bt * d : 0);
    d_qkv = AlignedBuffer<float>(bt * 3 * d);
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

}  // namespace dtrain::nn
