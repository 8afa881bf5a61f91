#include "tools/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <random>
#include <sstream>

#include <fmt/format.h>

#include "core/error.h"
#include "nn/cpu/host_device.h"
#include "tools/checkpoint_model.h"

namespace dtrain::tools {
namespace {

namespace ck = dtrain::checkpoint;

std::vector<std::int32_t> tokenize(const std::string& prompt, bool text, std::int64_t vocab) {
  std::vector<std::int32_t> out;
  if (text) {
    for (unsigned char c : prompt.empty() ? std::string("\n") : prompt) out.push_back(c);
    return out;
  }
  std::istringstream in(prompt);
  std::string word;
  while (in >> word) {
    std::size_t used = 0;
    long id = -1;
    try {
      id = std::stol(word, &used);
    } catch (const std::exception&) {
    }
    if (used != word.size() || id < 0 || id >= vocab) {
      throw ConfigError("--prompt", fmt::format("'{}' is not a token id of this model (0 .. {}); a token model's "
                                                "prompt is ids separated by spaces",
                                                word, vocab - 1));
    }
    out.push_back(static_cast<std::int32_t>(id));
  }
  if (out.empty()) throw ConfigError("--prompt", "a token model needs a prompt of token ids, e.g. --prompt \"1 2 3\"");
  return out;
}

// The checkpoint's LM on the CPU in f32 (the masters), batch 1, every position.
struct Loaded {
  SavedModel saved;
  nn::cpu::HostDevice device;
  nn::DeviceArray<float> params;
  std::unique_ptr<nn::Model> model;
};

void load(const std::filesystem::path& dir, Loaded& l) {
  ck::Env& env = *ck::default_env();
  const std::filesystem::path step = resolve_step(env, dir);
  const ck::Manifest manifest = ck::read_manifest(env, step);
  l.saved = rebuild_model(manifest, step);
  nn::ModelConfig& m = l.saved.model;
  if (m.kind != nn::ModelConfig::Kind::lm || m.input != nn::ModelConfig::Input::tokens) {
    throw ConfigError("--checkpoint", fmt::format("'{}' holds a {} model; dtrain-generate samples from language "
                                                  "models (model.kind lm)",
                                                  step.string(), l.saved.config.model().kind()));
  }
  m.compute = DType::f32;
  m.dropout = 0.0f;
  l.params = nn::DeviceArray<float>(l.device, static_cast<std::size_t>(l.saved.layout.total_numel()));
  nn::BlockPointers p;
  for (int b = 0; b < l.saved.layout.num_blocks(); ++b) {
    float* block = l.params.data() + l.saved.layout.block_offset(b);
    read_block_params(env, step, manifest, l.saved.layout, b, block);
    p.params.push_back(block);
    p.grads.push_back(block);  // inference writes no gradient
  }
  l.model = l.device.make_model(m, l.saved.layout, 1, m.max_seq_len);
  l.model->bind(p);
}

}  // namespace

std::int32_t pick_token(const float* logits, std::int64_t vocab, double temperature, int top_k, double uniform) {
  if (temperature == 0.0) return static_cast<std::int32_t>(std::max_element(logits, logits + vocab) - logits);
  std::vector<std::int32_t> order(static_cast<std::size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  const std::size_t keep = top_k > 0 ? std::min<std::size_t>(static_cast<std::size_t>(top_k), order.size()) : order.size();
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(keep), order.end(),
                    [&](std::int32_t a, std::int32_t b) { return logits[a] > logits[b]; });
  std::vector<double> weight(keep);
  for (std::size_t i = 0; i < keep; ++i) {
    weight[i] = std::exp((static_cast<double>(logits[order[i]]) - logits[order[0]]) / temperature);
  }
  double target = uniform * std::accumulate(weight.begin(), weight.end(), 0.0);
  for (std::size_t i = 0; i < keep; ++i) {
    if (target < weight[i]) return order[i];
    target -= weight[i];
  }
  return order[keep - 1];
}

Generated generate(const GenerateOptions& o) {
  if (o.temperature < 0.0 || !std::isfinite(o.temperature)) {
    throw ConfigError("--temperature", fmt::format("{} is not a temperature: use 0 (greedy) or more", o.temperature));
  }
  if (o.top_k < 0) throw ConfigError("--top-k", fmt::format("{} is negative: use 0 (all tokens) or more", o.top_k));
  if (o.max_new_tokens < 0) throw ConfigError("--max-new-tokens", "must not be negative");
  Loaded l;
  load(o.checkpoint, l);
  const nn::ModelConfig& m = l.saved.model;
  Generated g;
  g.text = l.saved.config.data().kind() == "text";
  g.prompt = tokenize(o.prompt, g.text, m.vocab_size);
  const auto prompt_len = static_cast<std::int64_t>(g.prompt.size());
  if (prompt_len > m.max_seq_len) {
    throw ConfigError("--prompt", fmt::format("{} tokens are more than the model's model.max_seq_len = {} positions",
                                              prompt_len, m.max_seq_len));
  }
  int wanted = o.max_new_tokens;
  if (prompt_len + wanted > m.max_seq_len + 1) {
    wanted = static_cast<int>(m.max_seq_len + 1 - prompt_len);
    g.note = fmt::format("generated {} tokens, not {}: the model has {} positions", wanted, o.max_new_tokens,
                         m.max_seq_len);
  }
  std::vector<std::int32_t> seq = g.prompt;
  std::vector<float> logits(static_cast<std::size_t>(m.max_seq_len * m.vocab_size));
  std::mt19937_64 rng(o.seed);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  const auto t0 = std::chrono::steady_clock::now();
  std::int64_t cached = 0;  // positions the cache holds
  for (int i = 0; i < wanted; ++i) {
    const auto len = static_cast<std::int64_t>(seq.size());
    if (o.recompute) cached = 0;  // start over: the whole prefix again
    l.model->decode(seq.data() + cached, len - cached, cached, logits.data());
    const float* last = logits.data() + (len - cached - 1) * m.vocab_size;
    cached = len;
    seq.push_back(pick_token(last, m.vocab_size, o.temperature, o.top_k, uniform(rng)));
    g.tokens.push_back(seq.back());
  }
  g.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return g;
}

std::string render(const Generated& g) {
  if (g.text) return std::string(g.tokens.begin(), g.tokens.end());
  std::string out;
  for (std::size_t i = 0; i < g.tokens.size(); ++i) out += fmt::format("{}{}", i == 0 ? "" : " ", g.tokens[i]);
  return out;
}

}  // namespace dtrain::tools
