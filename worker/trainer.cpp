#include "worker/trainer.h"

#include <chrono>
#include <cmath>
#include <fstream>
#include <ostream>
#include <string_view>
#include <thread>

#include "core/error.h"
#include "comm/connect.h"
#include "comm/memory_store.h"
#include "data/datasets.h"
#include "dtrain/config.h"
#include "nn/adamw.h"
#include "worker/config.h"
#include "worker/cuda_step.h"
#include "worker/heartbeat.h"
#include "worker/metrics_publisher.h"
#include "worker/precision.h"
#include "worker/signals.h"
#include "worker/trace.h"
#if DTRAIN_HAVE_CUDA
#include "comm/nccl/backend.h"
#endif

namespace dtrain::worker {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

nn::Decay parse_decay(const std::string& name) {
  if (name == "linear") return nn::Decay::linear;
  if (name == "constant") return nn::Decay::constant;
  return nn::Decay::cosine;
}

data::DataSpec data_spec(const config::Config& c) {
  data::DataSpec spec;
  spec.kind = c.data().kind();
  spec.path = c.data().path();
  spec.val_path = c.data().val_path();
  spec.seq_len = c.data().seq_len();
  spec.vocab_size = c.model().vocab_size();
  spec.num_classes = c.model().num_classes();
  spec.patch_size = c.model().patch_size();
  spec.model_kind = c.model().kind();
  spec.seed = c.train().seed();
  return spec;
}

std::string format_duration(double seconds) {
  const auto s = static_cast<long>(seconds + 0.5);
  if (s >= 3600) return fmt::format("{}h{:02}m", s / 3600, (s / 60) % 60);
  if (s >= 60) return fmt::format("{}m{:02}s", s / 60, s % 60);
  return fmt::format("{}s", s);
}

// A world of one for a trainer started without a communicator.
std::shared_ptr<comm::Communicator> single_process_communicator() {
  auto store = std::make_shared<comm::MemoryStore>();
  comm::CommunicatorOptions options;
  options.name = "single";
  return std::make_shared<comm::Communicator>(
      comm::make_gloo_backend(0, 1, store, std::chrono::seconds(60), "127.0.0.1"), options);
}

bool is_nccl(const std::shared_ptr<comm::Communicator>& comm) {
  return comm && std::string_view(comm->backend_name()) == "nccl";
}

// device "cuda": what the config, this build and this machine must allow;
// ConfigError naming the field otherwise. The config's own rules come first,
// so they are reported the same way on every machine.
void check_device(const config::Config& c, const TrainerOptions& o) {
  const std::string& device = c.device();
  if (device == "cpu") return;
  if (device != "cuda") {
    throw ConfigError("device", fmt::format("'{}' is not a device; use \"cpu\" or \"cuda\"", device));
  }
  if (c.parallel().zero_stage() != 0) {
    throw ConfigError("parallel.zero_stage",
                      "device cuda supports stage 0 only in this version; use zero_stage 0 or device cpu");
  }
  const std::string& backend = c.parallel().backend();
  if (backend != "auto" && backend != "nccl") {
    throw ConfigError("parallel.backend", fmt::format("'{}' cannot reduce gradients in GPU memory: device cuda "
                                                      "uses nccl; use auto or nccl", backend));
  }
#if !DTRAIN_HAVE_CUDA
  (void)o;
  throw ConfigError("device", "\"cuda\" but this dtrain was built without CUDA; rebuild with nvcc present "
                              "(-DDTRAIN_WITH_CUDA=ON) or use \"cpu\"");
#else
  std::string why;
  if (comm::nccl_backend::cuda_device_count(&why) == 0) {
    throw ConfigError("device", fmt::format("\"cuda\" but {}; run where a GPU is visible (the driver, "
                                            "CUDA_VISIBLE_DEVICES) or use \"cpu\"", why));
  }
  const int world = o.comm ? o.comm->world_size() : 1;
  if (world > 1 && (is_nccl(o.comm) || !is_nccl(o.device_comm))) {
    throw ConfigError("parallel.backend",
                      fmt::format("device cuda on {} ranks needs two communicators: nccl for the gradients "
                                  "and gloo or mpi for the host-side collectives (initialisation check, loss, "
                                  "checkpoints), but was given {} and {}; run one rank per job, or device cpu",
                                  world, o.comm->backend_name(),
                                  o.device_comm ? o.device_comm->backend_name() : "no device communicator"));
  }
  if (o.device_comm && o.device_comm->world_size() != world) {
    throw ConfigError("parallel.backend", fmt::format("the nccl communicator has {} ranks, the job {}",
                                                      o.device_comm->world_size(), world));
  }
#endif
}

}  // namespace

nn::ModelConfig model_config(const config::Config& c) {
  const config::Model& m = c.model();
  nn::ModelConfig mc;
  mc.kind = m.kind() == "lm" ? nn::ModelConfig::Kind::lm : nn::ModelConfig::Kind::classifier;
  mc.input = m.input() == "patches" ? nn::ModelConfig::Input::patches
                                    : nn::ModelConfig::Input::tokens;
  mc.vocab_size = m.vocab_size();
  mc.d_model = m.d_model();
  mc.n_heads = m.n_heads();
  mc.n_layers = m.n_layers();
  mc.d_ff = m.d_ff();
  mc.max_seq_len = m.max_seq_len();
  mc.num_classes = m.num_classes();
  mc.patch_dim = static_cast<std::int64_t>(m.patch_size()) * m.patch_size();
  mc.dropout = m.dropout();
  mc.tie_embeddings = m.tie_embeddings();
  mc.compute = compute_dtype(c);
  return mc;
}

Trainer::Trainer(const config::Config& config, TrainerOptions options)
    : config_(config), options_(options), model_config_(model_config(config)) {
  const config::Train& t = config_.train();
  check_device(config_, options_);
  const bool cuda = config_.device() == "cuda";
  std::shared_ptr<comm::Communicator> device_comm = options_.device_comm;
  if (cuda && is_nccl(options_.comm)) {  // a world of one (check_device): nccl carries the gradients only
    device_comm = options_.comm;
    options_.comm = nullptr;
  }
  const data::DatasetPair datasets = data::make_datasets(data_spec(config_));
  const std::int64_t seq = datasets.train->info().seq_len;
  if (seq > model_config_.max_seq_len) {
    throw ConfigError("model.max_seq_len",
                      fmt::format("the data has sequences of {} but max_seq_len is {}; raise "
                                  "model.max_seq_len",
                                  seq, model_config_.max_seq_len));
  }
  layout_ = nn::declare_parameters(model_config_);
  comm_ = options_.comm ? options_.comm : single_process_communicator();
  sharding::EngineOptions eo;
  eo.stage = config_.parallel().zero_stage();
  eo.bucket_mb = config_.parallel().bucket_mb();
  eo.tied_embeddings = model_config_.tie_embeddings;
  eo.seed = t.seed();
  eo.compute = compute_dtype(config_);
  eo.reduce = reduce_dtype(config_);
  eo.loss_scaling = loss_scaling(config_);
  engine_ = std::make_unique<sharding::Engine>(layout_, *comm_, eo);
  batch_ = t.micro_batch_size();
  seq_ = seq;
  if (!cuda) {
    model_ = std::make_unique<nn::Transformer>(model_config_, layout_, t.micro_batch_size(), seq);
    model_->bind(engine_->pointers());
  }
  if (!is_rank0()) options_.console = nullptr;
  checkpointer_ = std::make_unique<Checkpointer>(config_, *engine_, *comm_, options_.checkpoint_env);
  resumed_ = checkpointer_->resume(options_.console);
  if (resumed_) {
    step_ = resumed_->step;
    optimizer_steps_ = resumed_->optimizer_step;
  }
  if (cuda) start_device(device_comm);  // after the resume: the GPU starts from the host engine's state

  data::LoaderOptions lo;
  lo.name = "train";
  lo.micro_batch = t.micro_batch_size();
  lo.rank = comm_->rank();
  lo.world = comm_->world_size();
  lo.seed = t.seed();
  lo.start = resumed_ ? resumed_->data_position : 0;
  lo.shuffle = config_.data().shuffle();
  lo.prefetch = config_.data().prefetch();
  train_loader_ = std::make_unique<data::Loader>(datasets.train, lo);
  lo.name = "validation";
  lo.start = 0;
  lo.shuffle = false;
  lo.prefetch = 0;
  val_loader_ = std::make_unique<data::Loader>(datasets.val, lo);

  schedule_ = nn::LrSchedule{config_.optimizer().lr(), config_.schedule().warmup_steps(),
                             t.steps(), parse_decay(config_.schedule().decay()),
                             config_.schedule().min_lr_ratio()};
  if (options_.write_outputs && is_rank0()) {
    const std::filesystem::path out_dir = t.out_dir();
    if (!resumed_ && options_.restart == 0 && std::filesystem::exists(out_dir / "metrics.jsonl")) {
      throw ConfigError("train.out_dir",
                        fmt::format("'{}' already holds a run (metrics.jsonl); nothing there is "
                                    "overwritten: choose a new directory with --set "
                                    "train.out_dir=DIR, or move the old run away",
                                    out_dir.string()));
    }
    // A resumed run continues its metrics.jsonl (steps after the checkpoint
    // that a crash cut short appear again, from the resumed step on).
    metrics_ = std::make_unique<MetricsWriter>(out_dir, resumed_.has_value() || options_.restart > 0);
    const std::filesystem::path cfg_path = out_dir / "config.json";
    std::ofstream out(cfg_path);
    out << config_to_json(config_);
    if (!out.flush()) throw IoError(fmt::format("cannot write '{}'", cfg_path.string()));
  }
  if (const std::optional<TraceSteps> traced = parse_trace_steps(t.trace_steps())) {
    std::filesystem::create_directories(t.out_dir());
    tracer_ = std::make_unique<Tracer>(
        comm_->rank(), *traced, layout_.num_blocks(), t.grad_accum_steps(),
        std::filesystem::absolute(t.out_dir()) / fmt::format("trace_rank_{}.json", comm_->rank()), *engine_);
    comm_->set_op_observer(tracer_.get());
  }
}

// Builds the GPU model and engine from the host engine's state (fresh or
// resumed). Only reached in CUDA builds (check_device refuses the others).
void Trainer::start_device(const std::shared_ptr<comm::Communicator>& device_comm) {
#if DTRAIN_HAVE_CUDA
  device_comm_ = device_comm;
  CudaStepOptions o;
  o.bucket_mb = config_.parallel().bucket_mb();
  o.reduce = reduce_dtype(config_);
  o.micro_batch = batch_;
  o.seq_len = seq_;
  o.world_size = comm_->world_size();
  o.device_comm = device_comm_.get();
  cuda_ = make_cuda_step(model_config_, layout_, *engine_, o);
#else
  (void)device_comm;
  DTRAIN_CHECK(false, "device cuda in a build without CUDA");
#endif
}

std::int64_t Trainer::device_bytes() const { return cuda_ ? cuda_->device_bytes() : 0; }

Trainer::~Trainer() {
  if (tracer_) comm_->set_op_observer(nullptr);  // the communicator may outlive the tracer
}

nn::BlockHooks& Trainer::hooks() {
  if (tracer_ && tracer_->active()) return *tracer_;
  return *engine_;
}

void Trainer::record_live(const StepResult& r, double compute_s, double data_wait_s) {
  if (options_.live_metrics == nullptr) return;
  const double tokens_per_s = r.seconds > 0.0 ? static_cast<double>(tokens_per_step()) / r.seconds : 0.0;
  options_.live_metrics->record_step({r.step, r.loss, r.lr, r.seconds, compute_s, data_wait_s, tokens_per_s,
                                      model_config_.flops_per_token(seq_) * tokens_per_s});
  const SaveTimes& save = checkpointer_->last_save();
  if (save.step >= 0 && save.step != live_save_step_) {
    live_save_step_ = save.step;
    options_.live_metrics->record_checkpoint(save.write_s, save.blocked_s);
  }
}

std::int64_t Trainer::tokens_per_step() const {
  return static_cast<std::int64_t>(config_.train().grad_accum_steps()) * batch_ * seq_ *
         comm_->world_size();
}

StepResult Trainer::step() {
  const auto t0 = Clock::now();
  if (options_.heartbeat != nullptr) options_.heartbeat->set_phase(Phase::forward, step_);
  if (tracer_) tracer_->begin_step(step_ + 1);
  const LocalStep local = cuda_ ? device_step(t0) : host_step(t0);
  // The loss of the whole global batch (the mean over ranks), and whether any
  // rank was asked to stop: every rank sees the same answer at this boundary.
  // The same all-reduce tells whether every rank's part of a background
  // checkpoint is done (the mean of 0/1 flags is 1 exactly when all are 1).
  const int signal = stop_signal();
  float shared[4] = {local.loss, signal != 0 ? 1.0f : 0.0f,
                     static_cast<float>(signal), checkpointer_->ready() ? 1.0f : 0.0f};
  if (comm_->world_size() > 1) comm_->allreduce(shared, 4, DType::f32, comm::ReduceOp::avg).wait();
  ++step_;
  if (checkpointer_->in_flight() && shared[3] == 1.0f) checkpointer_->advance();
  StepResult result{step_, shared[0], local.lr, static_cast<float>(local.norm), seconds_since(t0)};
  if (shared[1] > 0.0f) result.stop_signal = signal != 0 ? signal : static_cast<int>(shared[2] / shared[1] + 0.5f);
  if (tracer_) tracer_->end_step();
  record_live(result, local.compute_s, local.data_wait_s);
  return result;
}

// The next training micro-batch; adds the time spent waiting for it to
// data_wait. Shared by the CPU and GPU steps. The batch stays valid until
// the next call.
nn::ModelInputs Trainer::next_micro_batch(int micro, double& data_wait) {
  const auto wait_start = Clock::now();
  const data::Batch& batch = train_loader_->next(std::chrono::seconds(config_.parallel().timeout_s()));
  const auto wait_end = Clock::now();
  data_wait += std::chrono::duration<double>(wait_end - wait_start).count();
  if (tracer_) {
    tracer_->span("data wait", wait_start, wait_end);
    tracer_->set_micro(micro);
  }
  if (options_.testonly_slow_ms > 0 && micro == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(options_.testonly_slow_ms));
  }
  return nn::ModelInputs{batch.tokens.data(), batch.patches.data(), batch.targets.data()};
}

Trainer::LocalStep Trainer::host_step(Clock::time_point t0) {
  const config::Train& t = config_.train();
  const int accum = t.grad_accum_steps();
  engine_->begin_step();
  float loss_sum = 0.0f;
  double data_wait = 0.0;
  for (int micro = 0; micro < accum; ++micro) {
    const nn::ModelInputs inputs = next_micro_batch(micro, data_wait);
    engine_->set_sync(micro == accum - 1);  // accumulate locally, communicate once
    const nn::ForwardResult fwd =
        model_->forward(inputs, hooks(), true, nn::StepKey{t.seed(), step_, micro, comm_->rank() * t.micro_batch_size()});
    if (options_.heartbeat != nullptr) options_.heartbeat->set_phase(Phase::backward, step_);
    model_->backward(hooks(), engine_->loss_scale() / static_cast<float>(accum));
    loss_sum += static_cast<float>(fwd.loss);
  }
  if (options_.heartbeat != nullptr) options_.heartbeat->set_phase(Phase::optimizer, step_);
  const auto sync_start = Clock::now();
  const double compute_s = std::chrono::duration<double>(sync_start - t0).count() - data_wait;
  engine_->finish_backward();
  const auto optimizer_start = Clock::now();
  if (tracer_) tracer_->span("grad sync", sync_start, optimizer_start);
  const double norm = engine_->grad_norm();
  const config::Optimizer& o = config_.optimizer();
  const float clip = nn::clip_factor(norm, o.grad_clip());
  const float lr = schedule_.at(step_);
  const nn::AdamWHyper hyper{lr, o.beta1(), o.beta2(), o.eps(), o.weight_decay()};
  checkpointer_->before_update();  // an async save may still be copying the state
  if (engine_->step(hyper, optimizer_steps_ + 1, clip)) ++optimizer_steps_;  // a skipped fp16 step does not count
  if (tracer_) tracer_->span("optimizer", optimizer_start, Clock::now());
  return LocalStep{loss_sum / static_cast<float>(accum), lr, norm, compute_s, data_wait};
}

// The GPU step: the micro-batches only queue work, so the host runs ahead
// until finish_step() reads the loss and the norm (its one synchronisation).
// compute_s is therefore the whole step less the data waits.
Trainer::LocalStep Trainer::device_step(Clock::time_point t0) {
  const config::Train& t = config_.train();
  const int accum = t.grad_accum_steps();
  cuda_->begin_step();
  double data_wait = 0.0;
  for (int micro = 0; micro < accum; ++micro) {
    const nn::ModelInputs inputs = next_micro_batch(micro, data_wait);
    cuda_->micro_batch(inputs, nn::StepKey{t.seed(), step_, micro, comm_->rank() * t.micro_batch_size()},
                       micro == accum - 1, cuda_->loss_scale() / static_cast<float>(accum));
  }
  if (options_.heartbeat != nullptr) options_.heartbeat->set_phase(Phase::optimizer, step_);
  const auto sync_start = Clock::now();
  const config::Optimizer& o = config_.optimizer();
  const float lr = schedule_.at(step_);
  const nn::AdamWHyper hyper{lr, o.beta1(), o.beta2(), o.eps(), o.weight_decay()};
  const CudaStepResult r = cuda_->finish_step(hyper, optimizer_steps_ + 1, o.grad_clip());
  if (r.applied) ++optimizer_steps_;  // a skipped fp16 step does not count
  if (tracer_) tracer_->span("grad sync and optimizer", sync_start, Clock::now());
  return LocalStep{r.loss, lr, r.grad_norm, seconds_since(t0) - data_wait, data_wait};
}

void Trainer::save_checkpoint() {
  if (options_.heartbeat != nullptr) options_.heartbeat->set_phase(Phase::checkpoint, step_);
  if (cuda_) {  // the host engine is what checkpoints read; an async save may still be copying it
    checkpointer_->before_update();
    cuda_->download_state(*engine_);
  }
  checkpointer_->save(step_, train_loader_->position(), optimizer_steps_);
}

void Trainer::start_checkpoint() {
  if (cuda_) {
    checkpointer_->before_update();
    cuda_->download_state(*engine_);
  }
  checkpointer_->start_save(step_, train_loader_->position(), optimizer_steps_);
}

void Trainer::finish_checkpoint() { checkpointer_->finish_save(); }

EvalResult Trainer::evaluate() {
  const auto timeout = std::chrono::seconds(config_.parallel().timeout_s());
  if (options_.heartbeat != nullptr) options_.heartbeat->set_phase(Phase::eval, step_);
  val_loader_->reset(0);
  double loss_sum = 0.0;
  std::int64_t correct = 0, count = 0;
  const int batches = config_.train().eval_batches();
  if (cuda_) cuda_->begin_eval();
  for (int i = 0; i < batches; ++i) {
    const data::Batch& batch = val_loader_->next(timeout);
    const nn::ModelInputs inputs{batch.tokens.data(), batch.patches.data(),
                                 batch.targets.data()};
    if (cuda_) {
      cuda_->eval_batch(inputs);
      continue;
    }
    const nn::ForwardResult r = model_->forward(inputs, *engine_, false, nn::StepKey{});
    loss_sum += r.loss;
    correct += r.correct;
    count += r.count;
  }
  if (cuda_) {  // the mean over every scored row; the batches are of equal size
    const nn::ForwardResult r = cuda_->end_eval();
    loss_sum = static_cast<double>(r.loss) * batches;
    correct = r.correct;
    count = r.count;
  }
  if (comm_->world_size() > 1) {  // every rank evaluated its slice of each batch
    float totals[3] = {static_cast<float>(loss_sum), static_cast<float>(correct), static_cast<float>(count)};
    comm_->allreduce(totals, 3, DType::f32, comm::ReduceOp::sum).wait();
    loss_sum = totals[0] / static_cast<float>(comm_->world_size());
    correct = static_cast<std::int64_t>(totals[1]);
    count = static_cast<std::int64_t>(totals[2]);
  }
  EvalResult e;
  e.loss = loss_sum / batches;
  if (model_config_.kind == nn::ModelConfig::Kind::classifier) {
    e.accuracy = static_cast<double>(correct) / static_cast<double>(count);
  } else {
    e.perplexity = std::exp(e.loss);
  }
  return e;
}

// A stop signal (preemption) saves at once, before the evaluation that may
// follow, so the checkpoint exists even if the grace period ends during it.
bool Trainer::checkpoint_after(const StepResult& r) {
  const bool last = r.step == config_.train().steps() && config_.checkpoint().every_steps() > 0;
  if (r.stop_signal != 0 || last) {
    save_checkpoint();  // nothing left to overlap it with
    return true;
  }
  if (!checkpointer_->due(r.step)) return false;
  config_.checkpoint().async() ? start_checkpoint() : save_checkpoint();
  return true;
}

std::optional<std::filesystem::path> Trainer::trace_file() const {
  if (!tracer_ || !tracer_->written()) return std::nullopt;
  return tracer_->file();
}

TrainSummary Trainer::run() {
  const config::Train& t = config_.train();
  const auto start = Clock::now();
  TrainSummary summary;
  double window_seconds = 0.0;
  std::int64_t window_steps = 0;
  double timed_seconds = 0.0;  // all steps but the first, which pays one-time set-up
  StepResult r;
  while (step_ < t.steps()) {
    r = step();
    window_seconds += r.seconds;
    ++window_steps;
    if (r.step > 1) timed_seconds += r.seconds;
    if (r.step % t.log_every() == 0 || r.step == t.steps()) {
      const double step_ms = 1e3 * window_seconds / static_cast<double>(window_steps);
      const double tps = static_cast<double>(tokens_per_step()) * 1e3 / step_ms;
      if (metrics_) metrics_->log_step(r.step, r.loss, r.lr, r.grad_norm, tps, step_ms);
      log_progress(r, tps, step_ms, seconds_since(start));
      window_seconds = 0.0;
      window_steps = 0;
    }
    if (options_.after_step && r.stop_signal == 0) options_.after_step(r);
    const auto checkpoint_start = Clock::now();
    if (checkpoint_after(r) && tracer_) tracer_->span("checkpoint", checkpoint_start, Clock::now());
    if ((t.eval_every() > 0 && r.step % t.eval_every() == 0) || r.step == t.steps()) {
      const auto eval_start = Clock::now();
      const EvalResult e = evaluate();
      if (tracer_) tracer_->span("eval", eval_start, Clock::now());
      if (metrics_) metrics_->log_eval(r.step, e.loss, e.accuracy, e.perplexity);
      log_eval(e);
      if (r.step == t.steps()) summary.final_eval = e;
    }
    if (r.stop_signal != 0) {
      if (options_.console != nullptr) {
        *options_.console << fmt::format("stopping after step {} on signal {}: checkpoint saved in {}\n", r.step,
                                         r.stop_signal, checkpointer_->root().string());
      }
      summary.stopped_by_signal = r.stop_signal;
      break;
    }
    if (tracer_) tracer_->end_iteration();  // writes the trace after its last step
  }
  finish_checkpoint();  // a save still in flight commits before the run ends
  if (tracer_) tracer_->finish();  // a run stopped before the last traced step
  // "end" means train.steps were reached: a run stopped by a signal resumes
  // later and appends to the same file, which then reads as one run.
  if (metrics_ && summary.stopped_by_signal == 0) metrics_->log_end(step_, r.loss);
  summary.steps = step_;
  summary.final_loss = r.loss;
  summary.seconds = seconds_since(start);
  if (step_ > 1 && timed_seconds > 0.0) {
    summary.tokens_per_s =
        static_cast<double>(tokens_per_step() * (step_ - 1)) / timed_seconds;
  }
  return summary;
}

void Trainer::log_progress(const StepResult& r, double tokens_per_s, double step_ms,
                           double elapsed) {
  if (options_.console == nullptr) return;
  const std::int64_t total = config_.train().steps();
  const double eta = elapsed / static_cast<double>(r.step) * static_cast<double>(total - r.step);
  *options_.console << fmt::format(
      "step {:>{}}/{} | loss {:.4f} | lr {:.3e} | grad_norm {:.3f} | {:.0f} tok/s | "
      "{:.1f} ms/step | ETA {}\n",
      r.step, std::to_string(total).size(), total, r.loss, r.lr, r.grad_norm, tokens_per_s,
      step_ms, format_duration(eta));
  options_.console->flush();
}

void Trainer::log_eval(const EvalResult& e) {
  if (options_.console == nullptr) return;
  std::string extra;
  if (e.accuracy) extra = fmt::format(" | accuracy {:.2f}%", 100.0 * *e.accuracy);
  if (e.perplexity) extra = fmt::format(" | perplexity {:.3f}", *e.perplexity);
  *options_.console << fmt::format("eval step {} | loss {:.4f}{}\n", step_, e.loss, extra);
  options_.console->flush();
}

}  // namespace dtrain::worker
