#include "worker/tensorboard.h"

#include <array>
#include <ostream>
#include <span>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "telemetry/histogram.h"

namespace dtrain::worker {
namespace {

// The text plugin renders Markdown: indented lines are a code block.
std::string as_code_block(const std::string& text) {
  std::string out = "    ";
  for (const char c : text) {
    out += c;
    if (c == '\n') out += "    ";
  }
  return out;
}

void add_histogram(tensorboard::Summary& summary, const std::string& tag, std::span<const float> values) {
  telemetry::Histogram histogram;
  histogram.add(values);
  tensorboard::Summary::Value& value = *summary.add_value();
  value.set_tag(tag);
  histogram.encode(*value.mutable_histo());
}

}  // namespace

TensorBoardLog::TensorBoardLog(const std::filesystem::path& dir, std::optional<std::int64_t> session_start,
                               const std::string& config_json, std::ostream& warnings,
                               telemetry::EventFileOptions options)
    : dir_(dir), warnings_(warnings), session_start_(session_start), config_(as_code_block(config_json)) {
  guarded([&] {
    writer_ = std::make_unique<telemetry::EventFileWriter>(dir_, std::move(options));
    if (!session_start_) writer_->add_text(0, "config", config_);
    writer_->flush();
  });
}

// Before the first step's records, not at opening: a process that trains
// nothing (--eval-only on an older step, a finished run) drops no step.
void TensorBoardLog::start_session() {
  if (!session_start_) return;
  writer_->add_session_start(*session_start_);
  writer_->add_text(*session_start_, "config", config_);
  session_start_.reset();
}

TensorBoardLog::~TensorBoardLog() { flush(); }

template <typename Write>
void TensorBoardLog::guarded(Write&& write) {
  try {
    write();
  } catch (const IoError& e) {
    writer_.reset();  // its destructor's flush fails quietly
    warnings_ << fmt::format("dtrain-worker: warning: TensorBoard events in '{}' are off from here on: {}; "
                             "training goes on (train.tensorboard_dir names the folder, \"\" turns events off)\n",
                             dir_.string(), e.what());
    warnings_.flush();
  }
}

void TensorBoardLog::log_step(std::int64_t step, const StepScalars& s) {
  if (!on()) return;
  std::vector<telemetry::ScalarValue> values{{
      {"loss/train", s.loss},
      {"lr", s.lr},
      {"grad_norm", s.grad_norm},
      {"throughput/tokens_per_s", s.tokens_per_s},
      {"time/step_ms", s.step_ms},
      {"throughput/model_tflops", s.model_tflops},
      {"time/exposed_comm_ms", s.exposed_comm_ms},
      {"memory/peak_rss_mib", s.peak_rss_mib},
  }};
  if (s.mfu > 0.0) values.push_back({"throughput/mfu", s.mfu});
  guarded([&] {
    start_session();
    writer_->add_scalars(step, values);
    writer_->flush();
  });
}

void TensorBoardLog::log_eval(std::int64_t step, double loss, std::optional<double> accuracy,
                              std::optional<double> perplexity) {
  if (!on()) return;
  std::vector<telemetry::ScalarValue> values{{"loss/eval", loss}};
  if (accuracy) values.push_back({"eval/accuracy", *accuracy});
  if (perplexity) values.push_back({"eval/perplexity", *perplexity});
  guarded([&] {
    writer_->add_scalars(step, values);
    writer_->flush();
  });
}

bool TensorBoardLog::gradient_histograms(const sharding::Engine& engine) {
  return engine.stage() == 0 && !engine.loss_scaler().enabled();
}

void TensorBoardLog::log_histograms(sharding::Engine& engine, std::int64_t step, TensorBoardLog* log) {
  const bool writes = log != nullptr && log->on();
  if (!writes && engine.stage() != 3) return;  // only stage 3's gather needs every rank
  const std::vector<float> weights = engine.gather_parameters();
  if (!writes) return;
  const nn::ParameterLayout& layout = engine.layout();
  const bool with_grads = gradient_histograms(engine);
  const nn::BlockPointers pointers = with_grads ? engine.pointers() : nn::BlockPointers{};
  std::vector<float> grads;
  log->guarded([&] {
    log->start_session();
    log->writer_->add_summary(step, [&](tensorboard::Summary& summary) {
      for (int b = 0; b < layout.num_blocks(); ++b) {
        const nn::BlockSpec& block = layout.blocks()[static_cast<std::size_t>(b)];
        const auto numel = static_cast<std::size_t>(block.numel);
        add_histogram(summary, "weights/" + block.name,
                      std::span<const float>(weights).subspan(static_cast<std::size_t>(layout.block_offset(b)), numel));
        if (!with_grads) continue;
        grads.resize(numel);  // the gradients may live where the host cannot read them
        engine.device().copy(grads.data(), pointers.grads[static_cast<std::size_t>(b)], numel * sizeof(float));
        engine.device().synchronize();
        add_histogram(summary, "grads/" + block.name, grads);
      }
    });
    log->writer_->flush();
  });
}

void TensorBoardLog::flush() {
  if (!on()) return;
  guarded([&] { writer_->flush(); });
}

}  // namespace dtrain::worker
