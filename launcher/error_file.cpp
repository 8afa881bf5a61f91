#include "launcher/error_file.h"

#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace dtrain::launcher {

std::filesystem::path error_file_path(const std::filesystem::path& log_dir, const std::string& run_id, int round,
                                      int rank) {
  return std::filesystem::absolute(log_dir) / run_id / fmt::format("attempt_{}", round) / std::to_string(rank) /
         "error.json";
}

std::filesystem::path prepare_error_file(const std::filesystem::path& log_dir, const std::string& run_id, int round,
                                         int rank) {
  const std::filesystem::path file = error_file_path(log_dir, run_id, round, rank);
  std::error_code ec;
  std::filesystem::create_directories(file.parent_path(), ec);
  if (!ec) std::filesystem::remove(file, ec);
  if (ec) {
    throw IoError(fmt::format("cannot prepare the error file folder {}: {}; check --log-dir",
                              file.parent_path().string(), ec.message()));
  }
  return file;
}

std::optional<std::string> read_error_message(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  const nlohmann::json data = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!data.is_object() || !data.contains("message")) return std::nullopt;
  const nlohmann::json& message = data["message"];
  if (message.is_string()) return message.get<std::string>();
  if (message.is_object() && message.contains("message") && message["message"].is_string()) {
    return message["message"].get<std::string>();
  }
  return std::nullopt;
}

}  // namespace dtrain::launcher
