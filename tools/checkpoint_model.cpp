#include "tools/checkpoint_model.h"

#include <optional>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "worker/config.h"
#include "worker/trainer.h"

namespace dtrain::tools {

namespace ck = dtrain::checkpoint;

// A step directory is recognised by its manifest or by its name, so that a
// step whose manifest is missing is reported as such rather than read as a root.
bool is_step_dir(ck::Env& env, const std::filesystem::path& dir) {
  return env.exists(dir / "manifest.pb") || ck::parse_step_name(dir.filename().string()).has_value();
}

// What a missing checkpoint most often means: the run never saved one.
constexpr const char* kSaveHint =
    "a training run saves checkpoints only with checkpoint.every_steps set (e.g. --set checkpoint.every_steps=500; "
    "its last step is then saved too), under checkpoint.dir (default <train.out_dir>/checkpoints)";

void require_directory(ck::Env& env, const std::filesystem::path& dir) {
  if (env.is_directory(dir)) return;
  if (!env.exists(dir)) {
    throw IoError(fmt::format("no checkpoint folder '{}': {}; train with it, or pass the folder a run saved in",
                              dir.string(), kSaveHint));
  }
  throw IoError(fmt::format("'{}' is not a directory; pass a checkpoint folder or one of its step_* folders",
                            dir.string()));
}

std::filesystem::path resolve_step(ck::Env& env, const std::filesystem::path& dir) {
  require_directory(env, dir);
  if (is_step_dir(env, dir)) return dir;
  if (const std::optional<std::int64_t> latest = ck::read_latest(env, dir)) {
    const std::filesystem::path named = ck::step_dir(dir, *latest);
    if (env.exists(named / "manifest.pb")) return named;
  }
  const std::vector<std::int64_t> steps = ck::committed_steps(env, dir);
  if (steps.empty()) {
    throw IoError(fmt::format("no committed checkpoint step under '{}': {}", dir.string(), kSaveHint));
  }
  return ck::step_dir(dir, steps.front());
}

SavedModel rebuild_model(const ck::Manifest& manifest, const std::filesystem::path& step) {
  SavedModel m;
  m.config = worker::parse_config_json(manifest.config_json());
  m.model = worker::model_config(m.config);
  m.layout = nn::declare_parameters(m.model);
  const auto& blocks = m.layout.blocks();
  if (static_cast<int>(blocks.size()) != manifest.blocks_size()) {
    throw IoError(fmt::format("'{}': the manifest has {} blocks, its config declares {}", step.string(),
                              manifest.blocks_size(), blocks.size()));
  }
  for (std::size_t b = 0; b < blocks.size(); ++b) {
    const ck::Block& saved = manifest.blocks(static_cast<int>(b));
    if (saved.name() != blocks[b].name || saved.numel() != blocks[b].numel) {
      throw IoError(fmt::format("'{}': block {} is {} ({} elements) in the manifest but {} ({}) in its config",
                                step.string(), b, saved.name(), saved.numel(), blocks[b].name,
                                blocks[b].numel));
    }
  }
  return m;
}

void read_block_params(ck::Env& env, const std::filesystem::path& step, const ck::Manifest& manifest,
                       const nn::ParameterLayout& layout, int b, float* out) {
  const std::int64_t n = layout.blocks()[static_cast<std::size_t>(b)].numel;
  ck::read_range(env, step, manifest, ck::Range{"params", b, 0, n}, out);
}

}  // namespace dtrain::tools
