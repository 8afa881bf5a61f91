// Verifying committed steps and choosing the one to resume from.
#include <algorithm>
#include <array>
#include <map>

#include "checkpoint/checkpoint.h"
#include "checkpoint/rank_file.h"
#include "checkpoint/shard_format.h"
#include "core/error.h"

namespace dtrain::checkpoint {
namespace fs = std::filesystem;
namespace {

constexpr std::size_t kMaxProblems = 8;  // enough to act on; a wholly bad step is not listed in full

// Size and header of one rank file; empty when fine.
std::string check_file(Env& env, const fs::path& dir, const FileRecord& f) {
  const fs::path path = dir / f.name();
  if (!env.exists(path)) return fmt::format("{}: missing (rank {})", f.name(), f.rank());
  const std::uint64_t size = env.file_size(path);
  if (size != f.size()) {
    return fmt::format("{}: size expected {} bytes found {} (truncated or partial)", f.name(), f.size(),
                       size);
  }
  if (size < kShardHeaderBytes) return fmt::format("{}: shorter than its header", f.name());
  std::array<unsigned char, kShardHeaderBytes> head{};
  env.read(path, 0, head.size(), head.data());
  ShardHeader h;
  if (!decode_shard_header(head.data(), &h)) return fmt::format("{}: bad magic", f.name());
  if (h.version != kShardVersion) {
    return fmt::format("{}: format version {}, expected {}", f.name(), h.version, kShardVersion);
  }
  if (static_cast<int>(h.rank) != f.rank()) {
    return fmt::format("{}: header says rank {}, manifest says {}", f.name(), h.rank, f.rank());
  }
  return {};
}

void add_problem(StepReport& report, std::size_t& count, const std::string& problem) {
  if (count++ < kMaxProblems) {
    report.problem += report.problem.empty() ? problem : "; " + problem;
  } else if (count == kMaxProblems + 1) {
    report.problem += "; ...";
  }
}

}  // namespace

namespace {

// The manifest and every file's size and header; with `ranges`, every range's checksum too.
StepReport check(Env& env, const fs::path& dir, bool ranges) {
  StepReport report{dir, parse_step_name(dir.filename().string()).value_or(-1), false, {}};
  Manifest m;
  try {
    m = read_manifest(env, dir);
  } catch (const IoError& e) {
    report.problem = e.what();
    return report;
  }
  report.step = m.step();
  std::size_t problems = 0;
  std::map<std::string, bool> file_ok;
  for (const FileRecord& f : m.files()) {
    const std::string problem = check_file(env, dir, f);
    file_ok[f.name()] = problem.empty();
    if (!problem.empty()) add_problem(report, problems, problem);
  }
  for (const RangeRecord& r : m.ranges()) {
    if (!ranges) break;
    if (!file_ok[r.file()]) continue;  // already reported; reading it would only fail again
    try {
      const std::uint32_t found = read_record(env, dir, r, 0, 0, nullptr);
      if (found != r.crc32c()) {
        add_problem(report, problems, fmt::format("{}: crc32c expected {} found {}", describe(r),
                                                  hex32(r.crc32c()), hex32(found)));
      }
    } catch (const IoError& e) {
      add_problem(report, problems, fmt::format("{}: {}", describe(r), e.what()));
    }
  }
  if (problems > 0) report.problem = fmt::format("{}: {}", dir.string(), report.problem);
  report.ok = problems == 0;
  return report;
}

}  // namespace

StepReport verify_step(Env& env, const fs::path& dir) { return check(env, dir, true); }

StepReport check_step_files(Env& env, const fs::path& dir) { return check(env, dir, false); }

std::vector<StepReport> uncommitted_dirs(Env& env, const fs::path& root) {
  std::vector<StepReport> reports;
  if (!env.is_directory(root)) return reports;
  for (const std::string& name : env.list_dir(root)) {
    const auto step = parse_step_name(name);
    if (!step || env.exists(root / name / kManifestName)) continue;
    reports.push_back({root / name, *step, false,
                       name.starts_with(kPendingPrefix) ? "never committed (save interrupted); ignored"
                                                        : "no manifest.pb; ignored"});
  }
  return reports;
}

std::optional<Manifest> load_latest(Env& env, const fs::path& root, std::vector<StepReport>* skipped) {
  std::vector<StepReport> reports = uncommitted_dirs(env, root);
  std::optional<Manifest> found;
  for (const std::int64_t step : committed_steps(env, root)) {
    StepReport report = verify_step(env, step_dir(root, step));
    if (report.ok) {
      found = read_manifest(env, report.dir);
      break;
    }
    reports.push_back(std::move(report));
  }
  if (skipped != nullptr) *skipped = std::move(reports);
  return found;
}

}  // namespace dtrain::checkpoint
