// The Transformer models of dtrain: `classifier` (embeddings -> pre-norm
// encoder -> final norm -> mean pool -> linear) and `lm` (decoder-only causal
// LM: embeddings -> pre-norm causal blocks -> final norm -> linear over the
// vocabulary, optionally tied to the token embedding).
//
// The block is composed of pieces the config chooses (ModelConfig: norm,
// position, mlp, n_kv_heads, bias): today's GPT-2-like block (LayerNorm,
// learned positions, GELU, biases) by default, the LLaMA family's (RMSNorm,
// rotary positions, SwiGLU, grouped-query attention, no biases) by options.
// Each piece declares its own parameters (nn/blocks.h), so a block's
// parameters follow from its pieces, grouped into blocks:
//   block 0            "embeddings": tok_emb [V, d] (or patch.weight [d, p], patch.bias [d]),
//                                    pos_emb [max_seq, d] (learned positions only)
//   block 1 + l        "layer.l":    ln1.{weight, bias}, qkv.{weight [(H + 2 Hkv) hd, d], bias},
//                                    proj.{weight [d, d], bias}, ln2.{weight, bias},
//                                    fc1.{weight [ff or 2 ff (swiglu: gate, then up), d], bias},
//                                    fc2.{weight [d, ff], bias}
//                                    (norm biases: layernorm only; linear biases: model.bias only)
//   block n_layers + 1 "head":       lnf.{weight, bias}, then head.weight [V, d] (lm, untied) or
//                                    cls.weight [C, d], cls.bias [C] (classifier)
// A model owns activations (allocated once for its micro-batch shape, on its
// device), never parameters: bind() hands it one flat pointer per block (and,
// in mixed precision, one pointer per block to its 16-bit compute copy). One
// graph (nn/graph.h) implements both models for every device and precision;
// Device::make_model builds it on a device's kernels. One thread drives a
// model; forward and backward call the BlockHooks around every block.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/dtype.h"
#include "nn/attention_tile.h"
#include "nn/device.h"
#include "nn/hooks.h"
#include "nn/parameters.h"

namespace dtrain::nn {

struct ModelConfig {
  enum class Kind : std::uint8_t { classifier, lm };
  enum class Input : std::uint8_t { tokens, patches };
  Kind kind = Kind::lm;
  Input input = Input::tokens;
  std::int64_t vocab_size = 256;
  std::int64_t d_model = 64;
  std::int64_t n_heads = 4;
  std::int64_t n_layers = 2;
  std::int64_t d_ff = 256;
  std::int64_t max_seq_len = 64;
  std::int64_t num_classes = 10;
  std::int64_t patch_dim = 0;  // pixels per patch (patches input)
  float dropout = 0.0f;
  bool tie_embeddings = false;
  // The block's pieces (nn/blocks.h).
  enum class Norm : std::uint8_t { layernorm, rmsnorm };
  enum class Position : std::uint8_t { learned, rope };
  enum class Mlp : std::uint8_t { gelu, gelu_tanh, swiglu };
  Norm norm = Norm::layernorm;
  float norm_eps = 1e-5f;
  Position position = Position::learned;
  double rope_theta = 10000.0;  // rope: f_i = theta^(-2i / head_dim)
  Mlp mlp = Mlp::gelu;
  std::int64_t n_kv_heads = 0;  // key/value heads (grouped-query attention); 0: n_heads
  bool bias = true;             // linear layers carry biases
  // Activation recompute: none keeps every activation backward reads;
  // selective recomputes attention's probabilities (always: its backward
  // recomputes P from the log-sum-exp) and the MLP's activation in backward;
  // full keeps each layer's input and recomputes the whole layer in backward.
  enum class Recompute : std::uint8_t { none, selective, full };
  Recompute recompute = Recompute::none;
  // f32, or bf16 / f16 for mixed precision: matmuls read 16-bit copies of the
  // weights (BlockPointers::compute) and 16-bit activations and accumulate in
  // f32; norms, softmax, GELU and the loss compute in f32; parameter gradients
  // are f32. The classifier's small head stays f32.
  DType compute = DType::f32;
  // Rows of the lm head's logits computed at a time (0: as many as fit in
  // kLogitsTileBytes of f32). With fewer rows than a micro-batch has tokens,
  // forward computes the loss tile by tile and backward recomputes each
  // tile's logits, so [tokens, vocab] is never held in full (llm.c's chunked
  // classifier, for large vocabularies); with one tile, backward reuses the
  // probabilities forward left. The recompute costs one more head GEMM per
  // tile after the first (lm-small at vocab 32768 in 32 MiB tiles: 0.85x the
  // tokens/s for 187 MB less peak memory), so tiles start only where the
  // logits pass 256 MiB.
  std::int64_t logits_tile_rows = 0;
  static constexpr std::int64_t kLogitsTileBytes = std::int64_t{256} << 20;

  std::int64_t outputs() const { return kind == Kind::lm ? vocab_size : num_classes; }
  std::int64_t kv_heads() const { return n_kv_heads > 0 ? n_kv_heads : n_heads; }
  std::int64_t head_dim() const { return n_heads > 0 ? d_model / n_heads : 0; }
  // Columns of the QKV projection: H query heads, then Hkv key and Hkv value heads.
  std::int64_t qkv_width() const { return (n_heads + 2 * kv_heads()) * head_dim(); }
  // Columns of the MLP's first projection: d_ff, or the gate's and the up projection's for SwiGLU.
  std::int64_t fc1_width() const { return mlp == Mlp::swiglu ? 2 * d_ff : d_ff; }
  // Rows per logits tile for micro-batches of `tokens` tokens (the
  // classifier's head is one tile of its batch rows).
  std::int64_t logits_rows(std::int64_t tokens) const;
  // Parameters of the matrix multiplies (excluding embeddings), for FLOP counts.
  std::int64_t matmul_params() const;
  // Training FLOPs per token: 6 * matmul_params + 12 * L * d * T (llm.c / PaLM).
  double flops_per_token(std::int64_t seq_len) const;
};

ParameterLayout declare_parameters(const ModelConfig& config);

// One micro-batch: tokens [B, T] or patches [B, T, patch_dim]; targets [B, T]
// (lm: next tokens) or [B] (classifier).
struct ModelInputs {
  const std::int32_t* tokens = nullptr;
  const float* patches = nullptr;
  const std::int32_t* targets = nullptr;
};

struct ForwardResult {
  float loss = 0.0f;          // mean cross-entropy over the targets
  std::int64_t correct = 0;   // argmax hits (accuracy numerator)
  std::int64_t count = 0;     // targets scored
};

struct StepKey {
  std::uint64_t seed = 0;     // train.seed
  std::int64_t step = 0;
  std::int64_t micro = 0;     // micro-step within gradient accumulation
  std::int64_t row_offset = 0;  // global index of this rank's first row (rank * micro-batch)
};

// A Transformer on a device (Device::make_model). Work is queued on the
// device: forward() and backward() return once their kernels are submitted;
// the loss of every forward since reset_result() accumulates on the device
// until collect() reads it (the host's one wait for the model).
class Model {
 public:
  Model(const ModelConfig& config, std::int64_t batch, std::int64_t seq_len)
      : config_(config), batch_(batch), seq_(seq_len) {}
  virtual ~Model() = default;
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  // REQUIRES: pointers into the device's memory: params/grads (and compute,
  // unless config.compute is f32) hold one pointer per block of the layout.
  virtual void bind(const BlockPointers& pointers) = 0;

  // inputs: host memory (the data loader's batch), read before forward
  // returns. Throws DataError naming the row (and position) of a token or
  // target outside its range. training: dropout on (when configured) and
  // state kept for backward.
  virtual void forward(const ModelInputs& inputs, BlockHooks& hooks, bool training, const StepKey& key) = 0;
  // Adds d(grad_scale * loss)/d(params) into the bound gradients.
  // REQUIRES: the last call was forward(..., training = true, ...).
  virtual void backward(BlockHooks& hooks, float grad_scale) = 0;

  // Inference: the logits of `inputs` (targets unused) into host memory,
  // [B, T, vocab] (lm) or [B, classes] (classifier); waits for the device.
  virtual void infer(const ModelInputs& inputs, BlockHooks& hooks, float* logits) = 0;
  // Decoding one sequence with a key/value cache (lm): `n` tokens at
  // positions position .. position + n - 1 (the cache holds the positions
  // before), their logits [n, vocab] into host memory; each new token costs
  // one position, not the whole prefix. Throws Error on a device or model
  // that cannot decode, ConfigError (model.max_seq_len) past the positions.
  // REQUIRES: n <= seq_len(); the parameters do not change between calls.
  virtual void decode(const std::int32_t* tokens, std::int64_t n, std::int64_t position, float* logits) = 0;

  // Clears the loss sum and counts (queued).
  virtual void reset_result() = 0;
  // Waits for the device and returns the mean loss, the correct and scored
  // counts over every forward since reset_result().
  virtual ForwardResult collect() = 0;
  // Device bytes of activations, scratch and inputs.
  virtual std::int64_t activation_bytes() const = 0;

  const ModelConfig& config() const { return config_; }
  std::int64_t batch() const { return batch_; }
  std::int64_t seq_len() const { return seq_; }

 private:
  ModelConfig config_;
  std::int64_t batch_, seq_;
};

// What Model::activation_bytes() of this model would be, computed without
// allocating: a dry run's figure. The buffers are the same on every device
// but for the attention scratch a GPU's kernel set asks for (attention_scratch:
// nn::gpu_attention_scratch on a GPU) and the row stride of the MLP's wide
// activations (row_pad: columns added to each of their rows; -1: the CPU's,
// cpu::activation_row_stride; a GPU's rows are dense, 0).
std::int64_t planned_activation_bytes(const ModelConfig& config, const ParameterLayout& layout,
                                      std::int64_t batch, std::int64_t seq_len,
                                      AttentionScratchKind attention_scratch = AttentionScratchKind::none,
                                      std::int64_t row_pad = -1);

// One forward's result on its own: reset_result(), forward(), collect().
ForwardResult forward_once(Model& model, const ModelInputs& inputs, BlockHooks& hooks, bool training,
                           const StepKey& key);

}  // namespace dtrain::nn
