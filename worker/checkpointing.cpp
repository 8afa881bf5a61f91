#include "worker/checkpointing.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "checkpoint/checkpoint.h"
#include "core/error.h"
#include "worker/config.h"

namespace dtrain::worker {
namespace {

namespace ck = dtrain::checkpoint;

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

// Rank 0 decides, every rank learns the outcome: an error on rank 0 becomes
// an error on every rank instead of a rank waiting for a commit that never comes.
void agree(comm::Communicator& comm, bool ok_on_rank0, const std::string& what) {
  float ok = ok_on_rank0 ? 1.0f : 0.0f;
  comm.broadcast(&ok, 1, DType::f32, 0).wait();
  if (ok != 0.0f) return;
  if (comm.rank() == 0) throw IoError(what);
  throw IoError(fmt::format("rank 0 failed a checkpoint step (see its log): {}", what));
}

}  // namespace

Checkpointer::Checkpointer(const config::Config& config, sharding::Engine& engine, comm::Communicator& comm)
    : config_(config), engine_(engine), comm_(comm), root_(checkpoint_root(config)) {}

// Committed steps newer than the one resumed from failed to verify. They are
// kept (renamed "<step dir>.corrupt", never deleted) so this run can commit
// those step numbers again and a person can still inspect them.
void Checkpointer::set_aside_corrupt_steps(std::int64_t resumed_step, std::ostream* console) {
  comm_.barrier().wait();  // every rank has finished reading
  if (comm_.rank() == 0) {
    ck::Env& env = *ck::default_env();
    for (const ck::StepReport& s : set_aside_) {
      if (s.step <= resumed_step || !env.is_directory(s.dir) || s.dir.filename().string().rfind("step_", 0) != 0) {
        continue;
      }
      std::filesystem::path target = s.dir.string() + ".corrupt";
      for (int i = 1; env.exists(target); ++i) target = fmt::format("{}.corrupt.{}", s.dir.string(), i);
      env.rename(s.dir, target);
      env.sync_dir(root_);
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

void Checkpointer::save(std::int64_t step, std::int64_t data_position) {
  ck::Env& env = *ck::default_env();
  std::string error;
  if (comm_.rank() == 0) {
    try {
      env.create_directories(root_);
      ck::prepare_step(env, root_, step);
    } catch (const Error& e) {
      error = e.what();
    }
  }
  agree(comm_, error.empty(), fmt::format("preparing checkpoint step {} in '{}': {}", step, root_.string(), error));
  std::vector<ck::RangeData> ranges;
  for (const sharding::StateSlice& s : engine_.owned_state()) {
    ranges.push_back({ck::Range{s.tensor, s.block, s.range.offset, s.range.size}, s.data});
  }
  ck::Manifest mine;
  ck::add_records(ck::write_rank_file(env, ck::pending_dir(root_, step), comm_.rank(), ranges), &mine);
  const std::vector<std::string> all = allgather_bytes(comm_, mine.SerializeAsString());
  if (comm_.rank() == 0) {
    try {
      ck::Manifest manifest;
      for (const auto& bytes : all) {
        ck::Manifest part;
        DTRAIN_CHECK(part.ParseFromString(bytes), "a rank's checkpoint records do not parse");
        manifest.MergeFrom(part);
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
      ck::commit_step(env, root_, manifest);
      ck::remove_old_steps(env, root_, config_.checkpoint().keep_last());
    } catch (const Error& e) {
      error = e.what();
    }
  }
  agree(comm_, error.empty(), fmt::format("committing checkpoint step {} in '{}': {}", step, root_.string(), error));
}

std::optional<ResumePoint> Checkpointer::resume(std::ostream* console) {
  const std::string& how = config_.checkpoint().resume();
  if (how == "none") return std::nullopt;
  ck::Env& env = *ck::default_env();
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
