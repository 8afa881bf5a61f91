// The config's defaults and validation rules (declared in worker/config.h).
// In proto3 a plain scalar cannot say "unset", so 0 and "" mean unset there;
// `optional` fields (whose 0 is meaningful) use has_xxx().
#include <climits>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <string>
#include <string_view>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join

#include "core/error.h"
#include "worker/config.h"
#include "worker/profiler.h"
#include "worker/trace.h"

namespace dtrain::worker {
namespace {

// Where Debian's dataset-fashion-mnist package installs the data.
constexpr std::string_view kFashionMnistPath = "/usr/share/datasets/fashion-mnist";
constexpr int kFashionMnistClasses = 10;
constexpr int kTextVocab = 256;  // text is read as bytes

[[noreturn]] void fail(std::string_view field, const std::string& message) {
  throw ConfigError(std::string(field), message);
}

void at_least(std::int64_t value, std::int64_t min, std::string_view field) {
  if (value < min) fail(field, fmt::format("must be >= {}, got {}; set {} to a value >= {}", min,
                                           value, field, min));
}

void at_most(std::int64_t value, std::int64_t max, std::string_view field) {
  if (value > max) fail(field, fmt::format("must be <= {}, got {}; set {} to a value <= {}", max,
                                           value, field, max));
}

// value in [lo, hi) or [lo, hi] (hi_inclusive); written so that NaN fails.
void in_range(double value, double lo, double hi, bool hi_inclusive, std::string_view field) {
  const bool ok = value >= lo && (hi_inclusive ? value <= hi : value < hi);
  if (!ok) {
    fail(field, fmt::format("must be in [{}, {}{}, got {}; set {} inside that range", lo, hi,
                            hi_inclusive ? "]" : ")", value, field));
  }
}

void positive(double value, std::string_view field) {
  if (!(value > 0)) fail(field, fmt::format("must be > 0, got {}; set {} to a positive number",
                                            value, field));
}

void non_negative(double value, std::string_view field) {
  if (!(value >= 0)) fail(field, fmt::format("must be >= 0, got {}; set {} to 0 or more",
                                             value, field));
}

void one_of(const std::string& value, std::initializer_list<std::string_view> options,
            std::string_view field) {
  for (std::string_view option : options) {
    if (value == option) return;
  }
  fail(field, fmt::format("must be one of \"{}\", got \"{}\"", fmt::join(options, "\", \""),
                          value));
}

// The block's options (nn::ModelConfig): each value one of its kind, the
// shapes they need.
void validate_block(const config::Model& m) {
  one_of(m.norm(), {"layernorm", "rmsnorm"}, "model.norm");
  positive(m.norm_eps(), "model.norm_eps");
  one_of(m.position(), {"learned", "rope"}, "model.position");
  one_of(m.mlp(), {"gelu", "gelu_tanh", "swiglu"}, "model.mlp");
  one_of(m.recompute(), {"none", "selective", "full"}, "model.recompute");
  at_least(m.n_kv_heads(), 1, "model.n_kv_heads");
  if (m.n_heads() > 0 && m.n_heads() % m.n_kv_heads() != 0) {
    fail("model.n_kv_heads", fmt::format("{} key/value heads do not divide model.n_heads ({}); each key/value "
                                         "head serves a group of query heads: set n_kv_heads to a divisor of "
                                         "n_heads (n_heads itself: plain multi-head attention; 1: multi-query)",
                                         m.n_kv_heads(), m.n_heads()));
  }
  if (m.position() == "rope") {
    positive(m.rope_theta(), "model.rope_theta");
    const std::int64_t head_dim = m.n_heads() > 0 ? m.d_model() / m.n_heads() : 0;
    if (head_dim % 2 != 0) {
      fail("model.position", fmt::format("rotary positions rotate pairs of a head's dimensions, but the head "
                                         "size d_model / n_heads = {} is odd; choose d_model and n_heads so it "
                                         "is even, or model.position \"learned\"",
                                         head_dim));
    }
  }
  if (m.input() == "patches" && m.position() == "rope") {
    fail("model.position", "rotary positions are for causal token models; the patch classifier uses "
                           "\"learned\" positions");
  }
}

void validate_model(const config::Config& c) {
  const config::Model& m = c.model();
  one_of(m.kind(), {"classifier", "lm"}, "model.kind");
  one_of(m.input(), {"tokens", "patches"}, "model.input");
  const bool lm = m.kind() == "lm";
  if (lm && m.input() == "patches") {
    fail("model.input", "an lm reads tokens, not patches; set model.input to \"tokens\" "
                        "or model.kind to \"classifier\"");
  }
  if (m.input() == "tokens") at_least(m.vocab_size(), 1, "model.vocab_size");
  at_least(m.d_model(), 1, "model.d_model");
  at_least(m.n_heads(), 1, "model.n_heads");
  at_least(m.n_layers(), 1, "model.n_layers");
  at_least(m.d_ff(), 1, "model.d_ff");
  if (m.d_model() % m.n_heads() != 0) {
    fail("model.d_model", fmt::format("model.d_model ({}) must be divisible by model.n_heads ({}); "
                                      "change one of them",
                                      m.d_model(), m.n_heads()));
  }
  if (!lm) at_least(m.num_classes(), 2, "model.num_classes");
  if (m.input() == "patches") {
    at_least(m.patch_size(), 1, "model.patch_size");
    if (c.data().kind() != "fashion_mnist") {
      fail("model.input", fmt::format("\"patches\" reads images, but data.kind is \"{}\"; set "
                                      "data.kind to \"fashion_mnist\" or model.input to \"tokens\"",
                                      c.data().kind()));
    }
  }
  in_range(m.dropout(), 0, 1, /*hi_inclusive=*/false, "model.dropout");
  validate_block(m);
  if (m.tie_embeddings() && !lm) {
    fail("model.tie_embeddings", "only an lm has a token embedding to share with its head; "
                                 "set it to false");
  }
}

void validate_data(const config::Config& c) {
  const config::Data& d = c.data();
  one_of(d.kind(), {"tokens", "text", "fashion_mnist", "synthetic"}, "data.kind");
  if (d.kind() == "fashion_mnist") {
    if (c.model().input() != "patches") {
      fail("model.input", "data.kind \"fashion_mnist\" holds images; set model.input to "
                          "\"patches\" (and model.patch_size)");
    }
    if (c.model().num_classes() != kFashionMnistClasses) {
      fail("model.num_classes", fmt::format("data.kind \"fashion_mnist\" has {} classes, got {}; "
                                            "set model.num_classes to {}",
                                            kFashionMnistClasses, c.model().num_classes(),
                                            kFashionMnistClasses));
    }
  }
  if ((d.kind() == "tokens" || d.kind() == "text") && d.path().empty()) {
    fail("data.path", fmt::format("data.kind \"{}\" reads files; set data.path", d.kind()));
  }
  if (d.kind() == "text" && c.model().vocab_size() < kTextVocab) {
    fail("model.vocab_size", fmt::format("data.kind \"text\" reads bytes, so the vocabulary is "
                                         "{}, got {}; set model.vocab_size to {}",
                                         kTextVocab, c.model().vocab_size(), kTextVocab));
  }
  at_least(d.seq_len(), 1, "data.seq_len");
  if (d.seq_len() > c.model().max_seq_len()) {
    fail("data.seq_len", fmt::format("data.seq_len ({}) exceeds model.max_seq_len ({}); raise "
                                     "model.max_seq_len or lower data.seq_len",
                                     d.seq_len(), c.model().max_seq_len()));
  }
  at_least(d.prefetch(), 1, "data.prefetch");
}

void validate_training(const config::Config& c) {
  const config::Optimizer& o = c.optimizer();
  positive(o.lr(), "optimizer.lr");
  in_range(o.beta1(), 0, 1, /*hi_inclusive=*/false, "optimizer.beta1");
  in_range(o.beta2(), 0, 1, /*hi_inclusive=*/false, "optimizer.beta2");
  positive(o.eps(), "optimizer.eps");
  non_negative(o.weight_decay(), "optimizer.weight_decay");
  non_negative(o.grad_clip(), "optimizer.grad_clip");

  const config::Train& t = c.train();
  at_least(t.steps(), 1, "train.steps");
  at_least(t.micro_batch_size(), 1, "train.micro_batch_size");
  at_least(t.grad_accum_steps(), 1, "train.grad_accum_steps");
  at_least(t.log_every(), 1, "train.log_every");
  at_least(t.eval_every(), 0, "train.eval_every");
  at_least(t.eval_batches(), 1, "train.eval_batches");
  if (t.out_dir().empty()) fail("train.out_dir", "is empty; set a directory for the run's outputs");
  at_least(t.histogram_every(), 0, "train.histogram_every");
  if (t.histogram_every() > 0 && t.tensorboard_dir().empty()) {
    fail("train.histogram_every", "histograms go to TensorBoard's event files, but train.tensorboard_dir is \"\" "
                                  "(off); set train.tensorboard_dir or train.histogram_every=0");
  }
  if (const auto traced = parse_trace_steps(t.trace_steps()); traced && traced->first > t.steps()) {
    fail("train.trace_steps", fmt::format("starts at step {} but the run has {} steps; trace steps within 1..{}",
                                          traced->first, t.steps(), t.steps()));
  }
  if (const auto profiled = parse_profile_steps(t.profile_steps())) {
    if (t.tensorboard_dir().empty()) {
      fail("train.profile_steps", "the profile goes to <train.tensorboard_dir>/plugins/profile, but "
                                  "train.tensorboard_dir is \"\" (off); set train.tensorboard_dir or drop the profile");
    }
    if (const std::int64_t first = 1 + profiled->wait + profiled->warmup; first > t.steps()) {
      fail("train.profile_steps", fmt::format("records from step {} on (wait {} + warmup {} + 1) but the run has {} "
                                              "steps; lower wait or warmup",
                                              first, profiled->wait, profiled->warmup, t.steps()));
    }
  }

  const config::Schedule& s = c.schedule();
  at_least(s.warmup_steps(), 0, "schedule.warmup_steps");
  at_most(s.warmup_steps(), t.steps(), "schedule.warmup_steps");
  one_of(s.decay(), {"cosine", "linear", "constant"}, "schedule.decay");
  in_range(s.min_lr_ratio(), 0, 1, /*hi_inclusive=*/true, "schedule.min_lr_ratio");
}

void validate_system(const config::Config& c) {
  const config::Parallel& p = c.parallel();
  one_of(p.backend(), {"auto", "gloo", "mpi", "nccl"}, "parallel.backend");
  at_least(p.zero_stage(), 0, "parallel.zero_stage");
  at_most(p.zero_stage(), 3, "parallel.zero_stage");
  positive(p.bucket_mb(), "parallel.bucket_mb");
  positive(p.first_bucket_mb(), "parallel.first_bucket_mb");
  non_negative(p.zero3_max_live_mb(), "parallel.zero3_max_live_mb");
  at_least(p.timeout_s(), 1, "parallel.timeout_s");
  one_of(p.reduce_dtype(), {"fp32", "bf16", "fp16"}, "parallel.reduce_dtype");

  const config::Checkpoint& k = c.checkpoint();
  at_least(k.every_steps(), 0, "checkpoint.every_steps");
  at_least(k.keep_last(), 1, "checkpoint.keep_last");
  if (k.resume().empty()) {
    fail("checkpoint.resume", "is empty; set \"auto\", \"none\" or a checkpoint path");
  }

  one_of(c.precision(), {"fp32", "bf16", "fp16"}, "precision");
  one_of(c.device(), {"cpu", "cuda"}, "device");
  if (p.backend() == "nccl" && c.device() != "cuda") {
    fail("parallel.backend", fmt::format("nccl moves GPU memory, but device is \"{}\"; for a CPU run use auto, gloo "
                                         "or mpi, or set device=cuda to train on GPUs",
                                         c.device()));
  }
}

}  // namespace

void apply_defaults(config::Config& c, std::string_view run_name) {
  config::Model& m = *c.mutable_model();
  config::Data& d = *c.mutable_data();
  if (m.d_ff() == 0 && m.d_model() > 0 && m.d_model() <= INT_MAX / 4) m.set_d_ff(4 * m.d_model());
  if (m.max_seq_len() == 0) m.set_max_seq_len(d.seq_len());
  if (m.input().empty()) m.set_input("tokens");
  if (m.norm().empty()) m.set_norm("layernorm");
  if (!m.has_norm_eps()) m.set_norm_eps(1e-5f);
  if (m.position().empty()) m.set_position("learned");
  if (!m.has_rope_theta()) m.set_rope_theta(10000.0f);
  if (m.mlp().empty()) m.set_mlp("gelu");
  if (m.n_kv_heads() == 0) m.set_n_kv_heads(m.n_heads());
  if (!m.has_bias()) m.set_bias(true);
  if (m.recompute().empty()) m.set_recompute("none");
  if (!d.has_shuffle()) d.set_shuffle(true);
  if (d.prefetch() == 0) d.set_prefetch(4);
  if (d.path().empty() && d.kind() == "fashion_mnist") d.set_path(std::string(kFashionMnistPath));

  config::Optimizer& o = *c.mutable_optimizer();
  if (!o.has_lr()) o.set_lr(3e-4f);
  if (!o.has_beta1()) o.set_beta1(0.9f);
  if (!o.has_beta2()) o.set_beta2(0.999f);
  if (!o.has_eps()) o.set_eps(1e-8f);
  if (!o.has_weight_decay()) o.set_weight_decay(0.01f);
  if (!o.has_grad_clip()) o.set_grad_clip(1.0f);

  config::Schedule& s = *c.mutable_schedule();
  if (s.decay().empty()) s.set_decay("cosine");
  if (!s.has_min_lr_ratio()) s.set_min_lr_ratio(0.1f);

  config::Train& t = *c.mutable_train();
  if (!t.has_grad_accum_steps()) t.set_grad_accum_steps(1);
  if (!t.has_seed()) t.set_seed(1337);
  if (!t.has_log_every()) t.set_log_every(10);
  if (!t.has_eval_batches()) t.set_eval_batches(20);
  if (!t.has_log_timestamps()) t.set_log_timestamps(true);
  if (t.out_dir().empty()) {
    t.set_out_dir(fmt::format("runs/{}", run_name.empty() ? "default" : run_name));
  }
  if (!t.has_tensorboard_dir()) t.set_tensorboard_dir((std::filesystem::path(t.out_dir()) / "tensorboard").string());

  config::Parallel& p = *c.mutable_parallel();
  if (p.backend().empty()) p.set_backend("auto");
  if (!p.has_bucket_mb()) p.set_bucket_mb(25.0f);
  if (!p.has_first_bucket_mb()) p.set_first_bucket_mb(1.0f);
  if (!p.has_zero3_max_live_mb()) p.set_zero3_max_live_mb(4000.0f);
  if (!p.has_timeout_s()) p.set_timeout_s(300);
  if (p.reduce_dtype().empty()) p.set_reduce_dtype("fp32");

  config::Checkpoint& k = *c.mutable_checkpoint();
  if (!k.has_keep_last()) k.set_keep_last(3);
  if (k.resume().empty()) k.set_resume("auto");  // restarts and requeues continue by themselves

  if (c.precision().empty()) c.set_precision("fp32");
  if (c.device().empty()) c.set_device("cpu");
}

void validate_config(const config::Config& config) {
  validate_model(config);
  validate_data(config);
  validate_training(config);
  validate_system(config);
}

}  // namespace dtrain::worker
