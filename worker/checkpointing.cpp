#include "worker/checkpointing.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include <fmt/format.h>

#include "checkpoint/checkpoint.h"
#include "core/error.h"
#include "worker/config.h"

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

}  // namespace

Checkpointer::Checkpointer(const config::Config& config, sharding::Engine& engine, comm::Communicator& comm,
                           ck::Env* env)
    : config_(config), engine_(engine), comm_(comm), env_(env != nullptr ? *env : *ck::default_env()),
      root_(checkpoint_root(config)) {}

Checkpointer::~Checkpointer() {
  if (writer_.joinable()) writer_.join();
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

void Checkpointer::commit(std::int64_t step, std::int64_t data_position, const std::string& part) {
  const std::vector<std::string> all = allgather_bytes(comm_, part);
  std::string error;
  if (comm_.rank() == 0) {
    try {
      ck::Manifest manifest;
      for (const auto& bytes : all) {
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
      manifest.set_step(step);
      manifest.set_config_json(config_to_json(config_));
      manifest.set_world_size(comm_.world_size());
      manifest.set_zero_stage(config_.parallel().zero_stage());
      manifest.set_data_position(data_position);
      manifest.set_optimizer_step(step);
      ck::commit_step(env_, root_, manifest);
      ck::remove_old_steps(env_, root_, config_.checkpoint().keep_last());
    } catch (const Error& e) {
      error = e.what();
    }
  }
  agree(comm_, error,
        fmt::format("committing checkpoint step {} in '{}' (committed steps are untouched)", step, root_.string()));
}

void Checkpointer::save(std::int64_t step, std::int64_t data_position) {
  finish_save();
  const auto t0 = Clock::now();
  begin(step);
  std::vector<ck::RangeData> ranges;
  for (const sharding::StateSlice& s : engine_.owned_state()) {
    ranges.push_back({ck::Range{s.tensor, s.block, s.range.offset, s.range.size}, s.data});
  }
  const auto w0 = Clock::now();
  const std::string part = write_part(step, ranges);
  const double write_s = seconds_since(w0);
  commit(step, data_position, part);
  last_save_.step = step;
  last_save_.write_s = write_s;
  last_save_.blocked_s = seconds_since(t0);
}

// The owned state copied into snapshot_ (allocated and touched by the first
// async save, reused after), as ranges over the copy.
std::vector<ck::RangeData> Checkpointer::snapshot() {
  const std::vector<sharding::StateSlice> slices = engine_.owned_state();
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

void Checkpointer::start_save(std::int64_t step, std::int64_t data_position) {
  finish_save();
  const auto t0 = Clock::now();
  begin(step);
  std::vector<ck::RangeData> ranges = snapshot();
  written_.store(false, std::memory_order_relaxed);
  writer_ = std::thread([this, step, ranges = std::move(ranges)] {
    const auto w0 = Clock::now();
    written_part_ = write_part(step, ranges);
    written_seconds_ = seconds_since(w0);
    written_.store(true, std::memory_order_release);
  });
  pending_ = Pending{step, data_position, seconds_since(t0)};
}

void Checkpointer::finish_save() {
  if (!pending_) return;
  const auto t0 = Clock::now();
  writer_.join();
  const Pending p = *pending_;
  pending_.reset();
  commit(p.step, p.data_position, written_part_);
  last_save_.step = p.step;
  last_save_.write_s = written_seconds_;
  last_save_.blocked_s = p.blocked_s + seconds_since(t0);
}

std::optional<ResumePoint> Checkpointer::resume(std::ostream* console) {
  const std::string& how = config_.checkpoint().resume();
  if (how == "none") return std::nullopt;
  ck::Env& env = env_;
  ck::Manifest manifest;
  std::filesystem::path dir;
  if (how == "auto") {
    std::vector<ck::StepReport> skipped;
    std::optional<ck::Manifest> found = env.is_directory(root_) ? ck::load_latest(env, root_, &skipped)
                                                                : std::nullopt;
    for (const auto& s : skipped) {
      if (console != nullptr && comm_.rank() == 0) {
        *console << fmt::format("checkpoint: skipping {}: {}\n", s.dir.string(), s.problem);
      }
    }
    if (!found) return std::nullopt;
    manifest = *found;
    dir = ck::step_dir(root_, manifest.step());
    set_aside_ = skipped;
  } else {
    dir = how;
    const ck::StepReport report = ck::verify_step(env, dir);
    if (!report.ok) {
      throw IoError(fmt::format("checkpoint.resume='{}' cannot be loaded: {}", how, report.problem));
    }
    manifest = ck::read_manifest(env, dir);
  }
  for (const sharding::StateSlice& s : engine_.state_to_load()) {
    if (s.range.size == 0) continue;
    ck::read_range(env, dir, manifest, ck::Range{s.tensor, s.block, s.range.offset, s.range.size}, s.data);
  }
  engine_.state_loaded();
  set_aside_corrupt_steps(manifest.step(), console);
  if (console != nullptr && comm_.rank() == 0) {
    *console << fmt::format("checkpoint: resumed from {} (step {}, saved by {} rank(s) at ZeRO stage {})\n",
                            dir.string(), manifest.step(), manifest.world_size(), manifest.zero_stage());
  }
  return ResumePoint{manifest.step(), manifest.data_position(), dir};
}

}  // namespace dtrain::worker
