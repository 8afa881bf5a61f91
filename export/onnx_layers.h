// The layers of dtrain's Transformers (nn/*.h) as standard ONNX operators
// (opset 17), each computing what its nn/ counterpart computes in f32. Values
// flow as dtrain's do: the residual stream is [N, d] with N = batch * seq rows
// (row b * seq + t), so every Linear is one Gemm (or its int8 form) on the
// weight exactly as dtrain stores it, [out, in]. Only attention and the
// classifier's pooling look at [batch, seq, ...], through shapes computed
// from the input at run time, so batch and sequence length stay dynamic.
//
// Opset 17 has no RMSNormalization and no tanh form of Gelu: those are
// composed of elementary operators (ReduceMean, Sqrt, Div, Mul; Tanh), as is
// the exact GELU (Erf). The block's pieces are chosen by nn::ModelConfig as
// nn/graph_forward.h chooses them; today's block (LayerNorm, learned
// positions, erf GELU, H key/value heads) gives today's graph.
//
// Each function appends nodes to the GraphBuilder and returns the name of its
// result; weights are initializers named as dtrain names the parameters
// (nn/transformer.h), added beforehand. Value names start with `out`.
#pragma once

#include <cstdint>
#include <string>

#include "export/onnx_graph.h"
#include "nn/transformer.h"

namespace dtrain::exporter {

// Shape values computed once from the graph input and shared by the layers.
struct RuntimeShapes {
  std::string batch_seq;    // int64 [2]: batch, seq
  std::string seq;          // int64 [1]: seq
  std::string rows_by_d;    // int64 [2]: -1, d (back to the residual stream's [N, d])
  std::string by_d;         // int64 [3]: batch, seq, d
  std::string qkv_heads;    // int64 [4]: batch, seq, H + 2 Hkv, head_dim
  std::string head_split;   // int64 [3]: H, Hkv, Hkv (Split of q | k | v)
  std::string axis0;        // int64 [1]: 0 (axes of Slice, Squeeze, Unsqueeze)
  std::string score_scale;  // float scalar 1 / sqrt(head_dim)
  std::string future;       // lm: bool [seq, seq], true where column j > row i (masked); else ""
  std::string neg_inf;      // lm: float scalar -inf
  // Grouped-query attention (Hkv < H), else "":
  std::string kv_repeat;    // int64 [5]: 1, 1, H / Hkv, 1, 1 (Expand of [batch, Hkv, 1, seq, hd])
  std::string by_heads;     // int64 [4]: 0, H, -1, head_dim (Reshape to [batch, H, seq, hd])
  // Rotary positions, else "": the table's first seq rows, [seq, head_dim]
  // each, the half-width table repeated twice (cos_p_i at columns i and i + half).
  std::string rope_cos, rope_sin;
  std::string rope_halves;  // int64 [2]: half, half (Split of a head into its halves)
  // The cached decoder (an lm with past key/values), else "": the new tokens
  // sit at positions past .. past + seq - 1, so the learned or rotary
  // positions are those rows and `future` is [seq, past + seq], true where
  // column j > row i + past.
  std::string past;         // int64 [1]: past_seq, the positions the cache holds
  std::string end;          // int64 [1]: past_seq + seq
};

// One layer's key/value cache in the cached decoder: the graph inputs past_k
// and past_v [batch, Hkv, past_seq, head_dim] and the outputs present_k and
// present_v [batch, Hkv, past_seq + seq, head_dim] (keys after rotation).
struct KvCache {
  std::string past_k, past_v, present_k, present_v;
};

// Adds the RuntimeShapes of `input` (tokens [batch, seq] or patches [batch,
// seq, patch_dim]) for the config's d_model, heads and key/value heads; the
// lm gets the causal mask, rotary positions their tables: initializers
// "rope.cos" and "rope.sin" [max_seq_len, head_dim] from nn::rope_table,
// sliced to seq rows. `past`: for the cached decoder, a past key/value input
// whose dim 2 is past_seq ("" for the plain graph).
RuntimeShapes runtime_shapes(GraphBuilder& g, const std::string& input, const nn::ModelConfig& c,
                             const std::string& past = "");

// The norm config.norm chooses (LayerNorm or RMSNorm, eps config.norm_eps)
// with weight prefix.weight (and LayerNorm's bias prefix.bias).
std::string norm(GraphBuilder& g, const nn::ModelConfig& c, const std::string& x, const std::string& prefix,
                 const std::string& out);

// LayerNorm over the last axis (nn/layernorm.h): LayerNormalization.
std::string layer_norm(GraphBuilder& g, const std::string& x, const std::string& prefix, float eps,
                       const std::string& out);

// RMSNorm over the last axis (nn/rmsnorm.h), y = x / sqrt(mean(x^2) + eps) * w:
// Mul, ReduceMean, Add, Sqrt, Div, Mul.
std::string rms_norm(GraphBuilder& g, const std::string& x, const std::string& prefix, float eps,
                     const std::string& out);

// x [N, in] W^T + b for the Linear `weight` [out, in] and `bias` [out] ("" for
// none): Gemm with transB = 1, or with int8 the dynamic quantized form of
// export/quantize.h.
std::string linear(GraphBuilder& g, const std::string& x, const std::string& weight, const std::string& bias,
                   bool int8, const std::string& out);

// Exact GELU, 0.5 x (1 + erf(x / sqrt(2))) (nn/gelu.h): opset 17 has no Gelu
// operator, so Mul, Erf, Add, Mul, Mul.
std::string gelu(GraphBuilder& g, const std::string& x, const std::string& out);

// GPT-2's GELU, 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))) (nn/gelu_form.h).
std::string gelu_tanh(GraphBuilder& g, const std::string& x, const std::string& out);

// SwiGLU on h [N, 2 d_ff] laid out gate | up (nn/swiglu.h): silu(gate) * up,
// silu(g) = g * sigmoid(g); [N, d_ff].
std::string swiglu(GraphBuilder& g, const std::string& h, std::int64_t d_ff, const std::string& out);

// The MLP's activation config.mlp chooses, on fc1's output.
std::string mlp_activation(GraphBuilder& g, const nn::ModelConfig& c, const std::string& h, const std::string& out);

// Self-attention core of nn/attention.h on qkv [N, (H + 2 Hkv) head_dim]
// laid out q | k | v, each heads x head_dim: q and k rotated when the shapes
// hold rotary tables, each key/value head repeated over its group of H / Hkv
// query heads (query head h reads key/value head h / (H / Hkv)); then S = Q
// K^T / sqrt(head_dim), with the lm's causal mask (columns after the row set
// to -inf, so softmax gives them exactly 0), P = softmax(S) in f32, O = P V;
// returns O as [N, d]. With `cache`, the new keys and values are appended to
// the past ones (Concat along the sequence) as present_k / present_v, and the
// queries attend to all of them.
std::string attention(GraphBuilder& g, const RuntimeShapes& s, const std::string& qkv, const std::string& out,
                      const KvCache* cache = nullptr);

}  // namespace dtrain::exporter
