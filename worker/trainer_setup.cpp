// Trainer's set-up: the device and the communicator its memory travels on,
// the engine and the model, the resume, the data loaders and the outputs.
#include <fstream>
#include <iostream>
#include <sstream>
#include <string_view>

#include "comm/connect.h"
#include "comm/memory_store.h"
#include "core/error.h"
#include "dtrain/config.h"
#include "nn/cpu/host_device.h"
#include "nn/cuda_device.h"
#include "worker/config.h"
#include "worker/precision.h"
#include "worker/profiler.h"
#include "worker/tensorboard.h"
#include "worker/trace.h"
#include "worker/trainer.h"

namespace dtrain::worker {
namespace {

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

std::chrono::milliseconds device_timeout(const config::Config& c) {
  return std::chrono::seconds(c.parallel().timeout_s());
}

// device "cuda": the communicators this trainer was given must fit; a
// ConfigError naming the field otherwise. The config's own rules come first
// (validate_config), so they are reported the same way on every machine.
void check_device_comms(const config::Config& c, const TrainerOptions& o) {
  const std::string& device = c.device();
  if (device == "cpu") return;
  if (device != "cuda") {
    throw ConfigError("device", fmt::format("'{}' is not a device; use \"cpu\" or \"cuda\"", device));
  }
  const std::string& backend = c.parallel().backend();
  if (backend != "auto" && backend != "nccl") {
    throw ConfigError("parallel.backend", fmt::format("'{}' cannot move GPU memory: device cuda uses nccl; use auto "
                                                      "or nccl", backend));
  }
  const int world = o.comm ? o.comm->world_size() : 1;
  if (world > 1 && (is_nccl(o.comm) || !is_nccl(o.device_comm))) {
    throw ConfigError("parallel.backend",
                      fmt::format("device cuda on {} ranks needs two communicators: nccl for the engine (gradients, "
                                  "parameters) and gloo or mpi for the host-side collectives (loss, checkpoints), "
                                  "but was given {} and {}",
                                  world, o.comm->backend_name(),
                                  o.device_comm ? o.device_comm->backend_name() : "no device communicator"));
  }
  if (o.device_comm && o.device_comm->world_size() != world) {
    throw ConfigError("parallel.backend", fmt::format("the nccl communicator has {} ranks, the job {}",
                                                      o.device_comm->world_size(), world));
  }
}

}  // namespace

nn::ModelConfig model_config(const config::Config& c) {
  const config::Model& m = c.model();
  nn::ModelConfig mc;
  mc.kind = m.kind() == "lm" ? nn::ModelConfig::Kind::lm : nn::ModelConfig::Kind::classifier;
  mc.input = m.input() == "patches" ? nn::ModelConfig::Input::patches : nn::ModelConfig::Input::tokens;
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
  mc.norm = m.norm() == "rmsnorm" ? nn::ModelConfig::Norm::rmsnorm : nn::ModelConfig::Norm::layernorm;
  mc.norm_eps = m.has_norm_eps() ? m.norm_eps() : 1e-5f;
  mc.position = m.position() == "rope" ? nn::ModelConfig::Position::rope : nn::ModelConfig::Position::learned;
  mc.rope_theta = m.has_rope_theta() ? m.rope_theta() : 10000.0;
  mc.mlp = m.mlp() == "swiglu"      ? nn::ModelConfig::Mlp::swiglu
           : m.mlp() == "gelu_tanh" ? nn::ModelConfig::Mlp::gelu_tanh
                                    : nn::ModelConfig::Mlp::gelu;
  mc.n_kv_heads = m.n_kv_heads();
  mc.bias = !m.has_bias() || m.bias();
  mc.recompute = m.recompute() == "full"        ? nn::ModelConfig::Recompute::full
                 : m.recompute() == "selective" ? nn::ModelConfig::Recompute::selective
                                                : nn::ModelConfig::Recompute::none;
  mc.compute = compute_dtype(c);
  return mc;
}

MemoryPlan plan_run(const config::Config& config, int world) {
  const data::DatasetPair datasets = data::make_datasets(data_spec(config));
  return plan_memory(config, world, datasets.train->info().seq_len);
}

Trainer::Trainer(const config::Config& config, TrainerOptions options)
    : config_(config), options_(std::move(options)), model_config_(model_config(config)) {
  check_device_comms(config_, options_);
  std::shared_ptr<comm::Communicator> device_comm = options_.device_comm;
  if (config_.device() == "cuda" && is_nccl(options_.comm)) {  // a world of one: nccl carries the engine's only
    device_comm = options_.comm;
    options_.comm = nullptr;
  }
  const data::DatasetPair datasets = data::make_datasets(data_spec(config_));
  const std::int64_t seq = datasets.train->info().seq_len;
  if (seq > model_config_.max_seq_len) {
    throw ConfigError("model.max_seq_len", fmt::format("the data has sequences of {} but max_seq_len is {}; raise "
                                                       "model.max_seq_len",
                                                       seq, model_config_.max_seq_len));
  }
  layout_ = nn::declare_parameters(model_config_);
  comm_ = options_.comm ? options_.comm : single_process_communicator();
  // Before anything large is allocated: a run that cannot fit stops here, saying why.
  const int world = comm_->world_size();
  check_fits(plan_memory(config_, world, seq), available_memory_bytes(), options_.ranks_on_node, config_,
             [&](const config::Config& changed) { return plan_memory(changed, world, seq); });
  connect_device(device_comm);
  build_engine_and_model(seq);
  if (!is_rank0()) options_.console = nullptr;
  resume_checkpoint();
  if (options_.eval_only && !resumed_) throw no_checkpoint_to_score();
  make_loaders(datasets);
  warn_schedule_change();
  open_outputs();
}

// The device the model and the engine live on, and the communicator that
// moves its memory: the host communicator on the CPU, nccl on a GPU (a world
// of one of its own when none was given).
void Trainer::connect_device(const std::shared_ptr<comm::Communicator>& device_comm) {
  const bool cuda = config_.device() == "cuda";
  if (options_.device) {
    device_ = options_.device;
  } else if (cuda) {
    device_ = nn::make_cuda_device(options_.cuda_device, device_timeout(config_));
  } else {
    device_ = std::make_shared<nn::cpu::HostDevice>(nn::cpu::HostDeviceOptions{.timeout = device_timeout(config_)});
  }
  if (device_comm) {
    data_comm_ = device_comm;
  } else if (cuda) {
    comm::CommunicatorOptions o;
    o.name = "device";
    o.timeout = device_timeout(config_);
    data_comm_ = std::make_shared<comm::Communicator>(
        comm::make_nccl_backend(0, 1, std::make_shared<comm::MemoryStore>(), options_.cuda_device, o.timeout), o);
  } else {
    data_comm_ = comm_;
  }
}

void Trainer::build_engine_and_model(std::int64_t seq) {
  const config::Train& t = config_.train();
  sharding::EngineOptions eo;
  eo.stage = config_.parallel().zero_stage();
  eo.bucket_mb = config_.parallel().bucket_mb();
  eo.first_bucket_mb = config_.parallel().first_bucket_mb();
  eo.max_live_mb = config_.parallel().zero3_max_live_mb();
  eo.tied_embeddings = model_config_.tie_embeddings;
  eo.seed = t.seed();
  eo.compute = compute_dtype(config_);
  eo.reduce = reduce_dtype(config_);
  eo.loss_scaling = loss_scaling(config_);
  eo.testonly_unfenced_collective = options_.testonly_unfenced_collective;
  engine_ = std::make_unique<sharding::Engine>(layout_, *data_comm_, *device_, eo);
  batch_ = t.micro_batch_size();
  seq_ = seq;
  model_ = device_->make_model(model_config_, layout_, batch_, seq_);
  model_->bind(engine_->pointers());
}

void Trainer::resume_checkpoint() {
  checkpointer_ = std::make_unique<Checkpointer>(config_, *engine_, *comm_, options_.checkpoint_env);
  resumed_ = checkpointer_->resume(options_.console);
  if (resumed_) {
    step_ = resumed_->step;
    optimizer_steps_ = resumed_->optimizer_step;
  }
}

// --eval-only without a checkpoint: most often a run that never saved one.
ConfigError Trainer::no_checkpoint_to_score() const {
  return ConfigError("checkpoint.every_steps",
                     fmt::format("--eval-only scores a checkpoint, but none was loaded from '{}' (checkpoint.resume "
                                 "= {}): train with checkpoint saves on, e.g. --set checkpoint.every_steps=500 (the "
                                 "last step is then saved too), or set checkpoint.resume to a step's path",
                                 checkpointer_->root().string(), config_.checkpoint().resume()));
}

// A resumed run whose train.steps differs from the run that saved the
// checkpoint goes on with the schedule of the new train.steps: the cosine (or
// linear) decay is stretched or squeezed and the learning rate jumps at once.
// Kept (a longer run is often what is wanted), but said plainly.
void Trainer::warn_schedule_change() const {
  if (!resumed_ || options_.console == nullptr || options_.eval_only) return;  // --eval-only trains nothing
  const std::int64_t saved = resumed_->saved_train_steps;
  const std::int64_t now = config_.train().steps();
  if (saved <= 0 || saved == now || config_.schedule().decay() == "constant") return;
  nn::LrSchedule before = schedule_;
  before.total_steps = saved;
  *options_.console << fmt::format(
      "warning: train.steps is {} but the run saved at step {} had {}: the {} schedule now decays over {} steps, "
      "so the learning rate of step {} changes from {:.3e} to {:.3e}; set train.steps={} to keep the original "
      "horizon\n",
      now, step_, saved, config_.schedule().decay(), now, step_ + 1, before.at(step_), schedule_.at(step_), saved);
}

void Trainer::make_loaders(const data::DatasetPair& datasets) {
  const config::Train& t = config_.train();
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
  train_samples_ = datasets.train->size();
  val_samples_ = datasets.val->size();
  schedule_ = nn::LrSchedule{config_.optimizer().lr(), config_.schedule().warmup_steps(), t.steps(),
                             parse_decay(config_.schedule().decay()), config_.schedule().min_lr_ratio()};
}

namespace {

// std::filesystem's errors become IoErrors naming the path and what to do.
void make_directory(const std::filesystem::path& dir, const char* field) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    throw IoError(fmt::format("cannot create {} '{}': {}; choose a writable folder with --set {}=DIR", field,
                              dir.string(), ec.message(), field));
  }
}

// Whether metrics.jsonl ends a finished run: an "end" line with no step line after it.
bool ends_finished_run(const std::filesystem::path& metrics) {
  std::ifstream in(metrics);
  bool finished = false;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(R"({"event":"end")", 0) == 0) finished = true;
    if (line.rfind(R"({"step":)", 0) == 0) finished = false;
  }
  return finished;
}

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

// Whether this invocation continues what out_dir holds (appending to its
// metrics.jsonl) rather than starting it. A resumed run, a launcher's restart
// and --eval-only continue; an unfinished run that saved no checkpoint yet
// (stopped before its first save) starts again from step 0 in place; a
// finished run is never written over.
bool Trainer::continues_run_in(const std::filesystem::path& out_dir) {
  if (resumed_ || options_.restart > 0 || options_.eval_only) return true;
  std::error_code ec;
  const std::filesystem::path metrics = out_dir / "metrics.jsonl";
  if (!std::filesystem::exists(metrics, ec)) return false;
  if (ends_finished_run(metrics)) {
    throw ConfigError("train.out_dir",
                      fmt::format("'{}' already holds a finished run (metrics.jsonl) and no checkpoint to go on "
                                  "from; nothing there is overwritten: choose a new directory with --set "
                                  "train.out_dir=DIR, or move the old run away",
                                  out_dir.string()));
  }
  restarted_in_place_ = true;
  if (options_.console != nullptr) {
    *options_.console << fmt::format("note: '{}' holds a run stopped before its first checkpoint (none in '{}'); "
                                     "it starts again from step 0 in place and metrics.jsonl goes on (set "
                                     "checkpoint.every_steps to save along the way)\n",
                                     out_dir.string(), checkpointer_->root().string());
  }
  return true;
}

// config.json holds the first invocation's config. A later one (a resume, a
// restart) with a different config writes config.2.json, config.3.json, ...:
// each invocation's config is kept and nothing already there is overwritten.
// Returns the file that holds this invocation's config.
std::filesystem::path Trainer::write_run_config(const std::filesystem::path& out_dir) const {
  const std::string text = config_to_json(config_);
  std::filesystem::path path = out_dir / "config.json";
  for (int n = 2;; ++n) {
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) break;
    if (read_text(path) == text) return path;  // this config is there already
    path = out_dir / fmt::format("config.{}.json", n);
  }
  std::ofstream out(path);
  out << text;
  if (!out.flush()) throw IoError(fmt::format("cannot write '{}'; choose a writable train.out_dir", path.string()));
  return path;
}

void Trainer::open_outputs() {
  const config::Train& t = config_.train();
  if (options_.write_outputs && is_rank0()) {
    const std::filesystem::path out_dir = t.out_dir();
    // A continued run appends to its metrics.jsonl (steps after the
    // checkpoint that a crash cut short appear again, from the resumed step on).
    metrics_ = std::make_unique<MetricsWriter>(out_dir, continues_run_in(out_dir));
    if (options_.eval_only) return;  // scores a checkpoint: no config, no events
    config_file_ = write_run_config(out_dir);
    open_tensorboard();
  }
  if (const std::optional<TraceSteps> traced = parse_trace_steps(t.trace_steps())) {
    make_directory(t.out_dir(), "train.out_dir");
    std::error_code ec;
    tracer_ = std::make_unique<Tracer>(
        comm_->rank(), *traced, layout_.num_blocks(), t.grad_accum_steps(),
        std::filesystem::absolute(t.out_dir(), ec) / fmt::format("trace_rank_{}.json", comm_->rank()), *engine_);
    comm_->set_op_observer(tracer_.get());
  }
  if (const std::optional<ProfileSchedule> profiled = parse_profile_steps(t.profile_steps())) {
    nn::BlockHooks& inner = tracer_ ? static_cast<nn::BlockHooks&>(*tracer_) : *engine_;
    // Without outputs (write_outputs false) the profile is recorded and gathered, and written nowhere.
    profiler_ = std::make_unique<Profiler>(*profiled, step_, *comm_, *device_, layout_.num_blocks(),
                                           t.grad_accum_steps(), inner,
                                           options_.write_outputs ? t.tensorboard_dir() : std::string(),
                                           options_.write_outputs && is_rank0() ? options_.console : nullptr,
                                           std::cerr);
    profiler_->tracer().set_next_observer(tracer_.get());
    comm_->set_op_observer(&profiler_->tracer());
  }
  if (tracer_ || profiler_) {
    checkpointer_->set_phase_observer(
        [this](const char* name, Clock::time_point start, Clock::time_point end) { trace_span(name, start, end); });
  }
}

// A resumed or restarted run writes a new file that starts at its first
// step, where TensorBoard drops the steps an earlier file logged past it.
void Trainer::open_tensorboard() {
  const config::Train& t = config_.train();
  if (t.tensorboard_dir().empty()) return;
  const bool continuing = resumed_.has_value() || options_.restart > 0 || restarted_in_place_;
  tensorboard_ = std::make_unique<TensorBoardLog>(t.tensorboard_dir(),
                                                  continuing ? std::optional<std::int64_t>(step_ + 1) : std::nullopt,
                                                  config_to_json(config_), std::cerr);
  if (t.histogram_every() > 0 && !TensorBoardLog::gradient_histograms(*engine_) && options_.console != nullptr) {
    *options_.console << "note: train.histogram_every writes weight histograms only: gradients are whole on every "
                         "rank only at ZeRO stage 0 without fp16 loss scaling\n";
  }
}

}  // namespace dtrain::worker
