#include "launcher/trace_merge.h"

#include <chrono>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace dtrain::launcher {

namespace {

// Appends the traceEvents of the trace at `path` to `events`; returns its
// count of dropped events. nlohmann::json's errors become IoError naming the file.
std::int64_t read_trace(const std::filesystem::path& path, nlohmann::json& events) {
  std::ifstream in(path);
  if (!in) throw IoError(fmt::format("cannot read the trace '{}'", path.string()));
  try {
    nlohmann::json trace = nlohmann::json::parse(in);
    for (auto& event : trace["traceEvents"]) events.push_back(std::move(event));
    return trace.value("dropped", std::int64_t{0});
  } catch (const nlohmann::json::parse_error& e) {
    throw IoError(fmt::format("the trace '{}' is not JSON: {}", path.string(), e.what()));
  } catch (const nlohmann::json::exception& e) {
    throw IoError(fmt::format("the trace '{}' is not a Chrome trace: {}", path.string(), e.what()));
  }
}

}  // namespace

void merge_trace_files(const std::vector<std::filesystem::path>& inputs, const std::filesystem::path& output) {
  nlohmann::json events = nlohmann::json::array();
  std::int64_t dropped = 0;
  for (const auto& path : inputs) dropped += read_trace(path, events);
  const nlohmann::json merged = {{"displayTimeUnit", "ms"}, {"dropped", dropped}, {"traceEvents", std::move(events)}};
  const std::filesystem::path tmp = output.string() + ".tmp";
  {
    std::ofstream out(tmp);
    out << merged.dump() << "\n";  // cannot throw: parse() let only valid UTF-8 in
    if (!out.flush()) throw IoError(fmt::format("cannot write the merged trace '{}'", tmp.string()));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, output, ec);
  if (ec) {
    throw IoError(fmt::format("cannot rename the merged trace '{}' to '{}': {}", tmp.string(), output.string(),
                              ec.message()));
  }
}

std::optional<std::string> merge_round_traces(comm::Store& store, const std::string& round_prefix, int world_size) {
  std::vector<std::filesystem::path> inputs;
  for (int rank = 0; rank < world_size; ++rank) {
    const std::string key = fmt::format("{}/trace/{}", round_prefix, rank);
    if (!store.check(key)) continue;
    const std::filesystem::path path = comm::to_string(store.get(key, std::chrono::milliseconds(5000)));
    std::error_code ec;
    if (std::filesystem::exists(path, ec)) inputs.push_back(path);  // another node's disk: left out
    if (ec) throw IoError(fmt::format("cannot look for the trace '{}': {}", path.string(), ec.message()));
  }
  if (inputs.empty()) return std::nullopt;
  const std::filesystem::path output = inputs.front().parent_path() / "trace.json";
  merge_trace_files(inputs, output);
  return output.string();
}

}  // namespace dtrain::launcher
