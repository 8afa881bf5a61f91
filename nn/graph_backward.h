// nn::Graph::backward (nn/graph.h): the blocks in reverse, each layer's
// backward undoing graph_forward.h's forward. d_resid carries dL/d(residual
// stream) from block to block and is updated in place. Included by the files
// that instantiate Graph for a device.
#pragma once

#include "nn/graph.h"

namespace dtrain::nn {

template <class K>
void Graph<K>::backward(BlockHooks& hooks, float grad_scale) {
  const int head_block = layout_.num_blocks() - 1;
  hooks.before_backward(head_block);
  head_backward(grad_scale);
  hooks.after_backward(head_block);
  for (int l = static_cast<int>(config().n_layers) - 1; l >= 0; --l) {
    hooks.before_backward(l + 1);
    layer_backward(l);
    hooks.after_backward(l + 1);
  }
  hooks.before_backward(0);
  embed_backward();
  hooks.after_backward(0);
}

// lm: tile by tile as forward (head_forward), last tile first: forward left
// that tile's probabilities in the buffer, every other tile's are recomputed;
// the head's weight gradient adds up over the tiles.
template <class K>
void Graph<K>::head_backward(float grad_scale) {
  const int base = layout_.blocks().back().first_param;
  const std::int64_t n = tokens(), d = config().d_model, v = config().outputs();
  const float scale = grad_scale / static_cast<float>(rows());
  float* dlogits = acts_.logits.data();  // holds the softmax after forward
  if (lm()) {
    const bool tied = config().tie_embeddings;
    const std::int64_t last = (n - 1) / acts_.logits_rows * acts_.logits_rows;
    for (std::int64_t first = last; first >= 0; first -= acts_.logits_rows) {
      const std::int64_t count = std::min(acts_.logits_rows, n - first);
      if (first != last) {
        head_logits(first, count);
        k_.cross_entropy_forward(dlogits, inputs_.targets.data() + first, dlogits, count, v, nullptr);
      }
      k_.cross_entropy_backward(dlogits, inputs_.targets.data() + first, count, v, scale);
      const T* dlogits_t = as_storage(dlogits, acts_.d_logits16.data(), count * v);
      const int weight = tied ? 0 : head_param(0);
      k_.linear_backward(dlogits_t, dlogits, acts_.lnf.data() + first * d, matrix(weight),
                         acts_.d_lnf.data() + first * d, param(weight, true), nullptr, count, d, v,
                         weights_version(weight));
    }
  } else {
    k_.cross_entropy_backward(dlogits, inputs_.targets.data(), rows(), v, scale);
    k_.linear_backward(static_cast<const float*>(dlogits), dlogits, acts_.pooled.data(),
                       param(head_param(0), false), acts_.d_pooled.data(), param(head_param(0), true),
                       param(head_param(1), true), batch(), d, config().num_classes, weights_version(head_param(0)));
    k_.mean_pool_backward(acts_.d_pooled.data(), acts_.d_lnf.data(), batch(), seq_len(), d);
  }
  norm_backward(base, final_norm_, acts_.d_lnf.data(), acts_.resid.back().data(), acts_.lnf_mean.data(),
                acts_.lnf_rstd.data(), acts_.d_resid.data(), false, config().n_layers > 0 ? resid_sums() : nullptr);
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

template <class K>
float* Graph<K>::resid_sums() {
  const ModelConfig& c = config();
  if (dropout_active_ || !c.bias || c.norm != ModelConfig::Norm::layernorm) return nullptr;
  return acts_.d_resid_sums.data();
}

template <class K>
float* Graph<K>::branch_bias_grad(int base, LinearParams p) {
  return p.bias < 0 ? nullptr : bias_grad_unless_summed(param(base + p.bias, true));
}

template <class K>
float* Graph<K>::bias_grad_unless_summed(float* bias_grad) {
  const float* sums = resid_sums();
  if (sums == nullptr) return bias_grad;
  k_.residual(bias_grad, sums, bias_grad, config().d_model);  // bias_grad += sums
  return nullptr;
}

template <class K>
const float* Graph<K>::branch_grad(std::int64_t site) {
  if (!dropout_active_) return acts_.d_resid.data();
  const std::int64_t nd = tokens() * config().d_model;
  float* db = acts_.d_branch.data();
  device_.copy(db, acts_.d_resid.data(), static_cast<std::size_t>(nd) * sizeof(float));
  k_.dropout(db, nd, config().dropout, key_for(site));
  return db;
}

// Each branch's output gradient goes to the bias in f32 and, in storage T, to
// the matmuls; parameter gradients are f32. Under full recompute the layer's
// forward runs again first (the same kernels, inputs and dropout keys: the
// same activations, bit for bit).
template <class K>
void Graph<K>::layer_backward(int l) {
  if (config().recompute == Recompute::full) layer_forward(l, true);
  Layer& L = acts_.layer(l);
  const int base = layout_.blocks()[static_cast<std::size_t>(l + 1)].first_param;
  const float* x = acts_.resid[static_cast<std::size_t>(l)].data();
  float* d_resid = acts_.d_resid.data();
  float* d_tmp = acts_.d_tmp.data();

  // MLP branch: x_out = mid + fc2(act(fc1(norm2(mid)))).
  mlp_backward(base, L, branch_grad(2 * l + 1));
  norm_backward(base, lp_.norm2, d_tmp, L.mid.data(), L.norm2.mean.data(), L.norm2.rstd.data(), d_resid, true,
                resid_sums());
  // Attention branch: mid = x + proj(attn(qkv(norm1(x)))).
  attention_backward(base, L, branch_grad(2 * l));
  norm_backward(base, lp_.norm1, d_tmp, x, L.norm1.mean.data(), L.norm1.rstd.data(), d_resid, true,
                l > 0 ? resid_sums() : nullptr);
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

template <class K>
void Graph<K>::embed_backward() {
  const ModelConfig& c = config();
  float* d_out = acts_.d_resid.data();
  if (dropout_active_) k_.dropout(d_out, tokens() * c.d_model, c.dropout, key_for(kEmbedDropoutSite));
  if (c.input == ModelConfig::Input::tokens) {
    float* d_pos = c.position == ModelConfig::Position::learned ? param(1, true) : nullptr;
    k_.token_embedding_backward(inputs_.tokens.data(), d_out, param(0, true), d_pos, batch(), seq_len(), c.d_model);
  } else {
    k_.patch_embedding_backward(inputs_.patches.data(), d_out, param(0, true), param(1, true), param(2, true),
                                batch(), seq_len(), c.d_model, c.patch_dim);
  }
}

}  // namespace dtrain::nn
