#include "worker/metrics.h"

#include <cerrno>
#include <cmath>
#include <system_error>

#include <fmt/format.h>

#include "core/error.h"

namespace dtrain::worker {

std::string format_json_number(double value) {
  if (!std::isfinite(value)) return "null";
  // fmt's "{}" is the shortest string that reads back as `value` (Dragonbox),
  // and its spellings ("1e-08", "-0", "5") are all valid JSON numbers.
  return fmt::format("{}", value);
}

MetricsWriter::MetricsWriter(const std::filesystem::path& out_dir, bool append)
    : path_(out_dir / "metrics.jsonl") {
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) {
    throw IoError(fmt::format("cannot create run directory '{}' for '{}': {}", out_dir.string(),
                              path_.string(), ec.message()));
  }
  file_.reset(std::fopen(path_.c_str(), append ? "a" : "w"));
  if (!file_) throw_errno("cannot open metrics file", path_.string());
}

void MetricsWriter::log_step(std::int64_t step, double loss, double lr, double grad_norm,
                             double tokens_per_s, double step_ms) {
  write_line(fmt::format(
      R"({{"step":{},"loss":{},"lr":{},"grad_norm":{},"tokens_per_s":{},"step_ms":{}}})", step,
      format_json_number(loss), format_json_number(lr), format_json_number(grad_norm),
      format_json_number(tokens_per_s), format_json_number(step_ms)));
}

void MetricsWriter::log_eval(std::int64_t step, double loss, std::optional<double> accuracy,
                             std::optional<double> perplexity) {
  std::string line =
      fmt::format(R"({{"event":"eval","step":{},"loss":{})", step, format_json_number(loss));
  if (accuracy) line += fmt::format(R"(,"accuracy":{})", format_json_number(*accuracy));
  if (perplexity) line += fmt::format(R"(,"perplexity":{})", format_json_number(*perplexity));
  write_line(line + "}");
}

void MetricsWriter::log_end(std::int64_t step, double loss) {
  write_line(
      fmt::format(R"({{"event":"end","step":{},"loss":{}}})", step, format_json_number(loss)));
}

void MetricsWriter::write_line(const std::string& line) {
  errno = 0;
  if (std::fputs(line.c_str(), file_.get()) == EOF || std::fputc('\n', file_.get()) == EOF ||
      std::fflush(file_.get()) != 0) {
    throw_errno("cannot write metrics file", path_.string());
  }
}

}  // namespace dtrain::worker
