// The pieces of nn::Graph's layer block (nn/graph.h, nn/blocks.h), each
// one unit: its forward and, beside it, its backward, over its own saved
// activations. The norm (LayerNorm or RMSNorm), the attention (the QKV
// projection, rotary positions and grouped heads, the core, the output
// projection's input gradient) and the MLP (GELU, its tanh form or SwiGLU);
// layer_forward and layer_backward (graph_forward.h, graph_backward.h)
// compose them with the residual stream and dropout. Included by
// graph_forward.h.
#pragma once

#include "nn/graph.h"
#include "nn/rotary.h"

namespace dtrain::nn {

// ---- The norm

template <class K>
template <class E>
void Graph<K>::norm_forward(int base, NormParams p, const float* x, E* y, float* mean, float* rstd, float* x_copy) {
  const ModelConfig& c = config();
  const float* w = param(base + p.weight, false);
  if (c.norm == ModelConfig::Norm::rmsnorm) {
    k_.rmsnorm_forward(x, w, y, rstd, tokens(), c.d_model, c.norm_eps, x_copy);
  } else {
    k_.layernorm_forward(x, w, param_at(base, p.bias, false), y, mean, rstd, tokens(), c.d_model, x_copy,
                         c.norm_eps);
  }
}

template <class K>
void Graph<K>::norm_backward(int base, NormParams p, const float* dy, const float* x, const float* mean,
                             const float* rstd, float* dx, bool accumulate_dx, float* dx_sums) {
  const ModelConfig& c = config();
  const float* w = param(base + p.weight, false);
  float* dw = param(base + p.weight, true);
  if (c.norm == ModelConfig::Norm::rmsnorm) {
    DTRAIN_CHECK(dx_sums == nullptr, "RMSNorm's backward does not sum its columns");
    k_.rmsnorm_backward(dy, x, w, rstd, dx, dw, tokens(), c.d_model, accumulate_dx);
  } else {
    k_.layernorm_backward(dy, x, w, mean, rstd, dx, dw, param_at(base, p.bias, true), tokens(), c.d_model,
                          accumulate_dx, dx_sums);
  }
}

// ---- The attention

template <class K>
bool Graph<K>::reshapes_heads() const {
  return config().position == ModelConfig::Position::rope || config().kv_heads() != config().n_heads;
}

template <class K>
HeadsShape Graph<K>::heads_shape() const {
  const ModelConfig& c = config();
  return HeadsShape{span_.batch, span_.seq, c.n_heads, c.kv_heads(), c.head_dim(), span_.position};
}

// The projection writes straight into the heads the core reads where the
// kernel set can (attention_project) and nothing sits between them;
// otherwise into the interleaved qkv, through qkv_heads_forward first
// (rotary positions, grouped heads: the packed projection goes to d_qkv,
// which forward does not use).
template <class K>
void Graph<K>::attention_forward(int l, int base, Layer& L) {
  const ModelConfig& c = config();
  const std::int64_t n = tokens(), d = c.d_model;
  const int weight = base + lp_.qkv.weight;
  const float* bias = param_at(base, lp_.qkv.bias, false);
  const AttentionSaved<T> saved{L.attn.q.data(), L.attn.k.data(), L.attn.v.data(), L.attn.lse.data()};
  const bool reshape = reshapes_heads();
  const T* qkv = acts_.qkv.data();
  if constexpr (requires { &K::attention_project; }) {
    if (!decoding_ && !reshape) {
      k_.attention_project(attn_shape_, L.norm1.y.data(), matrix(weight), bias, weights_version(weight), saved);
      qkv = nullptr;
    }
  }
  if (qkv != nullptr) {
    T* packed = reshape ? acts_.d_qkv.data() : acts_.qkv.data();
    k_.linear_forward(L.norm1.y.data(), matrix(weight), bias, packed, n, d, c.qkv_width(), false,
                      weights_version(weight));
    if (reshape) k_.qkv_heads_forward(heads_shape(), packed, acts_.qkv.data(), rope_cos_.data(), rope_sin_.data());
  }
  if constexpr (requires { &K::attention_cached; }) {
    if (decoding_) {
      const std::int64_t capacity = c.max_seq_len;
      const std::int64_t layer = static_cast<std::int64_t>(l) * capacity * c.kv_heads() * c.head_dim();
      k_.attention_cached(attn_shape_, span_.position, capacity, qkv, k_cache_.data() + layer,
                          v_cache_.data() + layer, L.attn.out.data(), cache_scores_.data());
    }
  }
  if (!decoding_) k_.attention_forward(attn_shape_, qkv, L.attn.out.data(), saved, acts_.attention_scratch());
}

// With rotary positions or grouped heads, the core's gradient d_qkv goes
// back through qkv_heads_backward into the packed layout (in acts_.qkv,
// which backward does not use otherwise), summing the bias gradient there;
// else the core sums it while it scatters d_qkv.
template <class K>
void Graph<K>::attention_backward(int base, Layer& L, const float* g_attn) {
  const ModelConfig& c = config();
  const std::int64_t n = tokens(), d = c.d_model;
  const int proj = base + lp_.proj.weight, qkv = base + lp_.qkv.weight;
  const T* dy_attn = as_storage(g_attn, acts_.d_resid16.data(), n * d);
  const AttentionSaved<T> saved{L.attn.q.data(), L.attn.k.data(), L.attn.v.data(), L.attn.lse.data()};
  const bool reshape = reshapes_heads();
  float* qkv_bias = param_at(base, lp_.qkv.bias, true);
  float* core_bias = reshape ? nullptr : qkv_bias;
  if constexpr (requires { &K::attention_output_grad; }) {  // dO straight into the heads' layout
    k_.attention_output_grad(attn_shape_, dy_attn, matrix(proj), weights_version(proj), acts_.d_attn.data());
    k_.linear_backward(dy_attn, g_attn, L.attn.out.data(), matrix(proj), static_cast<T*>(nullptr), param(proj, true),
                       branch_bias_grad(base, lp_.proj), n, d, d);
    k_.attention_backward(attn_shape_, static_cast<const T*>(nullptr), acts_.d_qkv.data(), saved,
                          acts_.attention_scratch(), core_bias, acts_.d_attn.data());
  } else {
    k_.linear_backward(dy_attn, g_attn, L.attn.out.data(), matrix(proj), acts_.d_attn.data(), param(proj, true),
                       branch_bias_grad(base, lp_.proj), n, d, d, weights_version(proj));
    k_.attention_backward(attn_shape_, acts_.d_attn.data(), acts_.d_qkv.data(), saved, acts_.attention_scratch(),
                          core_bias);
  }
  const T* d_packed = acts_.d_qkv.data();
  if (reshape) {
    k_.qkv_heads_backward(heads_shape(), acts_.d_qkv.data(), acts_.qkv.data(), rope_cos_.data(), rope_sin_.data(),
                          qkv_bias);
    d_packed = acts_.qkv.data();
  }
  k_.linear_backward(d_packed, static_cast<const float*>(nullptr), L.norm1.y.data(), matrix(qkv), acts_.d_tmp.data(),
                     param(qkv, true), nullptr, n, d, c.qkv_width(), weights_version(qkv));
}

// ---- The MLP

// GELU overwrites h with gelu'(h) when training (backward needs only the
// derivative), unless selective recompute keeps h to compute the activation
// again in backward. Rows h_stride apart: the padding columns, which
// nothing reads, go through GELU too (zeros at first, then GELU's finite
// outputs).
template <class K>
void Graph<K>::mlp_forward(int base, Layer& L, bool training) {
  const ModelConfig& c = config();
  const std::int64_t n = tokens(), hs = acts_.strides.h;
  const int weight = base + lp_.fc1.weight;
  T* h = L.mlp.h.data();
  T* a = acts_.mlp_out(L);
  k_.linear_forward(L.norm2.y.data(), matrix(weight), param_at(base, lp_.fc1.bias, false), h, n, c.d_model,
                    c.fc1_width(), false, weights_version(weight), LinearRows{.out = hs});
  if (c.mlp == ModelConfig::Mlp::swiglu) {
    k_.swiglu_forward(h, a, n, c.d_ff, hs, acts_.strides.a);
    return;
  }
  const bool keep_h = c.recompute == Recompute::selective;
  k_.gelu_forward(h, a, training && !keep_h ? h : nullptr, n * hs,
                  c.mlp == ModelConfig::Mlp::gelu_tanh ? GeluForm::tanh : GeluForm::erf);
}

// Selective recompute computes the activation again from h (kept as fc1
// left it) before fc2's weight gradient reads it; GELU then leaves gelu'(h)
// in h as forward does without recompute.
template <class K>
void Graph<K>::mlp_backward(int base, Layer& L, const float* g_mlp) {
  const ModelConfig& c = config();
  const std::int64_t n = tokens(), d = c.d_model, ff = c.d_ff, hs = acts_.strides.h, as = acts_.strides.a;
  const bool swiglu = c.mlp == ModelConfig::Mlp::swiglu;
  T* h = L.mlp.h.data();
  T* a = acts_.mlp_out(L);
  if (c.recompute == Recompute::selective) {
    if (swiglu) {
      k_.swiglu_forward(h, a, n, ff, hs, as);
    } else {
      k_.gelu_forward(h, a, h, n * hs, c.mlp == ModelConfig::Mlp::gelu_tanh ? GeluForm::tanh : GeluForm::erf);
    }
  }
  const int fc2 = base + lp_.fc2.weight, fc1 = base + lp_.fc1.weight;
  T* d_a = swiglu ? acts_.d_a.data() : acts_.d_h.data();
  k_.linear_backward(as_storage(g_mlp, acts_.d_resid16.data(), n * d), g_mlp, static_cast<const T*>(a), matrix(fc2),
                     d_a, param(fc2, true), branch_bias_grad(base, lp_.fc2), n, ff, d, weights_version(fc2),
                     LinearRows{.in = as});
  // fc1's bias gradient is summed in the same pass.
  float* fc1_bias = param_at(base, lp_.fc1.bias, true);
  if (swiglu) {
    k_.swiglu_backward(d_a, h, acts_.d_h.data(), fc1_bias, n, ff, as, hs);
  } else {
    k_.gelu_backward(acts_.d_h.data(), h, acts_.d_h.data(), fc1_bias, n, ff, hs);  // h holds gelu'
  }
  k_.linear_backward(acts_.d_h.data(), static_cast<const float*>(nullptr), L.norm2.y.data(), matrix(fc1),
                     acts_.d_tmp.data(), param(fc1, true), nullptr, n, d, c.fc1_width(), weights_version(fc1),
                     LinearRows{.out = hs});
}

}  // namespace dtrain::nn
