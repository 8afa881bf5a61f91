// TensorBoardLog: rank 0's TensorBoard event files in train.tensorboard_dir
// (docs/observability.md, "TensorBoard"), written natively through
// telemetry/event_file_writer.h: the scalars of every logged step, the eval
// figures, the resolved config as text, and every
// train.histogram_every steps histograms of each block's weights and
// gradients. Flushed at every logged step, every eval and at the end.
//
// Observability never stops a run: the first error (a folder that cannot be
// made, a full disk) prints one warning naming the folder to `warnings` and
// turns the log off; training goes on. No method throws an IoError.
// Threading: the training thread owns the log.
#pragma once

#include <cstdint>
#include <filesystem>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>

#include "sharding/engine.h"
#include "telemetry/event_file_writer.h"

namespace dtrain::worker {

// What one logged step reports (means over the steps since the last log,
// as metrics.jsonl's).
struct StepScalars {
  double loss = 0.0;
  double lr = 0.0;
  double grad_norm = 0.0;
  double tokens_per_s = 0.0;
  double step_ms = 0.0;
  double model_tflops = 0.0;     // model FLOP/s / 1e12 (MFU's numerator)
  double exposed_comm_ms = 0.0;  // waiting for gradient collectives after backward, per step
  double peak_rss_mib = 0.0;     // this process's peak resident set
  double mfu = 0.0;              // model FLOP/s over the rank's peak (--peak-flops); 0: no peak, no tag
};

class TensorBoardLog {
 public:
  // Opens a new event file in `dir`. `session_start`: the first step this
  // run trains, when the folder may hold an earlier run's later steps (a
  // resume or a restart): before this run's first step records, a SessionLog
  // START there makes TensorBoard drop them. The config (JSON) is the text
  // summary "config" at step 0, or at `session_start` (a reader keeps every
  // session's: they may differ).
  TensorBoardLog(const std::filesystem::path& dir, std::optional<std::int64_t> session_start,
                 const std::string& config_json, std::ostream& warnings,
                 telemetry::EventFileOptions options = {});
  ~TensorBoardLog();

  void log_step(std::int64_t step, const StepScalars& s);
  void log_eval(std::int64_t step, double loss, std::optional<double> accuracy, std::optional<double> perplexity);
  // weights/<block> for every block; grads/<block> where `engine` holds every
  // block's averaged gradients (stage 0) unscaled (no fp16 loss scaling).
  // Every rank calls it at a histogram step (stage 3 gathers the parameters
  // collectively); `log` is null on the ranks that do not write.
  static void log_histograms(sharding::Engine& engine, std::int64_t step, TensorBoardLog* log);
  // Whether gradients get histograms under this engine (see log_histograms).
  static bool gradient_histograms(const sharding::Engine& engine);

  void flush();
  bool on() const { return writer_ != nullptr; }
  const std::filesystem::path& dir() const { return dir_; }

 private:
  // Runs `write`; an IoError turns the log off with the one warning.
  template <typename Write>
  void guarded(Write&& write);
  void start_session();  // REQUIRES: on()

  std::filesystem::path dir_;
  std::ostream& warnings_;
  std::optional<std::int64_t> session_start_;  // until written
  std::string config_;                         // the config as Markdown
  std::unique_ptr<telemetry::EventFileWriter> writer_;
};

}  // namespace dtrain::worker
