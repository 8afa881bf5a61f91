// Sharded checkpoints on shared storage (docs/ARCHITECTURE.md, checkpoint/):
//
//   root/.pending_step_000000200/   written first, by every rank
//   root/step_000000200/manifest.pb the pending dir renamed once the manifest is in
//   root/step_000000200/rank_00003.bin  byte layout: checkpoint/shard_format.h
//   root/latest                     "step_000000200\n", replaced by rename
//
// Saving step s on W ranks:
//   1. rank 0: prepare_step(env, root, s); then all ranks agree (barrier).
//   2. every rank: rec = write_rank_file(env, pending_dir(root, s), rank, ranges)
//      and sends rec to rank 0 (e.g. a Manifest holding only add_records(rec),
//      serialized: Manifest::MergeFrom concatenates the repeated fields).
//   3. rank 0, once every rank's file is durable: fills the rest of the
//      Manifest and calls commit_step. A crash before commit leaves a pending
//      dir that loading ignores; nothing existing is ever overwritten.
// Every function throws IoError naming the file (and tensor, block) on failure.
// Functions are thread-safe as far as the Env is; ranks must write distinct ranks.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/env.h"
#include "proto/checkpoint.pb.h"

namespace dtrain::checkpoint {

// Elements [begin, begin + count) of one tensor ("params", "exp_avg",
// "exp_avg_sq") of parameter block `block`, in the block's unpadded flat range.
struct Range {
  std::string tensor;
  int block = 0;
  std::int64_t begin = 0;
  std::int64_t count = 0;
};

// A range and its count floats, owned by the caller until the write returns.
struct RangeData {
  Range range;
  const float* data = nullptr;
};

// Where write_rank_file put a range (the proto RangeRecord, as a plain struct).
struct RangeLocation {
  Range range;
  int rank = 0;
  std::string file;  // name within the step dir
  std::uint64_t offset = 0;
  std::uint32_t crc32c = 0;
};

// One rank's file: what commit_step must find and what the manifest records.
struct RankFileRecord {
  std::string file;
  int rank = 0;
  std::uint64_t size = 0;
  std::vector<RangeLocation> ranges;
};

struct StepReport {
  std::filesystem::path dir;
  std::int64_t step = -1;
  bool ok = false;
  std::string problem;  // empty when ok
};

std::filesystem::path step_dir(const std::filesystem::path& root, std::int64_t step);
std::filesystem::path pending_dir(const std::filesystem::path& root, std::int64_t step);
std::string rank_file_name(int rank);  // "rank_00003.bin"
// The step a "step_NNNNNNNNN" or ".pending_step_NNNNNNNNN" name stands for.
std::optional<std::int64_t> parse_step_name(const std::string& name);

// Rank 0, before any rank writes step `step`: refuses (IoError) when the step
// is already committed and removes a pending dir a crashed save left behind,
// so that write_rank_file's exclusive creates can succeed.
void prepare_step(Env& env, const std::filesystem::path& root, std::int64_t step);

// Creates `pending` if needed, writes rank_RRRRR.bin with `ranges` in order,
// fsyncs it and its directory (commit_step's fsync of root then makes the
// directory itself durable). IoError if the file exists. REQUIRES: each range's data non-null
// (or count 0), count >= 0.
RankFileRecord write_rank_file(Env& env, const std::filesystem::path& pending, int rank,
                               const std::vector<RangeData>& ranges);

// Appends the file's FileRecord and its RangeRecords to `manifest`.
void add_records(const RankFileRecord& record, Manifest* manifest);

// Rank 0, after every rank's file is durable. `manifest` holds step, the
// files and ranges of every rank, blocks and the run state; format_version
// (and created_unix_ms when 0) are set here. Checks every file's size and that
// the ranges cover every block of every tensor they name, writes manifest.pb,
// renames pending_dir -> step_dir (IoError if step_dir exists) and then
// replaces root/latest. Each step is fsync'd before the next depends on it.
void commit_step(Env& env, const std::filesystem::path& root, Manifest manifest);

// Steps under root with a manifest.pb, newest first.
std::vector<std::int64_t> committed_steps(Env& env, const std::filesystem::path& root);
// The step root/latest names, if the file exists and parses.
std::optional<std::int64_t> read_latest(Env& env, const std::filesystem::path& root);

// IoError naming the file when it is missing, unparseable or of another version.
Manifest read_manifest(Env& env, const std::filesystem::path& dir);

// Reads every file's header and every range's bytes; ok or what is wrong
// (file, tensor, block, expected vs found checksum or size).
StepReport verify_step(Env& env, const std::filesystem::path& dir);

// What verify_step checks except the ranges' checksums (manifest, every
// file's presence, size and header): cheap enough for every rank before a
// load, which checks the checksums of what it reads (read_range).
StepReport check_step_files(Env& env, const std::filesystem::path& dir);

// Step and pending dirs under root without a manifest (never committed),
// each with why it is ignored.
std::vector<StepReport> uncommitted_dirs(Env& env, const std::filesystem::path& root);

// The manifest of the newest committed step that verifies, or
// nullopt. Newer steps that fail, and pending dirs, go to `skipped` (if given).
std::optional<Manifest> load_latest(Env& env, const std::filesystem::path& root,
                                    std::vector<StepReport>* skipped);

// Fills out[0, wanted.count) from the records of the step in `dir` that
// overlap `wanted`, in whichever rank files they are: this is resharding.
// Checks the crc32c of every record it reads from; IoError on a mismatch or
// when some element of `wanted` is in no record (naming the gap).
void read_range(Env& env, const std::filesystem::path& dir, const Manifest& manifest,
                const Range& wanted, float* out);

// One range to fill and where its elements go.
struct RangeTarget {
  Range range;
  float* out = nullptr;
};

// read_range for many ranges, in order, as a load wants them: the checksums
// of the records read whole are computed on a second thread while the next
// bytes are read, so checking costs the load little beyond the reads. Throws
// the first problem in read order (a mismatch, a gap, a short file).
void read_ranges(Env& env, const std::filesystem::path& dir, const Manifest& manifest,
                 const std::vector<RangeTarget>& wanted);

// Keeps the newest keep_last (>= 1) committed steps and the one `latest`
// names; deletes older steps and pending or uncommitted dirs older than the
// newest committed step. A step is uncommitted (manifest removed) before its
// files are, so a crash mid-delete never leaves a committed half step.
void remove_old_steps(Env& env, const std::filesystem::path& root, int keep_last);

}  // namespace dtrain::checkpoint
