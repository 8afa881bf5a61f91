// out_dir/metrics.jsonl: one JSON object per line, written by rank 0 alone.
// Floats are written in shortest round-trip form so two runs can be compared
// bit for bit; NaN and infinities, which JSON cannot spell, are written as null.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

namespace dtrain::worker {

// `value` as a JSON number that reads back as the same double ("0.1",
// "0.30000000000000004", "1e-08"); "null" for NaN and +-inf.
std::string format_json_number(double value);

// Writes metrics.jsonl, flushing every line so a killed run keeps what it logged.
// Not thread-safe: one thread (rank 0's training loop) owns a writer.
class MetricsWriter {
 public:
  // Creates out_dir if needed and opens out_dir/metrics.jsonl: truncated for a
  // fresh run (append=false), continued for a resumed one (append=true).
  // Throws IoError naming the path if the directory or file cannot be made.
  MetricsWriter(const std::filesystem::path& out_dir, bool append);

  // {"step":10,"loss":..,"lr":..,"grad_norm":..,"tokens_per_s":..,"step_ms":..}
  void log_step(std::int64_t step, double loss, double lr, double grad_norm, double tokens_per_s,
                double step_ms);
  // {"event":"eval","step":..,"loss":..,"accuracy":..,"perplexity":..}; absent
  // optionals are left out (a classifier reports accuracy, an lm perplexity).
  void log_eval(std::int64_t step, double loss, std::optional<double> accuracy,
                std::optional<double> perplexity);
  // {"event":"end","step":..,"loss":..}
  void log_end(std::int64_t step, double loss);

  const std::filesystem::path& path() const { return path_; }

 private:
  struct FileCloser {
    void operator()(std::FILE* f) const { std::fclose(f); }
  };
  // Throws IoError naming path_ if the line cannot be written or flushed.
  void write_line(const std::string& line);

  std::filesystem::path path_;
  std::unique_ptr<std::FILE, FileCloser> file_;
};

}  // namespace dtrain::worker
