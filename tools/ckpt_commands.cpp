#include "tools/ckpt_commands.h"

#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <memory>
#include <optional>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "tools/checkpoint_model.h"
#include "core/error.h"
#include "nn/transformer.h"
#include "worker/config.h"
#include "worker/trainer.h"

namespace dtrain::tools {
namespace {

namespace ck = dtrain::checkpoint;

// Checkpoint files hold little-endian f32 and read_range copies them as they
// are; safetensors is little-endian too, so the bytes pass through unchanged.
static_assert(std::endian::native == std::endian::little, "dtrain-ckpt assumes a little-endian host");

std::string format_unix_ms(std::int64_t ms) {
  if (ms <= 0) return "unknown";
  const std::time_t seconds = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  ::gmtime_r(&seconds, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  return fmt::format("{}.{:03}Z", buf, ms % 1000);
}

const char* kind_name(nn::ModelConfig::Kind kind) {
  return kind == nn::ModelConfig::Kind::lm ? "lm" : "classifier";
}

void print_manifest(const std::filesystem::path& step, const ck::Manifest& m, std::ostream& out) {
  out << fmt::format("checkpoint      {}\n", step.string());
  out << fmt::format("step            {}\n", m.step());
  out << fmt::format("world size      {}\n", m.world_size());
  out << fmt::format("zero stage      {}\n", m.zero_stage());
  out << fmt::format("data position   {}\n", m.data_position());
  out << fmt::format("optimizer step  {}\n", m.optimizer_step());
  out << fmt::format("created         {}\n", format_unix_ms(m.created_unix_ms()));
  out << fmt::format("files ({}):\n", m.files_size());
  for (const ck::FileRecord& f : m.files()) {
    out << fmt::format("  {:<20} {:>14} bytes  rank {}\n", f.name(), f.size(), f.rank());
  }
  out << fmt::format("blocks ({}):\n", m.blocks_size());
  for (const ck::Block& b : m.blocks()) out << fmt::format("  {:<20} {:>14}\n", b.name(), b.numel());
}

void print_model(const SavedModel& model, std::ostream& out) {
  out << fmt::format("model           {}, d_model {}, layers {}, {} parameters\n", kind_name(model.model.kind),
                     model.model.d_model, model.model.n_layers, model.layout.total_numel());
  out << fmt::format("parameters ({}):\n", model.layout.params().size());
  for (const nn::ParamSpec& p : model.layout.params()) {
    out << fmt::format("  {:<28} [{}]\n", p.name, fmt::join(p.shape, ", "));
  }
}

// The safetensors header: tensors in layout order, back to back, then the
// metadata; padded with spaces to a multiple of 8 so the data is aligned.
std::string safetensors_header(const ck::Manifest& manifest, const nn::ParameterLayout& layout) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  std::uint64_t offset = 0;
  for (const nn::ParamSpec& p : layout.params()) {
    const std::uint64_t bytes = static_cast<std::uint64_t>(p.numel) * sizeof(float);
    header[p.name] = {{"dtype", "F32"}, {"shape", p.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  header["__metadata__"] = {{"format", "pt"}, {"step", std::to_string(manifest.step())}, {"source", "dtrain"}};
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

// Header, then every block's params read (and checksummed) by read_range and
// cut into its parameters.
void write_safetensors(ck::Env& env, const std::filesystem::path& step, const ck::Manifest& manifest,
                       const nn::ParameterLayout& layout, ck::WritableFile& file) {
  const std::string header = safetensors_header(manifest, layout);
  const std::uint64_t n = header.size();
  unsigned char size_le[8];
  for (int i = 0; i < 8; ++i) size_le[i] = static_cast<unsigned char>(n >> (8 * i));
  file.append(size_le, sizeof size_le);
  file.append(header.data(), header.size());
  std::vector<float> block;
  for (int b = 0; b < layout.num_blocks(); ++b) {
    const nn::BlockSpec& spec = layout.blocks()[static_cast<std::size_t>(b)];
    block.assign(static_cast<std::size_t>(spec.numel), 0.0f);
    read_block_params(env, step, manifest, layout, b, block.data());
    for (int i = spec.first_param; i < spec.first_param + spec.num_params; ++i) {
      const nn::ParamSpec& p = layout.params()[static_cast<std::size_t>(i)];
      file.append(block.data() + p.offset, static_cast<std::size_t>(p.numel) * sizeof(float));
    }
  }
}

// Moves `tmp` to `out` unless `out` exists: link() fails with EEXIST instead
// of replacing, so a file created after the first check is not clobbered either.
void publish_no_clobber(ck::Env& env, const std::filesystem::path& tmp, const std::filesystem::path& out) {
  if (::link(tmp.c_str(), out.c_str()) == 0) {
    env.remove_file(tmp);
    return;
  }
  const int err = errno;
  if (err == EEXIST) throw IoError(fmt::format("'{}' already exists; not overwriting it", out.string()));
  // Filesystems without hard links: the check before the write has to do.
  if (env.exists(out)) throw IoError(fmt::format("'{}' already exists; not overwriting it", out.string()));
  env.rename(tmp, out);
}

}  // namespace

int run_ckpt_inspect(const std::filesystem::path& dir, std::ostream& out) {
  ck::Env& env = *ck::default_env();
  const std::filesystem::path step = resolve_step(env, dir);
  const ck::Manifest manifest = ck::read_manifest(env, step);
  print_manifest(step, manifest, out);
  print_model(rebuild_model(manifest, step), out);
  return 0;
}

int run_ckpt_verify(const std::filesystem::path& dir, std::ostream& out) {
  ck::Env& env = *ck::default_env();
  require_directory(env, dir);
  std::vector<std::filesystem::path> steps;
  if (is_step_dir(env, dir)) {
    steps.push_back(dir);
  } else {
    for (std::int64_t s : ck::committed_steps(env, dir)) steps.push_back(ck::step_dir(dir, s));
  }
  if (steps.empty()) {
    out << fmt::format("no committed checkpoint step under {}\n", dir.string());
    return 1;
  }
  int failed = 0;
  for (const std::filesystem::path& step : steps) {
    const ck::StepReport report = ck::verify_step(env, step);
    if (report.ok) {
      out << fmt::format("{}: OK\n", step.string());
    } else if (report.problem.find(step.string()) != std::string::npos) {
      out << fmt::format("FAILED: {}\n", report.problem);  // it names the step already
    } else {
      out << fmt::format("{}: FAILED: {}\n", step.string(), report.problem);
    }
    if (!report.ok) ++failed;
  }
  out << fmt::format("{} of {} step(s) verified\n", steps.size() - static_cast<std::size_t>(failed), steps.size());
  return failed == 0 ? 0 : 1;
}

int run_ckpt_export(const CkptExportOptions& options, std::ostream& out) {
  if (options.format != "safetensors") {
    throw ConfigError("--format", fmt::format("'{}' is not supported; use safetensors", options.format));
  }
  ck::Env& env = *ck::default_env();
  // Checked first so that a refused export does not read the whole checkpoint.
  if (env.exists(options.out)) {
    throw IoError(fmt::format("'{}' already exists; not overwriting it", options.out.string()));
  }
  const std::filesystem::path step = resolve_step(env, options.dir);
  const ck::Manifest manifest = ck::read_manifest(env, step);
  const SavedModel model = rebuild_model(manifest, step);
  const std::filesystem::path parent = options.out.has_parent_path() ? options.out.parent_path() : ".";
  const std::filesystem::path tmp =
      parent / fmt::format(".{}.tmp.{}", options.out.filename().string(), ::getpid());
  try {
    std::unique_ptr<ck::WritableFile> file = env.new_writable_file(tmp);
    write_safetensors(env, step, manifest, model.layout, *file);
    file->sync();
    file->close();
    publish_no_clobber(env, tmp, options.out);
    env.sync_dir(parent);
  } catch (...) {
    env.remove_all(tmp);
    throw;
  }
  out << fmt::format("exported {} parameters ({} tensors) of step {} to {}\n", model.layout.total_numel(),
                     model.layout.params().size(), manifest.step(), options.out.string());
  return 0;
}

}  // namespace dtrain::tools
