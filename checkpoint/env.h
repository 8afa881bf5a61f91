// The one door through which checkpoint code touches files. Production uses
// default_env() (POSIX); tests wrap it in FaultInjectingEnv (fault_env.h) to
// fail writes, cut files and drop what was never fsync'd.
//
// Every method throws IoError naming the call and the path on failure.
// Nothing here overwrites a file's bytes in place: files are created
// exclusively and written by appending; replacing one is a rename.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace dtrain::checkpoint {

// A file being written front to back. One thread at a time.
class WritableFile {
 public:
  virtual ~WritableFile() = default;
  virtual void append(const void* data, std::size_t n) = 0;
  // Returns once every appended byte is on stable storage (fsync).
  virtual void sync() = 0;
  // Closing reports deferred write errors; the destructor closes silently.
  virtual void close() = 0;
};

// Thread-safe: several ranks (threads in tests) may share one Env.
class Env {
 public:
  virtual ~Env() = default;

  // Creates `path`, which must not exist (IoError otherwise: nothing is overwritten).
  virtual std::unique_ptr<WritableFile> new_writable_file(const std::filesystem::path& path) = 0;
  // Makes the directory's entries (creations, renames, removals) durable.
  virtual void sync_dir(const std::filesystem::path& dir) = 0;
  // Atomic POSIX rename: replaces `to` if it is a file; fails if it is a non-empty dir.
  virtual void rename(const std::filesystem::path& from, const std::filesystem::path& to) = 0;
  virtual void remove_file(const std::filesystem::path& path) = 0;
  // Removes a file or a directory tree; a missing path is not an error.
  virtual void remove_all(const std::filesystem::path& path) = 0;
  // The entry names of `dir`, sorted.
  virtual std::vector<std::string> list_dir(const std::filesystem::path& dir) = 0;
  // Reads exactly n bytes at `offset` into `out`; a short file is an IoError.
  virtual void read(const std::filesystem::path& path, std::uint64_t offset, std::size_t n,
                    void* out) = 0;
  virtual std::uint64_t file_size(const std::filesystem::path& path) = 0;
  virtual bool exists(const std::filesystem::path& path) = 0;
  virtual bool is_directory(const std::filesystem::path& path) = 0;
  virtual void create_directories(const std::filesystem::path& dir) = 0;
  // Shrinks a file; used to model lost writes, never by the checkpoint code.
  virtual void truncate(const std::filesystem::path& path, std::uint64_t size) = 0;

  // Conveniences built on the primitives above.
  // Creates `path` exclusively with `data`, fsync'd when `sync` is true.
  void write_file(const std::filesystem::path& path, std::string_view data, bool sync);
  std::string read_file(const std::filesystem::path& path);
};

// The process-wide POSIX Env; lives for the whole program.
Env* default_env();

}  // namespace dtrain::checkpoint
