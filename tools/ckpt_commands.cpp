#include "tools/ckpt_commands.h"

#include <cstdint>
#include <ctime>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "checkpoint/checkpoint.h"
#include "core/error.h"
#include "tools/checkpoint_model.h"

namespace dtrain::tools {
namespace {

namespace ck = dtrain::checkpoint;

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

}  // namespace

int run_ckpt_inspect(const std::filesystem::path& dir, std::ostream& out) {
  ck::Env& env = *ck::default_env();
  const std::filesystem::path step = resolve_step(env, dir);
  const ck::Manifest manifest = ck::read_manifest(env, step);
  print_manifest(step, manifest, out);
  print_model(rebuild_model(manifest, step), out);
  return 0;
}

int run_ckpt_verify(const std::filesystem::path& dir, std::ostream& out, bool ignore_uncommitted) {
  ck::Env& env = *ck::default_env();
  require_directory(env, dir);
  std::vector<std::filesystem::path> steps;
  std::vector<ck::StepReport> uncommitted;
  if (!is_step_dir(env, dir)) {
    for (std::int64_t s : ck::committed_steps(env, dir)) steps.push_back(ck::step_dir(dir, s));
    uncommitted = ck::uncommitted_dirs(env, dir);
  } else if (env.exists(dir / "manifest.pb")) {
    steps.push_back(dir);
  } else {
    uncommitted.push_back({dir, -1, false, "it has no manifest.pb: its save never committed"});
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
  for (const ck::StepReport& u : uncommitted) {
    out << fmt::format("{}: NOT COMMITTED: {}\n", u.dir.string(), u.problem);
  }
  if (steps.empty() && uncommitted.empty()) {
    out << fmt::format("no checkpoint step under {}\n", dir.string());
    return 1;
  }
  out << fmt::format("{} of {} committed step(s) verified", steps.size() - static_cast<std::size_t>(failed),
                     steps.size());
  if (!uncommitted.empty()) {
    out << fmt::format("; {} folder(s) not committed{}", uncommitted.size(),
                       ignore_uncommitted ? " (ignored)" : " (--ignore-uncommitted to pass anyway)");
  }
  out << "\n";
  const bool uncommitted_fail = !uncommitted.empty() && !ignore_uncommitted;
  return failed == 0 && !uncommitted_fail && !steps.empty() ? 0 : 1;
}

}  // namespace dtrain::tools
