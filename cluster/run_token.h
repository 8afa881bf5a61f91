// The run token that every store client must present, handed from rank 0 to
// the other tasks of a job through a file on shared storage when no launcher
// and no DTRAIN_TOKEN provides one (srun -n N dtrain-worker).
//
// The file is written by one process (rank 0) and read by the others; it is
// created with mode 0600 and replaced by rename, so a reader sees either no
// file or the whole token.
#pragma once

#include <chrono>
#include <filesystem>
#include <string>

namespace dtrain::cluster {

// 32 random bytes from the system's entropy source, as 64 hex digits.
std::string random_token();

// Writes `token` to `path` (mode 0600, creating the parent directory) through
// a temporary file and a rename. Throws dtrain::IoError naming the path.
void write_token_file(const std::filesystem::path& path, const std::string& token);

// Waits up to `timeout` for `path` to appear and returns the token in it.
// Throws dtrain::TimeoutError naming the file and what to check when it never
// appears, dtrain::IoError when it cannot be read or is empty.
std::string read_token_file(const std::filesystem::path& path, std::chrono::milliseconds timeout);

// Removes the token file it owns when destroyed (rank 0, at the end of the
// run): the secret does not outlive the job. Movable, not copyable.
class OwnedTokenFile {
 public:
  OwnedTokenFile() = default;
  explicit OwnedTokenFile(std::filesystem::path path) : path_(std::move(path)) {}
  ~OwnedTokenFile();
  OwnedTokenFile(OwnedTokenFile&& other) noexcept : path_(std::move(other.path_)) { other.path_.clear(); }
  OwnedTokenFile& operator=(OwnedTokenFile&& other) noexcept;
  OwnedTokenFile(const OwnedTokenFile&) = delete;
  OwnedTokenFile& operator=(const OwnedTokenFile&) = delete;

  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;  // empty: owns nothing
};

}  // namespace dtrain::cluster
