// Trainer: one rank's training loop. Builds the device, the model, the
// data-parallel engine that owns its flat parameter buffers and the data
// loaders from a resolved config (trainer_setup.cpp), then runs optimizer
// steps (gradient accumulation, clipping, AdamW, LR schedule), evaluation,
// progress lines and metrics.jsonl (trainer.cpp). One step loop serves every
// device: the model and the engine queue their work on it, and the host
// waits once per step, for the gradient norm and the loss. Everything the
// hot loop touches is allocated in the constructor; steps reuse it.
// One thread drives a Trainer.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <optional>

#include "comm/communicator.h"
#include "core/error.h"
#include "data/datasets.h"
#include "data/loader.h"
#include "nn/schedule.h"
#include "nn/transformer.h"
#include "proto/config.pb.h"
#include "sharding/engine.h"
#include "worker/checkpointing.h"
#include "worker/memory_plan.h"
#include "worker/metrics.h"

namespace dtrain::worker {

struct StepResult;
class Heartbeat;
class LiveMetrics;
class TensorBoardLog;
class Profiler;
class Tracer;

struct TrainerOptions {
  bool write_outputs = true;    // out_dir/config.json, metrics.jsonl, TensorBoard events (rank 0 only)
  std::ostream* console = nullptr;  // progress lines (rank 0 only); null = silent
  // The ranks this trainer trains with; null: a single process (the trainer
  // makes a world of one). With device cuda it carries only host-side
  // collectives (loss, stop flags, checkpoints) and must be a CPU backend,
  // except that a world of one may pass its nccl communicator here (it then
  // carries the engine's collectives only).
  std::shared_ptr<comm::Communicator> comm;
  // device cuda: the nccl communicator the engine's collectives (gradients,
  // parameters) travel on, over the same ranks as `comm`; null for one rank
  // makes a world of one. Must outlive the Trainer.
  std::shared_ptr<comm::Communicator> device_comm = nullptr;
  // Where the model and its state live; null: the device the config names
  // (tests pass a queued host device here).
  std::shared_ptr<nn::Device> device = nullptr;
  // device cuda: which of the visible GPUs (comm::cuda_device_for).
  int cuda_device = 0;
  // Ranks on this machine, which share its memory (checked before allocating).
  int ranks_on_node = 1;
  // Where checkpoint files go (null: the file system); tests inject faults here.
  checkpoint::Env* checkpoint_env = nullptr;
  // Called by run() on every rank after each step, before any checkpoint of it.
  std::function<void(const StepResult&)> after_step = {};
  // dtrain-launch's hang detection (worker/heartbeat.h): phases are reported here. May be null.
  Heartbeat* heartbeat = nullptr;
  // The launcher's restart round (DTRAIN_RESTART): a restarted run continues
  // out_dir's metrics.jsonl even when it found no checkpoint to resume.
  int restart = 0;
  // dtrain-worker --eval-only: the trainer only scores its checkpoint. It
  // opens an existing run folder without refusing it, appends the eval line
  // to its metrics.jsonl and writes no config file and no TensorBoard events.
  bool eval_only = false;
  // One rank's peak FLOP/s (dtrain-worker --peak-flops): progress lines then
  // show MFU beside the model FLOP/s; 0: unknown.
  double peak_flops = 0.0;
  // /metrics (worker/metrics_publisher.h): every step's figures go here. May be null.
  LiveMetrics* live_metrics = nullptr;
  // TEST ONLY (dtrain-worker --testonly-slow-rank): sleep this many
  // milliseconds in every step's compute, to make this rank a straggler.
  int testonly_slow_ms = 0;
  // TEST ONLY: sharding::EngineOptions::testonly_unfenced_collective.
  int testonly_unfenced_collective = -1;
};

struct StepResult {
  std::int64_t step = 0;   // optimizer steps done, this one included
  float loss = 0.0f;       // mean over the micro-batches
  float lr = 0.0f;
  float grad_norm = 0.0f;  // before clipping
  double seconds = 0.0;    // wall time of the step
  int stop_signal = 0;     // some rank received SIGTERM/SIGUSR1 (agreed by every rank)
};

struct EvalResult {
  double loss = 0.0;
  std::optional<double> accuracy;    // classifier
  std::optional<double> perplexity;  // lm
};

struct TrainSummary {
  std::int64_t steps = 0;
  double final_loss = 0.0;
  std::optional<EvalResult> final_eval;
  double seconds = 0.0;
  std::int64_t steps_run = 0;  // by this process (a resumed run started after its checkpoint)
  double tokens_per_s = 0.0;  // over the steps this process ran, after its first
  int stopped_by_signal = 0;  // the run saved and stopped early on this signal
  bool already_finished = false;  // train.steps were done before this run started: it did nothing
};

// The model described by the config's model section (and the dataset's shape).
nn::ModelConfig model_config(const config::Config& config);

// What one of `world` ranks would hold in memory (worker/memory_plan.h),
// with the datasets loaded as a run loads them: `dtrain-worker --dry-run`.
MemoryPlan plan_run(const config::Config& config, int world);

class Trainer {
  using Clock = std::chrono::steady_clock;

 public:
  Trainer(const config::Config& config, TrainerOptions options);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Runs train.steps steps with logging and evaluation; returns the summary.
  TrainSummary run();
  // One optimizer step over train.grad_accum_steps micro-batches.
  StepResult step();
  // Mean loss (and accuracy or perplexity) over train.eval_batches validation batches.
  EvalResult evaluate();
  // --eval-only: evaluate() the checkpoint this trainer resumed from, logged
  // as an eval line. ConfigError naming checkpoint.resume when none was loaded.
  EvalResult evaluate_checkpoint();

  const nn::ModelConfig& model() const { return model_config_; }
  const nn::ParameterLayout& layout() const { return layout_; }
  sharding::Engine& engine() { return *engine_; }
  nn::Device& device() { return *device_; }
  // Whether steps run where the host cannot reach the memory (a GPU).
  bool on_device() const { return !device_->host_memory(); }
  // Device memory held by the model and the engine (0 when it is host memory).
  std::int64_t device_bytes() const;
  comm::Communicator& communicator() { return *comm_; }
  // Tokens of one optimizer step over all ranks.
  std::int64_t tokens_per_step() const;
  std::int64_t seq_len() const { return seq_; }
  std::int64_t steps_done() const { return step_; }
  // Optimizer updates applied: steps_done() minus fp16 steps skipped on overflow.
  std::int64_t optimizer_steps() const { return optimizer_steps_; }
  // Where this run resumed from (nullopt: it started fresh).
  const std::optional<ResumePoint>& resumed() const { return resumed_; }
  // Saves a checkpoint of the state after steps_done() steps (collective).
  void save_checkpoint();
  // The same, written in the background (checkpoint.async): start_checkpoint
  // returns once the state is copied; finish_checkpoint waits and commits.
  // step() commits a save in flight at the first boundary where every rank's
  // write is done. Both collective.
  void start_checkpoint();
  void finish_checkpoint();
  const Checkpointer& checkpointer() const { return *checkpointer_; }
  // The Chrome trace this rank wrote (train.trace_steps), once written.
  std::optional<std::filesystem::path> trace_file() const;

 private:
  // Set-up (trainer_setup.cpp), in the order the constructor runs them.
  void connect_device(const std::shared_ptr<comm::Communicator>& device_comm);
  void build_engine_and_model(std::int64_t seq);
  void resume_checkpoint();
  void make_loaders(const data::DatasetPair& datasets);
  void open_outputs();
  bool continues_run_in(const std::filesystem::path& out_dir);
  std::filesystem::path write_run_config(const std::filesystem::path& out_dir) const;
  void open_tensorboard();
  void warn_schedule_change() const;
  ConfigError no_checkpoint_to_score() const;

  bool checkpoint_after(const StepResult& r);  // whether it saved (or started a save)
  void log_progress(const StepResult& r, double tokens_per_s, double step_ms, double elapsed,
                    std::int64_t steps_run);
  void log_eval(const EvalResult& e);
  void log_tensorboard(const StepResult& r, double tokens_per_s, double step_ms, double exposed_s);
  bool histograms_due(std::int64_t step) const;
  void log_run_facts() const;
  void note_saves();
  std::string timestamp() const;
  bool is_rank0() const { return comm_->rank() == 0; }
  // The hooks the model calls: the tracers around the engine while a step is traced.
  nn::BlockHooks& hooks();
  // Records a span on the training thread into the trace and the profile
  // (whichever records this step). `name` must be a string literal.
  void trace_span(const char* name, Clock::time_point start, Clock::time_point end);
  // Figures of a step for /metrics and the trace's checkpoint span.
  void record_live(const StepResult& r, double compute_s, double data_wait_s);
  // One step's compute on this rank: micro-batches, gradient sync, clipping and AdamW.
  struct LocalStep {
    float loss = 0.0f;  // mean over the micro-batches, this rank
    float lr = 0.0f;
    double norm = 0.0;
    double compute_s = 0.0;
    double data_wait_s = 0.0;
  };
  nn::ModelInputs next_micro_batch(int micro, double& data_wait);
  LocalStep compute_step(Clock::time_point t0);

  config::Config config_;
  TrainerOptions options_;
  nn::ModelConfig model_config_;
  nn::ParameterLayout layout_;
  std::shared_ptr<comm::Communicator> comm_;       // host-side collectives
  std::shared_ptr<comm::Communicator> data_comm_;  // the engine's: where the device's memory is
  std::shared_ptr<nn::Device> device_;             // outlives the engine and the model
  std::unique_ptr<sharding::Engine> engine_;
  std::unique_ptr<nn::Model> model_;
  std::unique_ptr<Checkpointer> checkpointer_;
  std::optional<ResumePoint> resumed_;
  // out_dir held an unfinished run with no checkpoint: it started again from step 0.
  bool restarted_in_place_ = false;
  std::filesystem::path config_file_;  // where this invocation's config was written ("" when not)
  std::int64_t batch_ = 0, seq_ = 0;        // micro-batch rows, sequence length
  std::int64_t train_samples_ = 0, val_samples_ = 0;
  std::unique_ptr<data::Loader> train_loader_;
  std::unique_ptr<data::Loader> val_loader_;
  std::unique_ptr<MetricsWriter> metrics_;
  std::unique_ptr<TensorBoardLog> tensorboard_;  // rank 0, train.tensorboard_dir
  nn::LrSchedule schedule_;
  std::int64_t step_ = 0;
  std::int64_t optimizer_steps_ = 0;  // updates applied (AdamW's t): steps minus skipped fp16 steps
  std::unique_ptr<Tracer> tracer_;  // train.trace_steps; observes comm_'s collectives
  std::unique_ptr<Profiler> profiler_;  // train.profile_steps; wraps tracer_ and observes comm_ before it
  std::int64_t live_save_step_ = -1;  // the last save reported to live_metrics
};

}  // namespace dtrain::worker
