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
  float* ln_grad = param(base, true);
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
      k_.linear_backward(dlogits_t, dlogits, acts_.lnf.data() + first * d, tied ? matrix(0) : matrix(base + 2),
                         acts_.d_lnf.data() + first * d, tied ? param(0, true) : param(base + 2, true), nullptr,
                         count, d, v, weights_version(tied ? 0 : base + 2));
    }
  } else {
    k_.cross_entropy_backward(dlogits, inputs_.targets.data(), rows(), v, scale);
    k_.linear_backward(static_cast<const float*>(dlogits), dlogits, acts_.pooled.data(), param(base + 2, false),
                       acts_.d_pooled.data(), param(base + 2, true), param(base + 3, true), batch(), d,
                       config().num_classes, weights_version(base + 2));
    k_.mean_pool_backward(acts_.d_pooled.data(), acts_.d_lnf.data(), batch(), seq_len(), d);
  }
  k_.layernorm_backward(acts_.d_lnf.data(), acts_.resid.back().data(), param(base, false), acts_.lnf_mean.data(),
                        acts_.lnf_rstd.data(), acts_.d_resid.data(), ln_grad, param(base + 1, true), n, d, false,
                        config().n_layers > 0 ? resid_sums() : nullptr);
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
// the matmuls; parameter gradients are f32.
template <class K>
void Graph<K>::layer_backward(int l) {
  Layer& L = acts_.layers[static_cast<std::size_t>(l)];
  const int base = layout_.blocks()[static_cast<std::size_t>(l + 1)].first_param;
  auto w = [&](int i) { return param(base + i, false); };
  auto g = [&](int i) { return param(base + i, true); };
  const std::int64_t n = tokens(), d = config().d_model, ff = config().d_ff, ffs = acts_.ff_stride;
  const float* x = acts_.resid[static_cast<std::size_t>(l)].data();
  float* d_resid = acts_.d_resid.data();
  float* d_tmp = acts_.d_tmp.data();

  // MLP branch: x_out = mid + fc2(gelu(fc1(ln2(mid)))).
  const float* g_mlp = branch_grad(2 * l + 1);
  k_.linear_backward(as_storage(g_mlp, acts_.d_resid16.data(), n * d), g_mlp, L.a.data(), matrix(base + kFc2W),
                     acts_.d_h.data(), g(kFc2W), bias_grad_unless_summed(g(kFc2B)), n, ff, d,
                     weights_version(base + kFc2W), LinearRows{.in = ffs});
  // L.h holds gelu'; fc1's bias gradient is summed in the same pass.
  k_.gelu_backward(acts_.d_h.data(), L.h.data(), acts_.d_h.data(), g(kFc1B), n, ff, ffs);
  k_.linear_backward(acts_.d_h.data(), static_cast<const float*>(nullptr), L.ln2.data(), matrix(base + kFc1W),
                     d_tmp, g(kFc1W), nullptr, n, d, ff, weights_version(base + kFc1W), LinearRows{.out = ffs});
  k_.layernorm_backward(d_tmp, L.mid.data(), w(kLn2W), L.ln2_mean.data(), L.ln2_rstd.data(), d_resid, g(kLn2W),
                        g(kLn2B), n, d, true, resid_sums());

  // Attention branch: mid = x + proj(attn(qkv(ln1(x)))).
  const float* g_attn = branch_grad(2 * l);
  const T* dy_attn = as_storage(g_attn, acts_.d_resid16.data(), n * d);
  const AttentionSaved<T> saved{L.q.data(), L.k.data(), L.v.data(), L.lse.data()};
  // qkv's bias gradient is summed as attention scatters d_qkv.
  if constexpr (requires { &K::attention_output_grad; }) {  // dO straight into the heads' layout
    k_.attention_output_grad(attn_shape_, dy_attn, matrix(base + kProjW), weights_version(base + kProjW),
                             acts_.d_attn.data());
    k_.linear_backward(dy_attn, g_attn, L.attn.data(), matrix(base + kProjW), static_cast<T*>(nullptr), g(kProjW),
                       bias_grad_unless_summed(g(kProjB)), n, d, d);
    k_.attention_backward(attn_shape_, static_cast<const T*>(nullptr), acts_.d_qkv.data(), saved,
                          acts_.attention_scratch(), g(kQkvB), acts_.d_attn.data());
  } else {
    k_.linear_backward(dy_attn, g_attn, L.attn.data(), matrix(base + kProjW), acts_.d_attn.data(), g(kProjW),
                       bias_grad_unless_summed(g(kProjB)), n, d, d, weights_version(base + kProjW));
    k_.attention_backward(attn_shape_, acts_.d_attn.data(), acts_.d_qkv.data(), saved, acts_.attention_scratch(),
                          g(kQkvB));
  }
  k_.linear_backward(acts_.d_qkv.data(), static_cast<const float*>(nullptr), L.ln1.data(), matrix(base + kQkvW),
                     d_tmp, g(kQkvW), nullptr, n, d, 3 * d, weights_version(base + kQkvW));
  k_.layernorm_backward(d_tmp, x, w(kLn1W), L.ln1_mean.data(), L.ln1_rstd.data(), d_resid, g(kLn1W), g(kLn1B), n,
                        d, true, l > 0 ? resid_sums() : nullptr);
}

template <class K>
void Graph<K>::embed_backward() {
  const ModelConfig& c = config();
  float* d_out = acts_.d_resid.data();
  if (dropout_active_) k_.dropout(d_out, tokens() * c.d_model, c.dropout, key_for(kEmbedDropoutSite));
  if (c.input == ModelConfig::Input::tokens) {
    k_.token_embedding_backward(inputs_.tokens.data(), d_out, param(0, true), param(1, true), batch(), seq_len(),
                                c.d_model);
  } else {
    k_.patch_embedding_backward(inputs_.patches.data(), d_out, param(0, true), param(1, true), param(2, true),
                                batch(), seq_len(), c.d_model, c.patch_dim);
  }
}

}  // namespace dtrain::nn
