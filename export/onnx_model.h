// dtrain's models as ONNX (opset 17, standard operators only), built with
// Debian's ONNX library and checked by its checker and strict shape inference
// before anyone writes them (docs/deploy.md).
//
//   lm          tokens   int64 [batch, seq]                 -> logits float [batch, seq, vocab]
//   classifier  tokens   int64 [batch, seq]                 -> logits float [batch, classes]
//               patches  float [batch, n_patches, patch_dim] -> logits float [batch, classes]
//
// The cached decoder of an lm (OnnxOptions::with_past), as optimum exports
// one, reads and writes each layer l's key/value cache beside them:
//
//   inputs   past_key_values.<l>.key / .value  float [batch, n_kv_heads, past_seq, head_dim]
//   outputs  present.<l>.key / .value          float [batch, n_kv_heads, past_seq + seq, head_dim]
//
// The new tokens are positions past_seq .. past_seq + seq - 1 (learned or
// rotary positions from row past_seq, keys cached after rotation) and attend
// to every cached position and to the new ones up to their own. The prompt
// runs once with past_seq = 0 (empty past tensors); each next token runs alone
// with the previous run's present as its past. past_seq + seq <= max_seq_len.
//
// batch and the sequence length are dynamic (the sequence up to
// model.max_seq_len: positions are the first seq rows of pos_emb, or of the
// rotary tables rope.cos and rope.sin). The graph computes what
// nn::Model::infer computes for the config's block (export/onnx_layers.h),
// with the parameters under dtrain's own names. With int8, every Linear
// (qkv, proj, fc1, fc2, the lm head, the classifier head) is dynamically
// quantized (export/quantize.h); embeddings, norms, the rotary tables and
// softmax stay f32.
//
// Export is two steps, so that the parameters stream from the checkpoint to
// the file one block at a time and the model is never whole in memory:
// build_onnx_graph makes and checks the graph, its parameter initializers
// declared (name, type, dims) with no data yet; write_onnx_model
// (export/onnx_writer.h) then serializes it with the data filled in block by
// block. Any thread; no shared state.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <onnx/onnx_pb.h>

#include "nn/parameters.h"
#include "nn/transformer.h"

namespace dtrain::exporter {

inline constexpr std::int64_t kOnnxOpset = 17;
inline constexpr const char* kTokensInput = "tokens";
inline constexpr const char* kPatchesInput = "patches";
inline constexpr const char* kLogitsOutput = "logits";

// The cached decoder's names of layer l's cache: "past_key_values.<l>.key",
// "present.<l>.value", ... (`what` is "key" or "value").
std::string past_name(int layer, const char* what);
std::string present_name(int layer, const char* what);

// Fills `out` (exactly block `block`'s numel) with that block's flat f32
// parameters, in the layout's order. Throws dtrain::Error on failure.
using BlockReader = std::function<void(int block, std::span<float> out)>;

struct OnnxOptions {
  bool int8 = false;
  std::string doc;  // the model's doc_string: where it came from
  // Extra metadata_props (key, value), after dtrain's own ("dtrain.kind", ...).
  std::vector<std::pair<std::string, std::string>> metadata;
  // An lm only: the cached decoder form (above) instead of the plain graph.
  bool with_past = false;
};

// One parameter as the graph holds it: f32 under its own name, or an int8
// Linear weight as NAME_quantized (int8 [in, out]) and NAME_scale (float
// [out]) (export/quantize.h). The tied lm head under int8 adds an int8 entry
// for tok_emb beside its f32 one.
struct ParameterTensor {
  int param = 0;  // index in ParameterLayout::params()
  bool int8 = false;
};

// The parameter tensors of the graph, in block order (a block's in layout order).
std::vector<ParameterTensor> parameter_tensors(const nn::ModelConfig& config, const nn::ParameterLayout& layout,
                                               bool int8);

// The graph of `config`, its parameter initializers declared without data
// (write_onnx_model streams it in) and the value_info shape inference
// found. It is checked (check_onnx) in the form it has once filled: the same
// graph with each parameter a typed input instead. Throws ConfigError for a config the export cannot express and Error
// when the graph fails ONNX's checks (a bug of the exporter; the message has
// ONNX's text).
onnx::ModelProto build_onnx_graph(const nn::ModelConfig& config, const nn::ParameterLayout& layout,
                                  const OnnxOptions& options);

// ONNX's checker, then shape inference in strict mode (types checked, node
// errors thrown, data propagation on), which adds the inferred value_info to
// the graph. Throws Error with ONNX's own message.
void check_onnx(onnx::ModelProto& model);

// The graph's input name for this config.
const char* input_name(const nn::ModelConfig& config);

}  // namespace dtrain::exporter
