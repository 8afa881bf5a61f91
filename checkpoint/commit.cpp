// Committing a step and managing the committed ones: the write order that
// makes a step appear whole or not at all.
#include <algorithm>
#include <chrono>
#include <map>
#include <set>
#include <utility>

#include "checkpoint/checkpoint.h"
#include "checkpoint/shard_format.h"
#include "core/error.h"

namespace dtrain::checkpoint {
namespace fs = std::filesystem;
namespace {

// Every file the ranges name is listed, and has on disk the size its writer reported.
void check_files(Env& env, const fs::path& pending, const Manifest& m) {
  std::set<std::string> listed;
  for (const FileRecord& f : m.files()) {
    const fs::path path = pending / f.name();
    if (!env.exists(path)) {
      throw IoError(fmt::format("commit step {}: rank {}'s file '{}' is missing", m.step(), f.rank(),
                                path.string()));
    }
    const std::uint64_t size = env.file_size(path);
    if (size != f.size()) {
      throw IoError(fmt::format("commit step {}: '{}' has {} bytes, its writer reported {}", m.step(),
                                path.string(), size, f.size()));
    }
    listed.insert(f.name());
  }
  for (const RangeRecord& r : m.ranges()) {
    if (!listed.contains(r.file())) {
      throw IoError(fmt::format("commit step {}: tensor {} block {} is in '{}', which no file record lists",
                                m.step(), r.tensor(), r.block(), r.file()));
    }
  }
}

// The ranges of each tensor cover every block's [0, numel) without a gap.
void check_coverage(const Manifest& m) {
  std::map<std::pair<std::string, int>, std::vector<std::pair<std::int64_t, std::int64_t>>> spans;
  for (const RangeRecord& r : m.ranges()) {
    if (r.block() < 0 || r.block() >= m.blocks_size()) {
      throw Error(fmt::format("commit step {}: tensor {} names block {}, but there are {} blocks",
                              m.step(), r.tensor(), r.block(), m.blocks_size()));
    }
    spans[{r.tensor(), r.block()}].emplace_back(r.begin(), r.begin() + r.count());
  }
  std::set<std::string> tensors;
  for (const RangeRecord& r : m.ranges()) tensors.insert(r.tensor());
  for (const std::string& tensor : tensors) {
    for (int b = 0; b < m.blocks_size(); ++b) {
      auto& s = spans[{tensor, b}];
      std::sort(s.begin(), s.end());
      std::int64_t covered = 0;
      for (const auto& [lo, hi] : s) {
        if (lo > covered) break;
        covered = std::max(covered, hi);
      }
      if (covered < m.blocks(b).numel()) {
        throw Error(fmt::format("commit step {}: tensor {} block {} ('{}'): elements from {} of {} "
                                "are in no rank file", m.step(), tensor, b, m.blocks(b).name(),
                                covered, m.blocks(b).numel()));
      }
    }
  }
}

// Writes dir/name via dir/tmp_name, fsync and rename, then fsyncs dir.
void replace_file(Env& env, const fs::path& dir, std::string_view tmp_name, std::string_view name,
                  const std::string& data) {
  const fs::path tmp = dir / tmp_name;
  if (env.exists(tmp)) env.remove_file(tmp);  // left by a crashed commit; never a committed file
  env.write_file(tmp, data, /*sync=*/true);
  env.rename(tmp, dir / name);
  env.sync_dir(dir);
}

std::int64_t now_unix_ms() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}

}  // namespace

void prepare_step(Env& env, const fs::path& root, std::int64_t step) {
  if (env.exists(step_dir(root, step))) {
    throw IoError(fmt::format("checkpoint '{}' already exists; refusing to overwrite it",
                              step_dir(root, step).string()));
  }
  env.create_directories(root);
  const fs::path pending = pending_dir(root, step);
  if (env.exists(pending)) {
    env.remove_all(pending);
    env.sync_dir(root);
  }
}

void commit_step(Env& env, const fs::path& root, Manifest manifest) {
  const fs::path pending = pending_dir(root, manifest.step());
  const fs::path final_dir = step_dir(root, manifest.step());
  if (env.exists(final_dir)) {
    throw IoError(fmt::format("commit: '{}' already exists; refusing to overwrite it", final_dir.string()));
  }
  manifest.set_format_version(kManifestVersion);
  if (manifest.created_unix_ms() == 0) manifest.set_created_unix_ms(now_unix_ms());
  check_files(env, pending, manifest);
  check_coverage(manifest);
  if (env.exists(pending / kManifestName)) {
    throw IoError(fmt::format("commit: '{}' already exists", (pending / kManifestName).string()));
  }
  replace_file(env, pending, kManifestTmpName, kManifestName, manifest.SerializeAsString());
  env.rename(pending, final_dir);
  // One fsync of root makes both renames durable: the step is committed from
  // there on. A crash before it may keep the step and the old `latest`, which
  // only names an older committed step (loading looks at the steps themselves).
  const fs::path latest_tmp = root / kLatestTmpName;
  if (env.exists(latest_tmp)) env.remove_file(latest_tmp);
  env.write_file(latest_tmp, final_dir.filename().string() + "\n", /*sync=*/true);
  env.rename(latest_tmp, root / kLatestName);
  env.sync_dir(root);
}

std::vector<std::int64_t> committed_steps(Env& env, const fs::path& root) {
  std::vector<std::int64_t> steps;
  if (!env.is_directory(root)) return steps;
  for (const std::string& name : env.list_dir(root)) {
    if (!name.starts_with(kStepPrefix)) continue;
    const auto step = parse_step_name(name);
    if (step && env.exists(root / name / kManifestName)) steps.push_back(*step);
  }
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

std::optional<std::int64_t> read_latest(Env& env, const fs::path& root) {
  const fs::path path = root / kLatestName;
  if (!env.exists(path)) return std::nullopt;
  std::string name = env.read_file(path);
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  if (!name.starts_with(kStepPrefix)) return std::nullopt;
  return parse_step_name(name);
}

Manifest read_manifest(Env& env, const fs::path& dir) {
  const fs::path path = dir / kManifestName;
  if (!env.exists(path)) {
    throw IoError(fmt::format("checkpoint manifest '{}' is missing: the step was never committed",
                              path.string()));
  }
  Manifest manifest;
  if (!manifest.ParseFromString(env.read_file(path))) {
    throw IoError(fmt::format("checkpoint manifest '{}' does not parse as dtrain.checkpoint.Manifest",
                              path.string()));
  }
  if (manifest.format_version() != kManifestVersion) {
    throw IoError(fmt::format("checkpoint manifest '{}' has format version {}; this build reads only "
                              "version {}{}", path.string(), manifest.format_version(), kManifestVersion,
                              manifest.format_version() > kManifestVersion
                                  ? " (written by a newer dtrain: load it with that version)"
                                  : ""));
  }
  return manifest;
}

void remove_old_steps(Env& env, const fs::path& root, int keep_last) {
  if (keep_last < 1) {
    throw ConfigError("checkpoint.keep_last", fmt::format("must be >= 1, got {}", keep_last));
  }
  const std::vector<std::int64_t> steps = committed_steps(env, root);
  if (steps.empty()) return;
  const std::optional<std::int64_t> latest = read_latest(env, root);
  const std::set<std::int64_t> keep(steps.begin(),
                                    steps.begin() + std::min<std::size_t>(steps.size(), keep_last));
  for (const std::string& name : env.list_dir(root)) {
    const auto step = parse_step_name(name);
    if (!step) continue;
    const fs::path dir = root / name;
    const bool committed = name.starts_with(kStepPrefix) && env.exists(dir / kManifestName);
    if (committed && (keep.contains(*step) || step == latest)) continue;
    if (!committed && *step >= steps.front()) continue;  // maybe a save in progress
    if (committed) {
      env.remove_file(dir / kManifestName);  // uncommit first: a crash leaves no half step
      env.sync_dir(dir);
    }
    env.remove_all(dir);
  }
  // No fsync of root: a deletion a crash undoes is redone by the next save.
}

}  // namespace dtrain::checkpoint
