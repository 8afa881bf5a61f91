#include "checkpoint/fault_env.h"

#include "core/error.h"

namespace dtrain::checkpoint {
namespace fs = std::filesystem;

namespace {

fs::path normal(const fs::path& p) { return p.lexically_normal(); }

// True when `p` is `dir` or lies below it.
bool within(const fs::path& p, const fs::path& dir) {
  const fs::path rel = p.lexically_relative(dir);
  return !rel.empty() && *rel.begin() != "..";
}

// Counts an armed fault down; true when this call is the one to fail.
bool trips(int& countdown) {
  if (countdown <= 0) return false;
  return --countdown == 0;
}

}  // namespace

class FaultWritableFile final : public WritableFile {
 public:
  FaultWritableFile(FaultInjectingEnv* env, fs::path path, std::unique_ptr<WritableFile> base)
      : env_(env), path_(std::move(path)), base_(std::move(base)) {}
  void append(const void* data, std::size_t n) override {
    env_->on_append(path_, n);  // throws before writing when the fault is armed
    base_->append(data, n);
  }
  void sync() override {
    base_->sync();
    env_->on_sync(path_);
  }
  void close() override { base_->close(); }

 private:
  FaultInjectingEnv* env_;
  fs::path path_;
  std::unique_ptr<WritableFile> base_;
};

void FaultInjectingEnv::fail_nth_write(int n) {
  std::lock_guard lock(mu_);
  writes_until_fault_ = n;
}

void FaultInjectingEnv::fail_nth_rename(int n) {
  std::lock_guard lock(mu_);
  renames_until_fault_ = n;
}

void FaultInjectingEnv::cut_last_write(const fs::path& path, std::uint64_t keep) {
  std::lock_guard lock(mu_);
  auto it = files_.find(normal(path));
  if (it == files_.end()) {
    throw IoError(fmt::format("cut_last_write '{}': not written through this Env", path.string()));
  }
  FileState& state = it->second;
  state.size = std::min(state.size, state.last_write_begin + keep);
  state.synced = std::min(state.synced, state.size);
  base_->truncate(path, state.size);
}

std::unique_ptr<WritableFile> FaultInjectingEnv::new_writable_file(const fs::path& path) {
  auto base = base_->new_writable_file(path);
  {
    std::lock_guard lock(mu_);
    files_[normal(path)] = FileState{};
  }
  return std::make_unique<FaultWritableFile>(this, normal(path), std::move(base));
}

void FaultInjectingEnv::on_append(const fs::path& path, std::size_t n) {
  std::lock_guard lock(mu_);
  if (trips(writes_until_fault_)) {
    throw IoError(fmt::format("write '{}': No space left on device (injected)", path.string()));
  }
  FileState& state = files_[path];
  state.last_write_begin = state.size;
  state.size += n;
}

void FaultInjectingEnv::on_sync(const fs::path& path) {
  std::lock_guard lock(mu_);
  FileState& state = files_[path];
  state.synced = state.size;
}

void FaultInjectingEnv::sync_dir(const fs::path& dir) {
  base_->sync_dir(dir);
  std::lock_guard lock(mu_);
  const fs::path d = normal(dir);
  for (auto& [path, state] : files_) {
    if (path.parent_path() == d) state.entry_durable = true;
  }
  std::erase_if(renames_, [&](const PendingRename& r) { return r.to.parent_path() == d; });
}

void FaultInjectingEnv::rename(const fs::path& from, const fs::path& to) {
  std::optional<std::string> replaced;
  {
    std::lock_guard lock(mu_);
    if (trips(renames_until_fault_)) {
      throw IoError(fmt::format("rename '{}' to '{}': Input/output error (injected)", from.string(),
                                to.string()));
    }
  }
  if (base_->exists(to) && !base_->is_directory(to)) replaced = base_->read_file(to);
  base_->rename(from, to);
  std::lock_guard lock(mu_);
  forget_states(normal(to));
  move_states(normal(from), normal(to));
  renames_.push_back({normal(from), normal(to), std::move(replaced)});
}

void FaultInjectingEnv::remove_file(const fs::path& path) {
  base_->remove_file(path);
  std::lock_guard lock(mu_);
  forget_states(normal(path));
}

void FaultInjectingEnv::remove_all(const fs::path& path) {
  base_->remove_all(path);
  std::lock_guard lock(mu_);
  forget_states(normal(path));
}

void FaultInjectingEnv::move_states(const fs::path& from, const fs::path& to) {
  std::map<fs::path, FileState> moved;
  for (auto it = files_.begin(); it != files_.end();) {
    if (within(it->first, from)) {
      const fs::path rel = it->first.lexically_relative(from);
      moved[rel == "." ? to : normal(to / rel)] = it->second;
      it = files_.erase(it);
    } else {
      ++it;
    }
  }
  files_.merge(moved);
}

void FaultInjectingEnv::forget_states(const fs::path& path) {
  std::erase_if(files_, [&](const auto& entry) { return within(entry.first, path); });
}

void FaultInjectingEnv::crash() {
  std::lock_guard lock(mu_);
  for (auto it = renames_.rbegin(); it != renames_.rend(); ++it) {
    base_->rename(it->to, it->from);
    move_states(it->to, it->from);
    if (it->replaced) {
      base_->write_file(it->to, *it->replaced, /*sync=*/true);
    }
  }
  renames_.clear();
  for (const auto& [path, state] : files_) {
    if (!base_->exists(path)) continue;
    if (!state.entry_durable) {
      base_->remove_file(path);
    } else if (base_->file_size(path) > state.synced) {
      base_->truncate(path, state.synced);
    }
  }
  files_.clear();
  writes_until_fault_ = 0;
  renames_until_fault_ = 0;
}

}  // namespace dtrain::checkpoint
