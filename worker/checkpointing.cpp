#include "worker/checkpointing.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <cstring>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "core/error.h"
#include "worker/config.h"
#include "worker/loss_scale_checkpoint.h"

namespace dtrain::worker {
namespace {

namespace ck = dtrain::checkpoint;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// checkpoint.dir, or out_dir/checkpoints when unset.
std::filesystem::path checkpoint_root(const config::Config& c) {
  if (!c.checkpoint().dir().empty()) return c.checkpoint().dir();
  return std::filesystem::path(c.train().out_dir()) / "checkpoints";
}

// Every rank's serialized bytes, on every rank (sizes first, then the bytes
// padded to the largest).
std::vector<std::string> allgather_bytes(comm::Communicator& comm, const std::string& mine) {
  const int world = comm.world_size();
  std::int32_t size = static_cast<std::int32_t>(mine.size());
  std::vector<std::int32_t> sizes(static_cast<std::size_t>(world));
  comm.allgather(&size, sizes.data(), 1, DType::i32).wait();
  std::size_t max = 0;
  for (auto s : sizes) max = std::max<std::size_t>(max, static_cast<std::size_t>(s));
  const std::size_t words = (max + 3) / 4;
  std::vector<std::int32_t> padded(words, 0), all(words * static_cast<std::size_t>(world));
  std::memcpy(padded.data(), mine.data(), mine.size());
  if (words > 0) comm.allgather(padded.data(), all.data(), words, DType::i32).wait();
  std::vector<std::string> out;
  for (int r = 0; r < world; ++r) {
    const auto* bytes = reinterpret_cast<const char*>(all.data() + static_cast<std::size_t>(r) * words);
    out.emplace_back(bytes, static_cast<std::size_t>(sizes[static_cast<std::size_t>(r)]));
  }
  return out;
}

// Rank 0 decides, every rank learns the outcome and rank 0's reason: an
// error on rank 0 becomes an error on every rank instead of a rank waiting
// for a commit that never comes. `error` is rank 0's ("" = success).
void agree(comm::Communicator& comm, const std::string& error, const std::string& what) {
  const std::string reason = allgather_bytes(comm, comm.rank() == 0 ? error : std::string())[0];
  if (reason.empty()) return;
  if (comm.rank() == 0) throw IoError(fmt::format("{}: {}", what, reason));
  throw IoError(fmt::format("{}: {} (reported by rank 0)", what, reason));
}

// train.steps of the config a manifest recorded; 0 when it cannot be read.
std::int64_t saved_train_steps(const ck::Manifest& manifest) {
  const nlohmann::json config = nlohmann::json::parse(manifest.config_json(), nullptr, /*allow_exceptions=*/false);
  if (!config.is_object() || !config.contains("train")) return 0;
  const nlohmann::json& steps = config["train"].value("steps", nlohmann::json());
  return steps.is_number_integer() ? steps.get<std::int64_t>() : 0;
}

}  // namespace

Checkpointer::Checkpointer(const config::Config& config, sharding::Engine& engine, comm::Communicator& comm,
                           ck::Env* env)
    : config_(config), engine_(engine), comm_(comm), env_(env != nullptr ? *env : *ck::default_env()),
      root_(checkpoint_root(config)) {
  if (config_.checkpoint().async()) {  // the snapshot buffer, touched now rather than in the first save
    std::size_t total = 0;
    for (const auto& s : engine_.owned_state()) total += static_cast<std::size_t>(s.range.size);
    snapshot_.assign(total, 0.0f);
  }
}

Checkpointer::~Checkpointer() {
  if (worker_.joinable()) worker_.join();
}

// Committed steps newer than the one resumed from failed to verify. They are
// kept (renamed "<step dir>.corrupt", never deleted) so this run can commit
// those step numbers again and a person can still inspect them.
void Checkpointer::set_aside_corrupt_steps(std::int64_t resumed_step, std::ostream* console) {
  comm_.barrier().wait();  // every rank has finished reading
  if (comm_.rank() == 0) {
    for (const ck::StepReport& s : set_aside_) {
      if (s.step <= resumed_step || !env_.is_directory(s.dir) || s.dir.filename().string().rfind("step_", 0) != 0) {
        continue;
      }
      std::filesystem::path target = s.dir.string() + ".corrupt";
      for (int i = 1; env_.exists(target); ++i) target = fmt::format("{}.corrupt.{}", s.dir.string(), i);
      env_.rename(s.dir, target);
      env_.sync_dir(root_);
      if (console != nullptr) *console << fmt::format("checkpoint: kept {} as {}\n", s.dir.string(), target.string());
    }
  }
  comm_.barrier().wait();
  set_aside_.clear();
}

bool Checkpointer::due(std::int64_t step) const {
  const int every = config_.checkpoint().every_steps();
  return every > 0 && step % every == 0;
}

// Rank 0 makes room for the step (refusing a committed one); every rank learns whether it could.
void Checkpointer::begin(std::int64_t step) {
  std::string error;
  if (comm_.rank() == 0) {
    try {
      env_.create_directories(root_);
      ck::prepare_step(env_, root_, step);
    } catch (const Error& e) {
      error = e.what();
    }
  }
  agree(comm_, error, fmt::format("preparing checkpoint step {} in '{}'", step, root_.string()));
}

// This rank's file, written and fsync'd; returns what rank 0 needs to commit:
// "1" + the file's records (a serialized Manifest part), or "0" + what failed.
// Never throws, so a rank that cannot write still takes part in the commit's
// collectives and every rank learns of the failure instead of waiting for it.
std::string Checkpointer::write_part(std::int64_t step, const std::vector<ck::RangeData>& ranges) {
  try {
    const ck::RankFileRecord record = ck::write_rank_file(env_, ck::pending_dir(root_, step), comm_.rank(), ranges);
    last_save_.bytes = record.size;
    ck::Manifest mine;
    ck::add_records(record, &mine);
    std::string part = "1";
    part.append(mine.SerializeAsString());
    return part;
  } catch (const std::exception& e) {
    return fmt::format("0rank {} could not write its file: {}", comm_.rank(), e.what());
  }
}

// Rank 0: the manifest of step `step` from every rank's part; IoError when a
// rank could not write its file.
ck::Manifest Checkpointer::manifest_from(const std::vector<std::string>& parts, const Pending& pending) const {
  ck::Manifest manifest = run_state_;
  for (const auto& bytes : parts) {
    if (bytes.empty() || bytes[0] != '1') throw IoError(bytes.empty() ? "a rank sent nothing" : bytes.substr(1));
    ck::Manifest piece;
    DTRAIN_CHECK(piece.ParseFromArray(bytes.data() + 1, static_cast<int>(bytes.size() - 1)),
                 "a rank's checkpoint records do not parse");
    manifest.MergeFrom(piece);
  }
  for (const nn::BlockSpec& b : engine_.layout().blocks()) {
    ck::Block* block = manifest.add_blocks();
    block->set_name(b.name);
    block->set_numel(b.numel);
  }
  manifest.set_step(pending.step);
  manifest.set_config_json(config_to_json(config_));
  manifest.set_world_size(comm_.world_size());
  manifest.set_zero_stage(config_.parallel().zero_stage());
  manifest.set_data_position(pending.data_position);
  manifest.set_optimizer_step(pending.optimizer_step);
  return manifest;
}

// Moves the save in flight on by one phase; every rank calls it at the same
// point, once every rank's background work is done (ready()).
//   writing -> committing: the rank files' records are gathered; rank 0
//     commits the step on the background thread (files only, no collectives).
//   committing -> done: every rank learns whether rank 0 committed.
void Checkpointer::advance() {
  DTRAIN_CHECK(pending_.has_value(), "advance() without a save in flight");
  const auto t0 = Clock::now();
  if (worker_.joinable()) worker_.join();
  Pending& p = *pending_;
  if (p.phase == Phase::writing) {
    last_save_.write_s = work_seconds_;
    const std::vector<std::string> parts = allgather_bytes(comm_, written_part_);
    p.phase = Phase::committing;
    commit_error_.clear();
    done_.store(true, std::memory_order_relaxed);
    if (comm_.rank() == 0) {
      try {
        ck::Manifest manifest = manifest_from(parts, p);
        done_.store(false, std::memory_order_relaxed);
        worker_ = std::thread([this, manifest = std::move(manifest)] {
          try {
            ck::commit_step(env_, root_, manifest);
            ck::remove_old_steps(env_, root_, config_.checkpoint().keep_last());
          } catch (const std::exception& e) {
            commit_error_ = e.what();
          }
          done_.store(true, std::memory_order_release);
        });
      } catch (const Error& e) {
        commit_error_ = e.what();
      }
    }
    p.blocked_s += seconds_since(t0);
    phase_done("checkpoint gather", t0);
    return;
  }
  const Pending done = p;
  pending_.reset();
  agree(comm_, commit_error_,
        fmt::format("committing checkpoint step {} in '{}' (committed steps are untouched)", done.step,
                    root_.string()));
  last_save_.step = done.step;
  last_save_.blocked_s = done.blocked_s + seconds_since(t0);
  phase_done("checkpoint commit", t0);
}

void Checkpointer::phase_done(const char* name, Clock::time_point start) const {
  if (phase_observer_) phase_observer_(name, start, Clock::now());
}

void Checkpointer::finish_save() {
  while (pending_) advance();  // each phase joins the background work it waits for
}

void Checkpointer::save(std::int64_t step, std::int64_t data_position, std::int64_t optimizer_step) {
  finish_save();
  const auto t0 = Clock::now();
  begin(step);
  capture_run_state();
  std::vector<ck::RangeData> ranges;
  for (const sharding::StateSlice& s : engine_.owned_state()) {
    ranges.push_back({ck::Range{s.tensor, s.block, s.range.offset, s.range.size}, s.data});
  }
  const auto w0 = Clock::now();
  written_part_ = write_part(step, ranges);
  work_seconds_ = seconds_since(w0);
  phase_done("checkpoint write", w0);
  pending_ = Pending{step, data_position, optimizer_step, 0.0, Phase::writing};
  finish_save();
  last_save_.blocked_s = seconds_since(t0);
}

// What the manifest records about the run besides the tensors, as of the
// step being saved (an async save commits steps later).
void Checkpointer::capture_run_state() {
  run_state_.Clear();
  save_loss_scale(engine_, run_state_);
}

// Copies the owned state into snapshot_ (allocated by the constructor when
// checkpoint.async is on, else by the first async save; reused after) and
// returns ranges over the copy. Runs on the background thread.
std::vector<ck::RangeData> Checkpointer::snapshot(const std::vector<sharding::StateSlice>& slices) {
  std::size_t total = 0;
  for (const auto& s : slices) total += static_cast<std::size_t>(s.range.size);
  if (snapshot_.size() != total) snapshot_.assign(total, 0.0f);
  std::vector<ck::RangeData> ranges;
  std::size_t at = 0;
  for (const auto& s : slices) {
    const auto n = static_cast<std::size_t>(s.range.size);
    if (n > 0) std::memcpy(snapshot_.data() + at, s.data, n * sizeof(float));
    ranges.push_back({ck::Range{s.tensor, s.block, s.range.offset, s.range.size}, snapshot_.data() + at});
    at += n;
  }
  return ranges;
}

// The copy runs on the background thread, before the write: the state does
// not change until the next optimizer update (forward and backward only read
// parameters and leave the moments alone), and before_update() holds that
// update back until the copy is done. So the training thread rarely waits
// for the copy at all (a few hundred MB take tens of ms, a step far longer).
void Checkpointer::start_save(std::int64_t step, std::int64_t data_position, std::int64_t optimizer_step) {
  finish_save();
  const auto t0 = Clock::now();
  begin(step);
  capture_run_state();
  copied_.store(false, std::memory_order_relaxed);
  done_.store(false, std::memory_order_relaxed);
  worker_ = std::thread([this, step, slices = engine_.owned_state()] {
    std::vector<ck::RangeData> ranges;
    std::string copy_error;
    try {
      ranges = snapshot(slices);
    } catch (const std::exception& e) {  // the first save allocating its buffer
      copy_error = fmt::format("0rank {} could not copy its state: {}", comm_.rank(), e.what());
    }
    copied_.store(true, std::memory_order_release);
    copied_.notify_all();
    const auto w0 = Clock::now();
    written_part_ = copy_error.empty() ? write_part(step, ranges) : copy_error;
    work_seconds_ = seconds_since(w0);
    done_.store(true, std::memory_order_release);
  });
  pending_ = Pending{step, data_position, optimizer_step, seconds_since(t0), Phase::writing};
  phase_done("checkpoint start", t0);
}

void Checkpointer::before_update() {
  if (!pending_ || copied_.load(std::memory_order_acquire)) return;
  const auto t0 = Clock::now();
  copied_.wait(false, std::memory_order_acquire);
  pending_->blocked_s += seconds_since(t0);
  phase_done("checkpoint copy wait", t0);
}

// Loads the step in `dir` into the engine. Each rank checks the files and
// the checksums of what it reads (no rank reads the whole step); the ranks
// then agree. Returns "" when every rank loaded it, else every rank's problem.
std::string Checkpointer::try_load(const std::filesystem::path& dir, ck::Manifest* manifest) {
  std::string problem;
  try {
    const ck::StepReport files = ck::check_step_files(env_, dir);
    if (!files.ok) throw IoError(files.problem);
    *manifest = ck::read_manifest(env_, dir);
    // In file order, one read at a time (measured faster here than two
    // reads in flight; the ranks of a job already read in parallel), with
    // the checksums computed behind the reads.
    std::vector<ck::RangeTarget> wanted;
    for (const sharding::StateSlice& s : engine_.state_to_load()) {
      if (s.range.size == 0) continue;
      wanted.push_back({ck::Range{s.tensor, s.block, s.range.offset, s.range.size}, s.data});
    }
    ck::read_ranges(env_, dir, *manifest, wanted);
  } catch (const Error& e) {
    problem = e.what();
  }
  const std::vector<std::string> all = allgather_bytes(comm_, problem);
  std::vector<std::pair<std::string, std::string>> problems;  // problem, the ranks that had it
  for (int r = 0; r < comm_.world_size(); ++r) {
    const std::string& p = all[static_cast<std::size_t>(r)];
    if (p.empty()) continue;
    auto same = std::find_if(problems.begin(), problems.end(), [&](const auto& q) { return q.first == p; });
    if (same == problems.end()) {
      problems.emplace_back(p, std::to_string(r));
    } else {
      same->second += fmt::format(", {}", r);
    }
  }
  std::string joined;
  for (const auto& [p, ranks] : problems) {
    if (!joined.empty()) joined += "; ";
    joined += comm_.world_size() > 1 ? fmt::format("{} (rank {})", p, ranks) : p;
  }
  return joined;
}

std::optional<ResumePoint> Checkpointer::resume(std::ostream* console) {
  const std::string& how = config_.checkpoint().resume();
  if (how == "none") return std::nullopt;
  std::vector<std::filesystem::path> candidates;
  std::vector<ck::StepReport> skipped;
  if (how == "auto") {
    if (!env_.is_directory(root_)) return std::nullopt;
    skipped = ck::uncommitted_dirs(env_, root_);
    for (const std::int64_t step : ck::committed_steps(env_, root_)) candidates.push_back(ck::step_dir(root_, step));
  } else {
    candidates.push_back(how);
  }
  ck::Manifest manifest;
  std::optional<std::filesystem::path> loaded;
  for (const auto& dir : candidates) {
    const std::string problem = try_load(dir, &manifest);
    if (problem.empty()) {
      loaded = dir;
      break;
    }
    if (how != "auto") throw IoError(fmt::format("checkpoint.resume='{}' cannot be loaded: {}", how, problem));
    skipped.push_back({dir, ck::parse_step_name(dir.filename().string()).value_or(-1), false, problem});
  }
  if (console != nullptr && comm_.rank() == 0) {
    for (const auto& s : skipped) *console << fmt::format("checkpoint: skipping {}: {}\n", s.dir.string(), s.problem);
  }
  if (!loaded) return std::nullopt;
  engine_.state_loaded();
  restore_loss_scale(manifest, engine_);
  set_aside_ = skipped;
  set_aside_corrupt_steps(manifest.step(), console);
  if (console != nullptr && comm_.rank() == 0) {
    *console << fmt::format("checkpoint: resumed from {} (step {}, saved by {} rank(s) at ZeRO stage {})\n",
                            loaded->string(), manifest.step(), manifest.world_size(), manifest.zero_stage());
  }
  return ResumePoint{manifest.step(), manifest.data_position(), *loaded, manifest.optimizer_step(),
                     saved_train_steps(manifest)};
}

}  // namespace dtrain::worker
