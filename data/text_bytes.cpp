#include "data/text_bytes.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "core/error.h"

namespace dtrain::data {
namespace fs = std::filesystem;
namespace {

constexpr const char* kFortunesDir = "/usr/share/games/fortunes";

// Where the path comes from a Debian package, say which one installs it.
std::string install_hint(const std::string& path) {
  const std::string dir = kFortunesDir;
  if (path.compare(0, dir.size(), dir) == 0) return "; install it with `apt-get install fortunes`";
  return "; check data.path / data.val_path";
}

bool is_index_file(const fs::path& p) {
  const std::string ext = p.extension().string();
  return ext == ".dat" || ext == ".u8";
}

}  // namespace

std::vector<std::string> list_text_files(const std::string& path) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (!fs::exists(st)) {
    throw IoError(fmt::format("text data '{}' does not exist{}", path, install_hint(path)));
  }
  if (!fs::is_directory(st)) return {path};
  std::vector<std::string> files;
  for (const fs::directory_entry& e : fs::directory_iterator(path, ec)) {
    if (e.is_regular_file() && !is_index_file(e.path())) files.push_back(e.path().string());
  }
  if (ec) throw IoError(fmt::format("cannot list text data folder '{}': {}", path, ec.message()));
  if (files.empty()) {
    throw IoError(
        fmt::format("text data folder '{}' holds no text file{}", path, install_hint(path)));
  }
  std::sort(files.begin(), files.end());
  return files;
}

std::vector<uint16_t> read_text_bytes(const std::string& path) {
  const std::vector<std::string> files = list_text_files(path);
  std::size_t total = 0;
  for (const std::string& file : files) {
    std::error_code ec;
    total += static_cast<std::size_t>(fs::file_size(file, ec));
    if (ec) throw IoError(fmt::format("cannot stat text file '{}': {}", file, ec.message()));
  }
  std::vector<uint16_t> tokens;
  tokens.reserve(total);
  std::vector<char> bytes;
  for (const std::string& file : files) {
    std::ifstream in(file, std::ios::binary);
    if (!in) throw_errno("cannot open text file", file);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    if (in.bad()) throw_errno("cannot read text file", file);
    for (char c : bytes) tokens.push_back(static_cast<unsigned char>(c));
  }
  if (tokens.empty()) {
    throw DataError(fmt::format("text data '{}' is empty; point data.path at text", path));
  }
  return tokens;
}

}  // namespace dtrain::data
