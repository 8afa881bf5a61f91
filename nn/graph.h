// nn::Graph<K>: both Transformer models (nn/transformer.h), forward and
// backward, written once over a kernel set K: every layer, the block hooks,
// dropout keys, tied embeddings, loss scaling, input staging and the loss
// read-back. A device supplies K (nn/cpu/host_kernels.h: oneDNN and the
// vector code; nn/cuda/cuda_kernels.h: cuBLAS and the .cu kernels), so only
// kernels differ between devices, and K::T (the storage of matmul operands
// and saved activations: float, or std::uint16_t for bf16/f16) is the only
// difference between precisions.
//
// The layer block is composed of its pieces (nn/blocks.h): the norm
// (LayerNorm or RMSNorm), the attention (its QKV projection, learned or
// rotary positions, grouped-query heads, the core and the output
// projection) and the MLP (GELU, GPT-2's tanh GELU or SwiGLU), each a
// forward and a backward over its own saved activations
// (GraphActivations::NormActs, AttentionActs, MlpActs); the graph adds the
// residual stream, dropout and the recompute modes around them.
//
// A kernel set provides, all queued on its device in call order (E, X, Y, D:
// float or K::T; a 16-bit type means K::kCompute):
//   layernorm_forward<E>, layernorm_backward, rmsnorm_forward<E>,
//   rmsnorm_backward, linear_forward<X, Y>, linear_backward<X, D>,
//   attention_forward, attention_backward, qkv_heads_forward,
//   qkv_heads_backward (nn/rotary.h), gelu_forward, gelu_backward,
//   swiglu_forward, swiglu_backward, to_storage (f32 -> T), dropout, residual,
//   token_embedding_{forward,backward}, patch_embedding_{forward,backward},
//   mean_pool_{forward,backward}, cross_entropy_{forward,backward}
// with the argument lists of the CPU functions in nn/ (device pointers);
// optionally attention_cached, which decode() needs (the CPU's has it), and
// attention_project, the QKV projection written straight into attention's
// saved heads (the CPU's has it; without it the projection is a linear into
// the interleaved qkv, which attention_forward gathers from) with its
// backward counterpart attention_output_grad (likewise);
// attention_scratch(pairs, seq, head_dim): what of the attention scratch
// (AttentionScratch, nn/attention.h) the graph allocates for its attention;
// and row_stride(cols, other): the row stride of the d_ff-wide activations
// (h, a, d_h; cols = d_ff, multiplied with d_model-wide ones: other), cols
// where the kernels read them best dense (the CPU pads them where oneDNN's
// sgemm would otherwise copy them for the weight gradients).
//
// The definitions are in graph_forward.h, graph_backward.h and (the
// block's pieces, each forward beside its backward) graph_pieces.h; a device's
// model file includes them and instantiates Graph for its kernel sets.
#pragma once

#include <cstdint>
#include <memory>

#include "nn/attention.h"
#include "nn/blocks.h"
#include "nn/device.h"
#include "nn/gelu_form.h"
#include "nn/graph_buffers.h"
#include "nn/hooks.h"
#include "nn/parameters.h"
#include "nn/rotary.h"
#include "nn/transformer.h"

namespace dtrain::nn {

template <class K>
class Graph final : public Model {
 public:
  using T = typename K::T;

  // Allocates activations, scratch and input staging on `device` for
  // micro-batches of `batch` x `seq_len`. Throws ConfigError naming the
  // field when the shapes do not fit. The device must outlive the graph.
  Graph(Device& device, K kernels, const ModelConfig& config, const ParameterLayout& layout,
        std::int64_t batch, std::int64_t seq_len);

  void bind(const BlockPointers& pointers) override;
  void forward(const ModelInputs& inputs, BlockHooks& hooks, bool training, const StepKey& key) override;
  void backward(BlockHooks& hooks, float grad_scale) override;
  void infer(const ModelInputs& inputs, BlockHooks& hooks, float* logits) override;
  void decode(const std::int32_t* tokens, std::int64_t n, std::int64_t position, float* logits) override;
  void reset_result() override;
  ForwardResult collect() override;
  std::int64_t activation_bytes() const override { return acts_.bytes() + inputs_.bytes(); }

 private:
  // Dropout sites: 2l (attention branch of layer l), 2l+1 (MLP branch), and this.
  static constexpr std::int64_t kEmbedDropoutSite = 1 << 20;
  static constexpr bool kF32 = std::is_same_v<T, float>;
  using Layer = typename GraphActivations<T>::Layer;
  using Recompute = ModelConfig::Recompute;

  // The rows a pass covers: span_.batch sequences of span_.seq tokens, the
  // first at position span_.position (training and infer: the whole
  // micro-batch from 0; decode: one sequence's new tokens).
  struct Span {
    std::int64_t batch = 0, seq = 0, position = 0;
  };
  bool lm() const { return config().kind == ModelConfig::Kind::lm; }
  std::int64_t rows() const { return lm() ? tokens() : span_.batch; }
  std::int64_t tokens() const { return span_.batch * span_.seq; }
  void set_span(Span span);
  std::uint64_t key_for(std::int64_t site) const;
  // Checks the inputs on the host and queues their copy to the device
  // (targets only when `with_targets`).
  void stage(const ModelInputs& inputs, bool with_targets);
  // The blocks from the embeddings to the logits.
  void forward_blocks(BlockHooks& hooks, bool training, float* host_logits);
  float* param(int index, bool grad) const;
  // Parameter `rel` of the block whose first parameter is `base`; null where
  // the piece has none there (rel < 0: no bias, say).
  float* param_at(int base, int rel, bool grad) const { return rel < 0 ? nullptr : param(base + rel, grad); }
  // A matrix as the matmuls read it: the 16-bit compute copy, or the f32 parameter.
  const T* matrix(int index) const;
  // The current version of parameter `index`'s block
  // (BlockPointers::weights_version); 0 when unknown or decoding (matmuls
  // then read the weights as stored).
  std::uint64_t weights_version(int index) const;
  // `x` in storage T: x itself when T is f32, else rounded into `buffer`.
  const T* as_storage(const float* x, T* buffer, std::int64_t n);

  void embed_forward(bool training);
  // A layer block: the pieces in order, the residual stream around them.
  void layer_forward(int l, bool training);
  void layer_backward(int l);
  // The norm piece: y = norm(x) (LayerNorm or RMSNorm, model.norm); its
  // backward adds dL/dx into dx (or writes it) and the weights' gradients.
  template <class E>
  void norm_forward(int base, NormParams p, const float* x, E* y, float* mean, float* rstd, float* x_copy);
  void norm_backward(int base, NormParams p, const float* dy, const float* x, const float* mean, const float* rstd,
                     float* dx, bool accumulate_dx, float* dx_sums);
  // The attention piece up to its output projection: L.norm1.y -> L.attn.out
  // (the projection is the residual branch after it); backward from the
  // branch's gradient through the output projection, the core, the heads
  // and the QKV projection into d_tmp (dL/d norm1.y).
  void attention_forward(int l, int base, Layer& L);
  void attention_backward(int base, Layer& L, const float* g_attn);
  // Rotary positions or grouped-query heads: the projection's output goes
  // through qkv_heads_forward (nn/rotary.h) before the core.
  bool reshapes_heads() const;
  HeadsShape heads_shape() const;
  // The MLP piece up to its down projection: L.norm2.y -> the activation
  // fc2 reads (GraphActivations::mlp_out); backward from the branch's
  // gradient through fc2, the activation and fc1 into d_tmp.
  void mlp_forward(int base, Layer& L, bool training);
  void mlp_backward(int base, Layer& L, const float* g_mlp);
  // The head: with host_logits, each tile's logits are copied there (infer,
  // decode); without, each tile's loss adds to the totals (forward).
  void head_forward(float* host_logits);
  // lm: logits of rows [first, first + count) into acts_.logits.
  void head_logits(std::int64_t first, std::int64_t count);
  // The head block's parameter after its final norm's (head.weight / cls.weight, then cls.bias).
  int head_param(int k) const;
  // out = base + drop(x W^T + b) over [n, d], f32. Without dropout, out
  // already holds base (residual_copy: the norm that read base wrote it)
  // and the GEMM adds into it. x's rows are x_stride apart (0: in).
  void residual_branch(const T* x, int weight, const float* bias, const float* base, float* out, std::int64_t in,
                       std::int64_t site, std::int64_t x_stride = 0);
  // Where the norm reading the residual stream copies it: the next
  // residual add's output, or nowhere when dropout adds the branch itself.
  float* residual_copy(float* out) const { return dropout_active_ ? nullptr : out; }
  // Where the norm backward that leaves d_resid sums its columns in the
  // same pass: the bias gradient of the branch that reads d_resid next (fc2,
  // then proj), or nowhere when dropout gives that branch a gradient of its
  // own, the branches have no biases, or the norm (RMSNorm) does not sum.
  float* resid_sums();
  // A branch's bias gradient (p.bias of the block at base): from
  // resid_sums() when there, else (returned) summed by linear_backward;
  // null when the branch has no bias.
  float* branch_bias_grad(int base, LinearParams p);
  // bias_grad += resid_sums() and null when the sums are there, else bias_grad (for linear_backward to sum).
  float* bias_grad_unless_summed(float* bias_grad);
  void head_backward(float grad_scale);
  void embed_backward();
  // A branch output's gradient: d_resid, dropped with forward's mask at `site`.
  const float* branch_grad(std::int64_t site);

  Device& device_;
  K k_;
  const ParameterLayout& layout_;
  Span span_;
  AttentionShape attn_shape_;
  bool decoding_ = false;
  DeviceArray<T> k_cache_, v_cache_;  // decode: [n_layers][kv_heads][max_seq_len][head_dim]
  DeviceArray<float> cache_scores_;   // decode: one row of scores over the cache
  LayerParams lp_;          // a layer block's pieces' parameters (counted from the block's first)
  NormParams final_norm_;   // the head block's final norm's
  DeviceArray<float> rope_cos_, rope_sin_;  // rope: [max_seq_len, head_dim / 2]
  bool rope_filled_ = false;
  BlockPointers ptrs_;
  StepKey key_{};
  bool dropout_active_ = false;
  std::int64_t scored_ = 0;  // rows scored since reset_result()
  GraphActivations<T> acts_;
  GraphInputs inputs_;
};

}  // namespace dtrain::nn
