#include "launcher/trace_merge.h"

#include <chrono>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace dtrain::launcher {

void merge_trace_files(const std::vector<std::filesystem::path>& inputs, const std::filesystem::path& output) {
  nlohmann::json events = nlohmann::json::array();
  std::int64_t dropped = 0;
  for (const auto& path : inputs) {
    std::ifstream in(path);
    if (!in) throw IoError(fmt::format("cannot read the trace '{}'", path.string()));
    nlohmann::json trace;
    try {
      trace = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      throw IoError(fmt::format("the trace '{}' is not JSON: {}", path.string(), e.what()));
    }
    dropped += trace.value("dropped", std::int64_t{0});
    for (auto& event : trace["traceEvents"]) events.push_back(std::move(event));
  }
  const nlohmann::json merged = {{"displayTimeUnit", "ms"}, {"dropped", dropped}, {"traceEvents", std::move(events)}};
  const std::filesystem::path tmp = output.string() + ".tmp";
  {
    std::ofstream out(tmp);
    out << merged.dump() << "\n";
    if (!out.flush()) throw IoError(fmt::format("cannot write the merged trace '{}'", tmp.string()));
  }
  std::filesystem::rename(tmp, output);
}

std::optional<std::string> merge_round_traces(comm::Store& store, const std::string& round_prefix, int world_size) {
  std::vector<std::filesystem::path> inputs;
  for (int rank = 0; rank < world_size; ++rank) {
    const std::string key = fmt::format("{}/trace/{}", round_prefix, rank);
    if (!store.check(key)) continue;
    const std::filesystem::path path = comm::to_string(store.get(key, std::chrono::milliseconds(5000)));
    if (std::filesystem::exists(path)) inputs.push_back(path);  // another node's disk: left out
  }
  if (inputs.empty()) return std::nullopt;
  const std::filesystem::path output = inputs.front().parent_path() / "trace.json";
  merge_trace_files(inputs, output);
  return output.string();
}

}  // namespace dtrain::launcher
