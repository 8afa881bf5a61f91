// The POSIX Env's contracts and what FaultInjectingEnv's crash model keeps.
#include <string>

#include <gtest/gtest.h>

#include "checkpoint/env.h"
#include "checkpoint/fault_env.h"
#include "checkpoint_fixture.h"
#include "core/error.h"

namespace dtrain::checkpoint {
namespace {

using testing::TempDir;

TEST(PosixEnv, CreatesExclusivelyAndNeverOverwrites) {
  TempDir tmp;
  Env& env = *default_env();
  const auto path = tmp.path() / "a.bin";
  env.write_file(path, "hello", true);
  EXPECT_THROW(env.write_file(path, "other", true), IoError);
  EXPECT_EQ(env.read_file(path), "hello");
}

TEST(PosixEnv, ReadsByteRangesAndReportsShortFiles) {
  TempDir tmp;
  Env& env = *default_env();
  const auto path = tmp.path() / "a.bin";
  env.write_file(path, "0123456789", false);
  char buf[4] = {};
  env.read(path, 3, 4, buf);
  EXPECT_EQ(std::string(buf, 4), "3456");
  EXPECT_EQ(env.file_size(path), 10u);
  try {
    env.read(path, 8, 4, buf);
    FAIL() << "short read accepted";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("a.bin"), std::string::npos) << e.what();
  }
}

TEST(PosixEnv, ListsSortedAndRemovesTrees) {
  TempDir tmp;
  Env& env = *default_env();
  env.create_directories(tmp.path() / "d" / "e");
  env.write_file(tmp.path() / "d" / "e" / "f", "x", false);
  env.write_file(tmp.path() / "b", "x", false);
  EXPECT_EQ(env.list_dir(tmp.path()), (std::vector<std::string>{"b", "d"}));
  env.remove_all(tmp.path() / "d");
  env.remove_all(tmp.path() / "missing");
  EXPECT_FALSE(env.exists(tmp.path() / "d"));
  EXPECT_TRUE(env.is_directory(tmp.path()));
}

TEST(FaultInjectingEnv, FailsTheNthWriteAndRename) {
  TempDir tmp;
  FaultInjectingEnv env(default_env());
  env.fail_nth_write(2);
  auto file = env.new_writable_file(tmp.path() / "a");
  file->append("ab", 2);
  EXPECT_THROW(file->append("cd", 2), IoError);
  file->append("ef", 2);  // only the n-th fails
  file->close();
  env.fail_nth_rename(1);
  EXPECT_THROW(env.rename(tmp.path() / "a", tmp.path() / "b"), IoError);
  EXPECT_EQ(env.read_file(tmp.path() / "a"), "abef");
}

TEST(FaultInjectingEnv, CutsTheLastWrite) {
  TempDir tmp;
  FaultInjectingEnv env(default_env());
  auto file = env.new_writable_file(tmp.path() / "a");
  file->append("head", 4);
  file->append("tail!", 5);
  file->close();
  env.cut_last_write(tmp.path() / "a", 2);
  EXPECT_EQ(env.read_file(tmp.path() / "a"), "headta");
}

TEST(FaultInjectingEnv, CrashDropsUnsyncedBytesAndUndurableFiles) {
  TempDir tmp;
  FaultInjectingEnv env(default_env());
  auto synced = env.new_writable_file(tmp.path() / "synced");
  synced->append("kept", 4);
  synced->sync();
  synced->append("lost", 4);
  synced->close();
  env.write_file(tmp.path() / "no_dir_sync", "x", true);
  env.sync_dir(tmp.path());
  env.write_file(tmp.path() / "after_dir_sync", "y", true);  // its entry never made durable
  env.crash();
  EXPECT_EQ(env.read_file(tmp.path() / "synced"), "kept");
  EXPECT_TRUE(env.exists(tmp.path() / "no_dir_sync"));
  EXPECT_FALSE(env.exists(tmp.path() / "after_dir_sync"));
}

TEST(FaultInjectingEnv, CrashUndoesRenamesWhoseDirectoryWasNotSynced) {
  TempDir tmp;
  FaultInjectingEnv env(default_env());
  const auto root = tmp.path();
  env.write_file(root / "latest", "old", true);
  env.write_file(root / "latest.tmp", "new", true);
  env.sync_dir(root);
  env.rename(root / "latest.tmp", root / "latest");
  env.crash();
  EXPECT_EQ(env.read_file(root / "latest"), "old");
  EXPECT_EQ(env.read_file(root / "latest.tmp"), "new");

  env.remove_file(root / "latest.tmp");
  env.write_file(root / "latest.tmp", "newer", true);
  env.sync_dir(root);
  env.rename(root / "latest.tmp", root / "latest");
  env.sync_dir(root);
  env.crash();
  EXPECT_EQ(env.read_file(root / "latest"), "newer");
}

TEST(FaultInjectingEnv, CrashUndoesAnUnsyncedDirectoryRename) {
  TempDir tmp;
  FaultInjectingEnv env(default_env());
  env.create_directories(tmp.path() / "pending");
  env.write_file(tmp.path() / "pending" / "f", "data", true);
  env.sync_dir(tmp.path() / "pending");
  env.rename(tmp.path() / "pending", tmp.path() / "final");
  env.crash();
  EXPECT_FALSE(env.exists(tmp.path() / "final"));
  EXPECT_EQ(env.read_file(tmp.path() / "pending" / "f"), "data");
}

}  // namespace
}  // namespace dtrain::checkpoint
