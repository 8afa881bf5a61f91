// The whole Transformer on tiny configurations: shapes and loss at init, every
// parameter's gradient against finite differences of the loss (with and
// without dropout), the block-hook contract, grad_scale and accumulation,
// learning (overfitting a batch, a synthetic classification rule),
// determinism and initialisation.
#include "nn/transformer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <ostream>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "nn/adamw.h"
#include "nn/cpu/host_device.h"
#include "nn/cpu/host_kernels.h"
#include "nn/graph_backward.h"
#include "nn/graph_forward.h"
#include "nn/parameters.h"
#include "unit/gradient_check.h"

namespace dtrain::nn {
namespace {

using testing::check_gradient;
using testing::FdTolerance;
using testing::random_normal;

// ----------------------------------------------------------------- fixtures

// A model's sizes, named where they are given.
struct Sizes {
  std::int64_t vocab, d_model, heads, layers, d_ff, max_seq_len;
};

ModelConfig sized(ModelConfig::Kind kind, const Sizes& s) {
  ModelConfig c;
  c.kind = kind;
  c.vocab_size = s.vocab;
  c.d_model = s.d_model;
  c.n_heads = s.heads;
  c.n_layers = s.layers;
  c.d_ff = s.d_ff;
  c.max_seq_len = s.max_seq_len;
  return c;
}

ModelConfig lm_config(bool tied) {
  // max_seq_len > seq: the unused position rows must get zero gradient.
  ModelConfig c = sized(ModelConfig::Kind::lm,
                        {.vocab = 11, .d_model = 8, .heads = 2, .layers = 2, .d_ff = 16, .max_seq_len = 6});
  c.tie_embeddings = tied;
  return c;
}

// The LLaMA family's block (RMSNorm, rotary positions, SwiGLU, no biases) with
// `heads` query heads sharing `kv_heads` key/value heads; d_ff 16 is SwiGLU's
// hidden width.
ModelConfig llama_config(bool tied, std::int64_t heads, std::int64_t kv_heads) {
  ModelConfig c = lm_config(tied);
  c.n_heads = heads;
  c.n_kv_heads = kv_heads;
  c.norm = ModelConfig::Norm::rmsnorm;
  c.norm_eps = 1e-6f;
  c.position = ModelConfig::Position::rope;
  c.rope_theta = 500.0;  // a short table still turns: the angles differ a lot between positions
  c.mlp = ModelConfig::Mlp::swiglu;
  c.bias = false;
  return c;
}

// One of today's config with a change.
template <class Fn>
ModelConfig with(ModelConfig c, Fn change) {
  change(c);
  return c;
}

// The lm head in tiles of `rows` rows (10 tokens a micro-batch: 3 tiles and a
// short last one for 3, two and a half for 4).
ModelConfig tiled_head(ModelConfig c, std::int64_t rows) {
  c.logits_tile_rows = rows;
  return c;
}

ModelConfig classifier_config(ModelConfig::Input input) {
  ModelConfig c = lm_config(false);
  c.kind = ModelConfig::Kind::classifier;
  c.input = input;
  c.num_classes = 3;
  if (input == ModelConfig::Input::patches) {
    c.patch_dim = 4;
    c.max_seq_len = 4;
  }
  return c;
}

// A model with its own parameters, gradients and one fixed micro-batch.
struct Harness {
  ModelConfig config;
  ParameterLayout layout;
  ParameterStore store;
  cpu::HostDevice device;
  std::unique_ptr<Model> model;
  BlockHooks no_hooks;
  std::vector<std::int32_t> tokens, targets;
  std::vector<float> patches;

  Harness(const ModelConfig& c, std::int64_t batch, std::int64_t seq, std::uint64_t seed = 1)
      : config(c), layout(declare_parameters(c)), store(layout, seed), model(device.make_model(c, layout, batch, seq)) {
    model->bind(store.pointers());
    std::mt19937 rng(static_cast<std::uint32_t>(seed) + 100);
    std::uniform_int_distribution<std::int32_t> tok(0, static_cast<std::int32_t>(c.vocab_size) - 1);
    std::uniform_int_distribution<std::int32_t> cls(0, static_cast<std::int32_t>(c.outputs()) - 1);
    if (c.input == ModelConfig::Input::tokens) {
      tokens.resize(static_cast<std::size_t>(batch * seq));
      for (auto& t : tokens) t = tok(rng);
    } else {
      patches = random_normal(rng, static_cast<std::size_t>(batch * seq * c.patch_dim));
    }
    targets.resize(static_cast<std::size_t>(c.kind == ModelConfig::Kind::lm ? batch * seq : batch));
    for (auto& t : targets) t = cls(rng);
  }

  ModelInputs inputs() const {
    return ModelInputs{tokens.empty() ? nullptr : tokens.data(),
                       patches.empty() ? nullptr : patches.data(), targets.data()};
  }
  ForwardResult forward(const StepKey& key = {}, bool training = true) {
    return forward_once(*model, inputs(), no_hooks, training, key);
  }
  // Fresh gradients of one micro-batch.
  std::vector<float> gradients(const StepKey& key = {}, float grad_scale = 1.0f) {
    store.zero_grads();
    forward(key);
    model->backward(no_hooks, grad_scale);
    return {store.grads().begin(), store.grads().end()};
  }
  float* param(const ParamSpec& p) { return store.params().data() + layout.block_offset(p.block) + p.offset; }
  void adamw(const AdamWHyper& hyper, std::int64_t step) {
    adamw_step(layout, store.params(), store.grads(), store.exp_avg(), store.exp_avg_sq(), hyper, step);
  }
};

// Moves parameters away from init so that every path carries signal: N(0, 0.3)
// matrices and embeddings, N(0, 0.1) biases, 1 + N(0, 0.2) LayerNorm weights.
void randomize(Harness& h, std::uint32_t seed) {
  std::mt19937 rng(seed);
  for (const ParamSpec& p : h.layout.params()) {
    float* x = h.param(p);
    const float sd = p.init == Init::normal ? 0.3f : (p.init == Init::zeros ? 0.1f : 0.2f);
    const float mean = p.init == Init::ones ? 1.0f : 0.0f;
    std::normal_distribution<float> dist(mean, sd);
    for (std::int64_t i = 0; i < p.numel; ++i) x[i] = dist(rng);
  }
}

struct Case {
  std::string name;
  ModelConfig config;
  std::int64_t batch, seq;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

std::vector<Case> tiny_cases() {
  return {{"lm_untied", lm_config(false), 2, 5},
          {"lm_tied", lm_config(true), 2, 5},
          {"lm_head_in_tiles_of_3", tiled_head(lm_config(false), 3), 2, 5},
          {"lm_tied_head_in_tiles_of_4", tiled_head(lm_config(true), 4), 2, 5},
          {"classifier_tokens", classifier_config(ModelConfig::Input::tokens), 2, 5},
          {"classifier_patches", classifier_config(ModelConfig::Input::patches), 2, 4},
          {"llama", llama_config(false, 2, 2), 2, 5},
          {"llama_grouped_tied", llama_config(true, 4, 2), 2, 5},
          {"llama_multi_query", llama_config(false, 4, 1), 2, 5},
          {"gpt2_tanh_gelu", with(lm_config(true), [](ModelConfig& c) { c.mlp = ModelConfig::Mlp::gelu_tanh; }), 2, 5},
          {"rope_grouped_with_biases", with(lm_config(false),
                                            [](ModelConfig& c) {
                                              c.position = ModelConfig::Position::rope;
                                              c.n_kv_heads = 1;
                                            }),
           2, 5},
          {"rmsnorm_swiglu_learned_with_biases", with(lm_config(false),
                                                      [](ModelConfig& c) {
                                                        c.norm = ModelConfig::Norm::rmsnorm;
                                                        c.mlp = ModelConfig::Mlp::swiglu;
                                                      }),
           2, 5},
          {"classifier_rmsnorm_no_bias", with(classifier_config(ModelConfig::Input::tokens),
                                              [](ModelConfig& c) {
                                                c.norm = ModelConfig::Norm::rmsnorm;
                                                c.bias = false;
                                              }),
           2, 5},
          {"lm_selective_recompute", with(lm_config(false), [](ModelConfig& c) { c.recompute = ModelConfig::Recompute::selective; }), 2, 5},
          {"lm_full_recompute", with(lm_config(true), [](ModelConfig& c) { c.recompute = ModelConfig::Recompute::full; }), 2, 5},
          {"llama_selective_recompute", with(llama_config(false, 4, 2), [](ModelConfig& c) { c.recompute = ModelConfig::Recompute::selective; }), 2, 5},
          {"llama_full_recompute", with(llama_config(true, 4, 1), [](ModelConfig& c) { c.recompute = ModelConfig::Recompute::full; }), 2, 5}};
}

class TinyModel : public ::testing::TestWithParam<Case> {};

// ------------------------------------------------------------ (a) shapes

TEST_P(TinyModel, LayoutAndInitialLossAreAsDeclared) {
  const Case& c = GetParam();
  Harness h(c.config, c.batch, c.seq);
  const std::int64_t L = c.config.n_layers, d = c.config.d_model;
  ASSERT_EQ(h.layout.num_blocks(), L + 2);
  EXPECT_EQ(h.layout.blocks().front().name, "embeddings");
  EXPECT_EQ(h.layout.blocks().back().name, "head");
  const std::int64_t hd = d / c.config.n_heads, kv = c.config.kv_heads();
  EXPECT_EQ(h.layout.find("layer.1.qkv.weight").shape, (std::vector<std::int64_t>{(c.config.n_heads + 2 * kv) * hd, d}));
  const bool swiglu = c.config.mlp == ModelConfig::Mlp::swiglu;
  EXPECT_EQ(h.layout.find("layer.1.fc1.weight").shape,
            (std::vector<std::int64_t>{(swiglu ? 2 : 1) * c.config.d_ff, d}));
  const bool layernorm = c.config.norm == ModelConfig::Norm::layernorm;
  for (const char* name : {"layer.0.ln1.bias", "layer.1.ln2.bias", "lnf.bias"}) {
    EXPECT_EQ(layernorm, std::ranges::any_of(h.layout.params(), [&](const ParamSpec& p) { return p.name == name; }))
        << name;
  }
  for (const char* name : {"layer.0.qkv.bias", "layer.0.proj.bias", "layer.1.fc1.bias", "layer.1.fc2.bias"}) {
    EXPECT_EQ(c.config.bias, std::ranges::any_of(h.layout.params(), [&](const ParamSpec& p) { return p.name == name; }))
        << name;
  }
  EXPECT_EQ(c.config.position == ModelConfig::Position::learned,
            std::ranges::any_of(h.layout.params(), [](const ParamSpec& p) { return p.name == "pos_emb"; }));
  EXPECT_EQ(h.layout.find("layer.0.fc2.weight").shape, (std::vector<std::int64_t>{d, c.config.d_ff}));
  std::int64_t total = 0;
  for (const BlockSpec& b : h.layout.blocks()) total += b.numel;
  EXPECT_EQ(total, h.layout.total_numel());
  const bool lm = c.config.kind == ModelConfig::Kind::lm;
  if (lm && c.config.tie_embeddings) {
    EXPECT_THROW(h.layout.find("head.weight"), Error);
  } else if (lm) {
    EXPECT_EQ(h.layout.find("head.weight").shape, (std::vector<std::int64_t>{c.config.vocab_size, d}));
  } else {
    EXPECT_EQ(h.layout.find("cls.weight").shape, (std::vector<std::int64_t>{3, d}));
  }

  // At init (weights N(0, 0.02)) the logits are ~0.06 at most: the loss is
  // within 0.05 of ln(outputs), the uniform prediction.
  const ForwardResult r = h.forward();
  EXPECT_TRUE(std::isfinite(r.loss));
  EXPECT_NEAR(r.loss, std::log(static_cast<double>(c.config.outputs())), 0.05);
  EXPECT_EQ(r.count, lm ? c.batch * c.seq : c.batch);
  EXPECT_GE(r.correct, 0);
  EXPECT_LE(r.correct, r.count);
}

// ------------------------------------------------ (b) whole-model gradients

// Every parameter tensor, 20 sampled elements and one random direction, by
// the 4-point central stencil on ForwardResult::loss (a float: quantum ~2.4e-7
// for a loss ~2.4). h = 1e-2 on parameters of scale 0.1-1 (after randomize):
// the 2-point stencil's O(h^2) error reaches 3% there (embeddings and QKV
// weights feed LayerNorm over d = 8 and softmax, curved at a scale of ~0.1),
// the 4-point one's O(h^4) stays below 1e-3 relative, hence rel 2e-3 (all
// checks pass at half of both tolerances; a 1% error in any gradient fails).
// The floor 5e-5 covers the loss quantum times 18/12h (~3.6e-5) plus the f32
// noise of the forward pass.
void check_model_gradients(const Case& c, float dropout) {
  ModelConfig config = c.config;
  config.dropout = dropout;
  Harness h(config, c.batch, c.seq);
  randomize(h, 17);
  const StepKey key{42, 3, 1};  // fixes the dropout masks
  const std::vector<float> grads = h.gradients(key);
  std::mt19937 rng(23);
  const FdTolerance tol{1e-2, 2e-3, 5e-5, 20, true};
  for (const ParamSpec& p : h.layout.params()) {
    const float* g = grads.data() + h.layout.block_offset(p.block) + p.offset;
    check_gradient(p.name, h.param(p), g, p.numel,
                   [&] { return static_cast<double>(h.forward(key).loss); }, tol, rng);
  }
  if ((c.config.kind == ModelConfig::Kind::lm || c.config.input == ModelConfig::Input::tokens) &&
      c.config.position == ModelConfig::Position::learned) {
    // pos_emb rows beyond seq_len take no part: exactly zero gradient.
    const ParamSpec& pos = h.layout.find("pos_emb");
    const float* g = grads.data() + h.layout.block_offset(pos.block) + pos.offset;
    for (std::int64_t i = c.seq * config.d_model; i < pos.numel; ++i) EXPECT_EQ(g[i], 0.0f);
  }
}

// infer() returns the logits the loss is computed from: the mean of
// logsumexp(logits) - logits[target] over the rows is forward's loss.
TEST_P(TinyModel, InferGivesTheLogitsOfTheLoss) {
  const Case& c = GetParam();
  Harness h(c.config, c.batch, c.seq);
  randomize(h, 5);
  const std::int64_t rows = static_cast<std::int64_t>(h.targets.size()), v = c.config.outputs();
  std::vector<float> logits(static_cast<std::size_t>(rows * v));
  h.model->infer(h.inputs(), h.no_hooks, logits.data());
  double loss = 0.0;
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* row = logits.data() + r * v;
    const double mx = *std::max_element(row, row + v);
    double sum = 0.0;
    for (std::int64_t j = 0; j < v; ++j) sum += std::exp(static_cast<double>(row[j]) - mx);
    loss += std::log(sum) + mx - row[h.targets[static_cast<std::size_t>(r)]];
  }
  EXPECT_NEAR(loss / static_cast<double>(rows), h.forward({}, false).loss, 1e-5);
}

// Decoding with the key/value cache gives, at every position, the logits a
// full recompute of the prefix gives (a causal lm: infer() over the whole
// sequence has each position's logits from its prefix only), within 1e-5 of
// the largest |logit|: one token at a time, and a prefill of 3 then single tokens.
TEST_P(TinyModel, DecodingWithTheCacheMatchesAFullRecompute) {
  const Case& c = GetParam();
  if (c.config.kind != ModelConfig::Kind::lm) return;
  Harness h(c.config, 1, c.config.max_seq_len);
  randomize(h, 9);
  const std::int64_t T = c.config.max_seq_len, v = c.config.vocab_size;
  std::vector<float> full(static_cast<std::size_t>(T * v));
  h.model->infer(h.inputs(), h.no_hooks, full.data());
  const float scale = std::fabs(*std::max_element(full.begin(), full.end(), [](float a, float b) {
    return std::fabs(a) < std::fabs(b);
  }));
  for (std::int64_t prefill : {1, 3}) {
    std::vector<float> step(static_cast<std::size_t>(T * v));
    h.model->decode(h.tokens.data(), prefill, 0, step.data());
    for (std::int64_t t = prefill; t < T; ++t) {
      h.model->decode(h.tokens.data() + t, 1, t, step.data() + t * v);
    }
    for (std::size_t i = 0; i < full.size(); ++i) {
      ASSERT_NEAR(step[i], full[i], 1e-5 * scale) << "prefill " << prefill << ", position " << i / v;
    }
  }
  std::vector<float> one(static_cast<std::size_t>(v));
  EXPECT_THROW(h.model->decode(h.tokens.data(), 1, T, one.data()), ConfigError);  // past the positions
}

TEST_P(TinyModel, EveryParameterGradientMatchesFiniteDifferences) {
  check_model_gradients(GetParam(), 0.0f);
}

// The mask is a function of the StepKey, so the loss is a smooth function of
// the parameters for a fixed key and central differences stay valid.
TEST_P(TinyModel, EveryParameterGradientMatchesFiniteDifferencesWithDropout) {
  check_model_gradients(GetParam(), 0.1f);
}

// Eval forward ignores dropout and the key; training forward uses both.
TEST_P(TinyModel, DropoutOnlyInTrainingAndFixedByKey) {
  Case c = GetParam();
  c.config.dropout = 0.1f;
  Harness h(c.config, c.batch, c.seq);
  randomize(h, 5);
  const float eval1 = h.forward({1, 0, 0}, false).loss;
  EXPECT_EQ(eval1, h.forward({2, 7, 1}, false).loss);
  const float train1 = h.forward({1, 0, 0}, true).loss;
  EXPECT_EQ(train1, h.forward({1, 0, 0}, true).loss);
  EXPECT_NE(train1, h.forward({1, 1, 0}, true).loss);
  EXPECT_NE(train1, eval1);
}

// --------------------------------------------------------------- (c) hooks

// Records the call order and, like ZeRO-3, only lets a block's parameters
// hold their values between its before_* and after_* calls (NaN otherwise),
// and, like DDP, snapshots a block's gradients at after_backward.
class RecordingHooks : public BlockHooks {
 public:
  RecordingHooks(Harness& h, bool poison) : h_(h), poison_(poison) {
    for (int b = 0; b < h.layout.num_blocks(); ++b) {
      const std::int64_t off = h.layout.block_offset(b), n = h.layout.blocks()[static_cast<std::size_t>(b)].numel;
      saved_.emplace_back(h.store.params().begin() + off, h.store.params().begin() + off + n);
      if (poison_) release(b);
    }
    grads_at_after_.resize(saved_.size());
  }
  void before_forward(int b) override {
    record("before_forward", b);
    gather(b);
  }
  void after_forward(int b) override {
    record("after_forward", b);
    release(b);
  }
  void before_backward(int b) override {
    record("before_backward", b);
    gather(b);
    // Untouched so far: the model adds into the gradients only within the block.
    const auto g = grads(b);
    for (float x : g) untouched_before_ &= x == 0.0f;
  }
  void after_backward(int b) override {
    record("after_backward", b);
    release(b);
    const auto g = grads(b);
    grads_at_after_[static_cast<std::size_t>(b)].assign(g.begin(), g.end());
  }

  std::vector<std::pair<std::string, int>> calls;
  bool untouched_before_ = true;
  std::vector<std::vector<float>> grads_at_after_;
  std::span<float> grads(int b) {
    return h_.store.grads().subspan(static_cast<std::size_t>(h_.layout.block_offset(b)),
                                    static_cast<std::size_t>(h_.layout.blocks()[static_cast<std::size_t>(b)].numel));
  }
  void restore_all() {
    for (int b = 0; b < h_.layout.num_blocks(); ++b) gather(b);
  }

 private:
  void record(const char* what, int b) { calls.emplace_back(what, b); }
  void gather(int b) {
    const auto& s = saved_[static_cast<std::size_t>(b)];
    std::copy(s.begin(), s.end(), h_.store.params().begin() + h_.layout.block_offset(b));
  }
  void release(int b) {
    if (!poison_) return;
    const auto& s = saved_[static_cast<std::size_t>(b)];
    std::fill_n(h_.store.params().begin() + h_.layout.block_offset(b), s.size(),
                std::numeric_limits<float>::quiet_NaN());
  }
  Harness& h_;
  bool poison_;
  std::vector<std::vector<float>> saved_;
};

TEST_P(TinyModel, HooksRunAroundEveryBlockInOrder) {
  const Case& c = GetParam();
  Harness h(c.config, c.batch, c.seq);
  RecordingHooks hooks(h, false);
  h.store.zero_grads();
  h.model->forward(h.inputs(), hooks, true, {});
  h.model->backward(hooks, 1.0f);
  std::vector<std::pair<std::string, int>> expect;
  const int blocks = h.layout.num_blocks();
  for (int b = 0; b < blocks; ++b) {
    expect.emplace_back("before_forward", b);
    expect.emplace_back("after_forward", b);
  }
  for (int b = blocks - 1; b >= 0; --b) {
    expect.emplace_back("before_backward", b);
    expect.emplace_back("after_backward", b);
  }
  EXPECT_EQ(hooks.calls, expect);
}

// What the engines rely on (nn/hooks.h): a block's parameters are read only
// between its before_* and after_* calls (ZeRO-3 releases them otherwise), its
// gradients are not written before before_backward and are final at
// after_backward (DDP reduces them then). Tied embeddings break the first two
// by design (the head reads and writes tok_emb in block 0): for them the test
// asserts that the head does depend on block 0, the fact an engine that
// releases parameters must know (docs/ARCHITECTURE.md).
TEST_P(TinyModel, BlocksTouchOnlyTheirOwnParametersBetweenHooks) {
  const Case& c = GetParam();
  Harness h(c.config, c.batch, c.seq);
  const std::vector<float> reference = h.gradients();
  const float reference_loss = h.forward().loss;
  RecordingHooks hooks(h, true);
  h.store.zero_grads();
  const ForwardResult r = forward_once(*h.model, h.inputs(), hooks, true, {});
  if (c.config.tie_embeddings) {
    EXPECT_FALSE(std::isfinite(r.loss)) << "the tied head should read block 0's tok_emb";
    hooks.restore_all();
    return;
  }
  EXPECT_EQ(r.loss, reference_loss) << "a block read parameters outside its hooks";
  h.model->backward(hooks, 1.0f);
  EXPECT_TRUE(hooks.untouched_before_);
  for (int b = 0; b < h.layout.num_blocks(); ++b) {
    const auto g = hooks.grads(b);
    EXPECT_TRUE(std::equal(g.begin(), g.end(), hooks.grads_at_after_[static_cast<std::size_t>(b)].begin()))
        << "block " << b << " changed after its after_backward";
    const float* ref = reference.data() + h.layout.block_offset(b);
    for (std::size_t i = 0; i < g.size(); ++i) {
      ASSERT_EQ(g[i], ref[i]) << "block " << b << " element " << i;
    }
  }
  hooks.restore_all();
}

// ---------------------------------------------------------- (d) grad_scale

// Scaling by a power of two is exact in floating point and every op of the
// backward is linear in the loss gradient: grad_scale 0.5 halves the
// gradients bitwise. The second micro-batch adds its terms one by one onto
// the first's sums (a different order), so that check allows 1e-5 relative.
TEST_P(TinyModel, GradScaleScalesAndBackwardAccumulates) {
  const Case& c = GetParam();
  Harness h(c.config, c.batch, c.seq);
  randomize(h, 3);
  const std::vector<float> full = h.gradients({}, 1.0f);
  const std::vector<float> half = h.gradients({}, 0.5f);
  double norm = 0.0;
  for (std::size_t i = 0; i < full.size(); ++i) {
    ASSERT_EQ(half[i], 0.5f * full[i]) << i;
    norm += std::fabs(full[i]);
  }
  EXPECT_GT(norm, 0.0);
  // Two micro-batches (forward + backward each) add up in the gradients.
  h.store.zero_grads();
  for (int micro = 0; micro < 2; ++micro) {
    h.forward();
    h.model->backward(h.no_hooks, 1.0f);
  }
  const double max_abs = *std::max_element(full.begin(), full.end(), [](float a, float b) {
    return std::fabs(a) < std::fabs(b);
  });
  for (std::size_t i = 0; i < full.size(); ++i) {
    ASSERT_NEAR(h.store.grads()[i], 2.0f * full[i], 1e-5 * std::fabs(2.0f * full[i]) + 1e-7 * std::fabs(max_abs))
        << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Configs, TinyModel, ::testing::ValuesIn(tiny_cases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

// ------------------------------------------------------------ (e), (f) learning

// One AdamW step on the harness's fixed batch; returns the loss before it.
float train_step(Harness& h, const AdamWHyper& hyper, std::int64_t step) {
  h.store.zero_grads();
  const float loss = h.forward({7, step, 0}).loss;
  h.model->backward(h.no_hooks, 1.0f);
  h.adamw(hyper, step + 1);
  return loss;
}

// Tiling the head changes only the order of the head's weight-gradient
// sums: loss, every gradient and infer's logits match one tile to float
// rounding (1e-6 of the largest value).
TEST(Transformer, HeadInTilesMatchesOneTile) {
  for (bool tied : {false, true}) {
    Harness one(lm_config(tied), 2, 5), tiles(tiled_head(lm_config(tied), 3), 2, 5);
    randomize(one, 21);
    randomize(tiles, 21);
    const std::vector<float> g1 = one.gradients(), gt = tiles.gradients();
    float scale = 0.0f;
    for (float g : g1) scale = std::max(scale, std::fabs(g));
    ASSERT_EQ(g1.size(), gt.size());
    for (std::size_t i = 0; i < g1.size(); ++i) ASSERT_NEAR(gt[i], g1[i], 1e-6f * scale) << "gradient " << i;
    EXPECT_NEAR(tiles.forward().loss, one.forward().loss, 1e-6f);
    std::vector<float> l1(10 * 11), lt(10 * 11);
    one.model->infer(one.inputs(), one.no_hooks, l1.data());
    tiles.model->infer(tiles.inputs(), tiles.no_hooks, lt.data());
    for (std::size_t i = 0; i < l1.size(); ++i) EXPECT_NEAR(lt[i], l1[i], 1e-6f * (1.0f + std::fabs(l1[i])));
  }
}

// A dry run's activation figure is the graph's own; for a GPU it adds the
// attention scratch: delta [B, H, T] for the one-pass kernels, or the whole
// batch's: S and dP [B, H, T, T] and the heads, dQ, dK and dV [B, T, d], f32 here.
TEST(Transformer, PlannedActivationBytesAreTheGraphsAndCountTheGpuAttentionScratch) {
  const ModelConfig c = lm_config(false);
  Harness h(c, 2, 5);
  EXPECT_EQ(planned_activation_bytes(c, h.layout, 2, 5), h.model->activation_bytes());
  const std::int64_t rows = 4 * (2 * c.n_heads * 5);
  EXPECT_EQ(planned_activation_bytes(c, h.layout, 2, 5, AttentionScratchKind::rows),
            h.model->activation_bytes() + rows);
  const std::int64_t whole = 4 * (2 * (2 * c.n_heads * 5 * 5) + 4 * (2 * 5 * c.d_model));
  EXPECT_EQ(planned_activation_bytes(c, h.layout, 2, 5, AttentionScratchKind::whole_batch),
            h.model->activation_bytes() + whole);
}

// The GPU's choice: the whole-batch scratch while its S and dP fit in the
// limit (1 GiB unless DTRAIN_ATTENTION_SCRATCH_MB), else the one-pass
// kernels, which take head dims up to kOnePassMaxHeadDim.
TEST(Transformer, GpuAttentionScratchIsWholeBatchUpToItsLimit) {
  const std::int64_t gib = attention_scratch_limit(nullptr);
  EXPECT_EQ(gib, std::int64_t{1} << 30);
  EXPECT_EQ(attention_scratch_limit(""), gib);
  EXPECT_EQ(attention_scratch_limit("0"), 0);
  EXPECT_EQ(attention_scratch_limit("64"), std::int64_t{64} << 20);
  EXPECT_EQ(gpu_attention_scratch(64, 1024, 64, gib), AttentionScratchKind::whole_batch);  // 512 MiB
  EXPECT_EQ(gpu_attention_scratch(128, 1024, 64, gib), AttentionScratchKind::whole_batch);  // exactly 1 GiB
  EXPECT_EQ(gpu_attention_scratch(129, 1024, 64, gib), AttentionScratchKind::rows);
  EXPECT_EQ(gpu_attention_scratch(1, 16384, kOnePassMaxHeadDim, gib), AttentionScratchKind::rows);  // 2 GiB
  EXPECT_EQ(gpu_attention_scratch(1, 16384, kOnePassMaxHeadDim + 1, gib), AttentionScratchKind::whole_batch);
  EXPECT_EQ(gpu_attention_scratch(1, 16, 64, 0), AttentionScratchKind::rows);  // a limit of 0: always one pass
}

TEST(TransformerTraining, LmOverfitsAFixedBatch) {
  const ModelConfig c = sized(ModelConfig::Kind::lm,
                              {.vocab = 16, .d_model = 32, .heads = 4, .layers = 2, .d_ff = 64, .max_seq_len = 8});
  constexpr std::int64_t B = 4, T = 8;
  Harness h(c, B, T, 3);
  // Sequences of T + 1 tokens with distinct first tokens, so every target is
  // a function of its prefix and the loss can reach 0.
  std::mt19937 rng(4);
  std::uniform_int_distribution<std::int32_t> tok(0, 15);
  for (std::int64_t b = 0; b < B; ++b) {
    std::vector<std::int32_t> s(T + 1);
    for (auto& t : s) t = tok(rng);
    s[0] = static_cast<std::int32_t>(3 * b);
    for (std::int64_t t = 0; t < T; ++t) {
      h.tokens[static_cast<std::size_t>(b * T + t)] = s[static_cast<std::size_t>(t)];
      h.targets[static_cast<std::size_t>(b * T + t)] = s[static_cast<std::size_t>(t + 1)];
    }
  }
  AdamWHyper hyper;
  hyper.lr = 1e-2f;
  hyper.weight_decay = 0.0f;
  float first = 0.0f, loss = 0.0f;
  std::int64_t step = 0;
  for (; step < 300; ++step) {
    loss = train_step(h, hyper, step);
    if (step == 0) first = loss;
    if (loss < 0.05f) break;
  }
  EXPECT_NEAR(first, std::log(16.0), 0.05);
  EXPECT_LT(loss, 0.05f) << "after " << step << " steps";
}

// label = 1 iff token 3 appears more often than token 5. Linear in the token
// counts, which the mean-pooled classifier can read; held-out accuracy >= 99%.
TEST(TransformerTraining, ClassifierLearnsACountingRule) {
  ModelConfig c = sized(ModelConfig::Kind::classifier,
                        {.vocab = 8, .d_model = 16, .heads = 2, .layers = 1, .d_ff = 32, .max_seq_len = 8});
  c.num_classes = 2;
  constexpr std::int64_t B = 32, T = 8;
  Harness h(c, B, T, 5);
  std::mt19937 rng(6);
  std::uniform_int_distribution<std::int32_t> tok(0, 7);
  auto fill = [&](std::mt19937& r) {
    for (std::int64_t b = 0; b < B; ++b) {
      int threes = 0, fives = 0;
      for (std::int64_t t = 0; t < T; ++t) {
        const std::int32_t x = tok(r);
        h.tokens[static_cast<std::size_t>(b * T + t)] = x;
        threes += x == 3 ? 1 : 0;
        fives += x == 5 ? 1 : 0;
      }
      h.targets[static_cast<std::size_t>(b)] = threes > fives ? 1 : 0;
    }
  };
  AdamWHyper hyper;
  hyper.lr = 1e-2f;
  for (std::int64_t step = 0; step < 400; ++step) {
    fill(rng);  // a fresh batch every step
    train_step(h, hyper, step);
  }
  std::mt19937 held_out(1234);  // other samples than training saw (up to chance repeats)
  std::int64_t correct = 0, count = 0;
  for (int i = 0; i < 64; ++i) {
    fill(held_out);
    const ForwardResult r = h.forward({}, false);
    correct += r.correct;
    count += r.count;
  }
  EXPECT_GE(static_cast<double>(correct) / static_cast<double>(count), 0.99)
      << correct << " / " << count;
}

// ---------------------------------------------------- (g) determinism, (h) init

TEST(Transformer, IdenticalRunsAreBitwiseIdentical) {
  ModelConfig c = lm_config(false);
  c.dropout = 0.1f;
  auto run = [&] {
    Harness h(c, 2, 5, 9);
    AdamWHyper hyper;
    hyper.lr = 1e-2f;
    for (std::int64_t step = 0; step < 5; ++step) train_step(h, hyper, step);
    return std::vector<float>(h.store.params().begin(), h.store.params().end());
  };
  const std::vector<float> a = run(), b = run();
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  Harness init(c, 2, 5, 9);
  EXPECT_NE(std::memcmp(a.data(), init.store.params().data(), a.size() * sizeof(float)), 0)
      << "training changed nothing";
}

// HostKernels whose d_ff-wide activations' rows are cols + Pad floats apart
// (row_stride: nn/graph.h). The CPU's own choice (cpu::activation_row_stride)
// pads them only where oneDNN's sgemm would copy them (DTRAIN_CPU_GEMM=onednn,
// or products of the own kernel's sides below 128, on CPUs with AVX2 alone).
template <std::int64_t Pad>
struct RowKernels : cpu::HostKernels<cpu::F32Format> {
  using HostKernels::HostKernels;
  static std::int64_t row_stride(std::int64_t cols, std::int64_t /*other*/) { return cols + Pad; }
};

// Rows of h, a and d_h 16 floats apart train as dense rows do, bit for bit:
// every product reads the same numbers and no kernel reads the padding. The
// dry run's figure follows the stride it is given, and the CPU's own graph.
TEST(Transformer, PaddedFeedForwardRowsTrainAsDenseRows) {
  for (float dropout : {0.0f, 0.1f}) {  // with dropout, fc2's product writes a branch buffer of its own
    ModelConfig c = sized(ModelConfig::Kind::lm,
                          {.vocab = 16, .d_model = 32, .heads = 2, .layers = 2, .d_ff = 256, .max_seq_len = 8});
    c.dropout = dropout;
    constexpr std::int64_t B = 2, T = 8;
    Harness padded(c, B, T, 3), dense(c, B, T, 3);
    EXPECT_EQ(planned_activation_bytes(c, padded.layout, B, T), padded.model->activation_bytes());
    padded.model = std::make_unique<Graph<RowKernels<16>>>(padded.device, RowKernels<16>(padded.device), c,
                                                           padded.layout, B, T);
    padded.model->bind(padded.store.pointers());
    dense.model = std::make_unique<Graph<RowKernels<0>>>(dense.device, RowKernels<0>(dense.device), c,
                                                         dense.layout, B, T);
    dense.model->bind(dense.store.pointers());
    randomize(padded, 4);
    randomize(dense, 4);
    EXPECT_EQ(padded.model->activation_bytes() - dense.model->activation_bytes(),
              16 * B * T * 4 * (2 * c.n_layers + 1));  // h and a per layer, d_h
    EXPECT_EQ(planned_activation_bytes(c, padded.layout, B, T, AttentionScratchKind::none, 16),
              padded.model->activation_bytes());
    EXPECT_EQ(planned_activation_bytes(c, padded.layout, B, T, AttentionScratchKind::none, 0),
              dense.model->activation_bytes());
    AdamWHyper hyper;
    hyper.lr = 1e-2f;
    for (std::int64_t step = 0; step < 3; ++step) {
      EXPECT_EQ(train_step(padded, hyper, step), train_step(dense, hyper, step))
          << "loss, step " << step << ", dropout " << dropout;
    }
    EXPECT_EQ(std::memcmp(padded.store.params().data(), dense.store.params().data(),
                          padded.store.params().size() * sizeof(float)),
              0)
        << "dropout " << dropout;
    EXPECT_EQ(std::memcmp(padded.store.grads().data(), dense.store.grads().data(),
                          padded.store.grads().size() * sizeof(float)),
              0)
        << "dropout " << dropout;
  }
}

ModelConfig init_config() {
  return sized(ModelConfig::Kind::lm,
               {.vocab = 256, .d_model = 64, .heads = 4, .layers = 2, .d_ff = 256, .max_seq_len = 64});
}

// N(0, 0.02): for n >= 4096 samples the sample std has a relative sd of
// 1/sqrt(2n) <= 1.1%, so 10% is > 9 sd; the mean is within 5 sd (0.02/sqrt(n)).
TEST(TransformerInit, WeightsNormalBiasesZeroNormWeightsOne) {
  const ModelConfig c = init_config();
  const ParameterLayout layout = declare_parameters(c);
  ParameterStore store(layout, 7);
  int checked = 0;
  for (const ParamSpec& p : layout.params()) {
    const float* x = store.params().data() + layout.block_offset(p.block) + p.offset;
    const bool norm_weight = p.name.find("ln") != std::string::npos && p.name.ends_with(".weight");
    if (p.name.ends_with(".bias")) {
      EXPECT_EQ(p.init, Init::zeros) << p.name;
    }
    if (norm_weight) {
      EXPECT_EQ(p.init, Init::ones) << p.name;
    }
    if (p.init != Init::normal) {
      for (std::int64_t i = 0; i < p.numel; ++i) {
        ASSERT_EQ(x[i], p.init == Init::ones ? 1.0f : 0.0f) << p.name << "[" << i << "]";
      }
      continue;
    }
    EXPECT_TRUE(p.decay) << p.name;
    ASSERT_GE(p.numel, 4096) << p.name;
    double s = 0.0, sq = 0.0;
    for (std::int64_t i = 0; i < p.numel; ++i) {
      s += x[i];
      sq += static_cast<double>(x[i]) * x[i];
    }
    const double n = static_cast<double>(p.numel), mean = s / n;
    EXPECT_NEAR(mean, 0.0, 5.0 * 0.02 / std::sqrt(n)) << p.name;
    EXPECT_NEAR(std::sqrt(sq / n - mean * mean), 0.02, 0.002) << p.name;
    ++checked;
  }
  EXPECT_EQ(checked, 2 + 4 * c.n_layers + 1);
}

TEST(TransformerInit, SeedDeterminesValuesIndependentlyOfStorage) {
  const ParameterLayout layout = declare_parameters(init_config());
  ParameterStore a(layout, 7), b(layout, 7), other(layout, 8);
  EXPECT_TRUE(std::equal(a.params().begin(), a.params().end(), b.params().begin()));
  std::int64_t same = 0, normal = 0;
  for (std::size_t i = 0; i < a.params().size(); ++i) {
    if (a.params()[i] == 0.0f || a.params()[i] == 1.0f) continue;
    ++normal;
    same += a.params()[i] == other.params()[i] ? 1 : 0;
  }
  EXPECT_GT(normal, 100000);
  EXPECT_EQ(same, 0) << "a different seed must give different values";
  // One parameter initialised on its own (as a shard would) equals the store's.
  int index = 0;  // of layer.0.qkv.weight: neither the first parameter nor in block 0
  while (layout.params()[static_cast<std::size_t>(index)].name != "layer.0.qkv.weight") ++index;
  const ParamSpec& p = layout.params()[static_cast<std::size_t>(index)];
  std::vector<float> alone(static_cast<std::size_t>(p.numel));
  init_parameter(p, index, 7, alone.data());
  EXPECT_TRUE(std::equal(alone.begin(), alone.end(),
                         a.params().begin() + layout.block_offset(p.block) + p.offset));
  // Two parameters of the same shape get different values.
  const ParamSpec& q0 = layout.find("layer.0.qkv.weight");
  const ParamSpec& q1 = layout.find("layer.1.qkv.weight");
  EXPECT_FALSE(std::equal(a.params().begin() + layout.block_offset(q0.block) + q0.offset,
                          a.params().begin() + layout.block_offset(q0.block) + q0.offset + q0.numel,
                          a.params().begin() + layout.block_offset(q1.block) + q1.offset));
}

}  // namespace
}  // namespace dtrain::nn
