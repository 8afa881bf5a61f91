// An Env for tests that wraps another one and models what a crash or a full
// disk does to files written through it (leveldb's FaultInjectionTestEnv, cut
// down). It remembers, for every file it created, how many bytes were fsync'd
// and whether the file's directory entry was made durable (sync_dir of its
// parent after creation), and which renames were not yet made durable.
//
// crash() then applies what a power cut would: renames whose target directory
// was not fsync'd are undone (a replaced file gets its old bytes back), files
// whose entry was never made durable vanish, and the others are cut to their
// fsync'd length. Directory creation is treated as durable at once, and files
// made outside this Env are left alone: the model errs on keeping data, so a
// test passing under it still shows the writer's fsync order is right for files
// and renames.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/env.h"

namespace dtrain::checkpoint {

class FaultInjectingEnv final : public Env {
 public:
  // `base` must outlive this Env.
  explicit FaultInjectingEnv(Env* base) : base_(base) {}

  // The n-th append from now (1-based) throws IoError as a full disk would.
  void fail_nth_write(int n);
  // The n-th rename from now (1-based) throws IoError.
  void fail_nth_rename(int n);
  // Cuts the file's last append to its first `keep` bytes, as a crash in the
  // middle of that write would; IoError if the file was not written here.
  void cut_last_write(const std::filesystem::path& path, std::uint64_t keep);
  // Drops everything that was not made durable; see the header comment.
  void crash();

  std::unique_ptr<WritableFile> new_writable_file(const std::filesystem::path& path) override;
  void sync_dir(const std::filesystem::path& dir) override;
  void rename(const std::filesystem::path& from, const std::filesystem::path& to) override;
  void remove_file(const std::filesystem::path& path) override;
  void remove_all(const std::filesystem::path& path) override;
  std::vector<std::string> list_dir(const std::filesystem::path& dir) override {
    return base_->list_dir(dir);
  }
  void read(const std::filesystem::path& path, std::uint64_t offset, std::size_t n,
            void* out) override {
    base_->read(path, offset, n, out);
  }
  std::uint64_t file_size(const std::filesystem::path& path) override { return base_->file_size(path); }
  bool exists(const std::filesystem::path& path) override { return base_->exists(path); }
  bool is_directory(const std::filesystem::path& path) override { return base_->is_directory(path); }
  void create_directories(const std::filesystem::path& dir) override { base_->create_directories(dir); }
  void truncate(const std::filesystem::path& path, std::uint64_t size) override {
    base_->truncate(path, size);
  }

 private:
  friend class FaultWritableFile;
  struct FileState {
    std::uint64_t size = 0;
    std::uint64_t synced = 0;
    std::uint64_t last_write_begin = 0;
    bool entry_durable = false;
  };
  struct PendingRename {
    std::filesystem::path from, to;
    std::optional<std::string> replaced;  // the bytes of the file `to` replaced
  };

  // Called by the files this Env hands out.
  void on_append(const std::filesystem::path& path, std::size_t n);
  void on_sync(const std::filesystem::path& path);
  void move_states(const std::filesystem::path& from, const std::filesystem::path& to);
  void forget_states(const std::filesystem::path& path);

  Env* base_;
  std::mutex mu_;
  std::map<std::filesystem::path, FileState> files_;
  std::vector<PendingRename> renames_;
  int writes_until_fault_ = 0;   // 0: no fault armed
  int renames_until_fault_ = 0;
};

}  // namespace dtrain::checkpoint
