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
