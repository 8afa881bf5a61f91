// What the cluster tests share: one Slurm cluster per test binary (started
// in SetUpTestSuite), a tiny LM config, reference runs started by hand, and
// metrics.jsonl compared line by line.
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "support/processes.h"
#include "support/run_command.h"
#include "support/slurm_cluster.h"
#include "support/temp_dir.h"
#include "support/tiny_lm.h"

namespace dtrain::testing {

inline std::string worker_bin() { return bin_dir() + "/dtrain-worker"; }
inline std::string launch_bin() { return bin_dir() + "/dtrain-launch"; }

// metrics.jsonl without the fields that depend on timing.
inline std::vector<std::string> metrics_lines(const std::filesystem::path& out_dir) {
  std::vector<std::string> lines;
  std::ifstream in(out_dir / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    j.erase("tokens_per_s");
    j.erase("step_ms");
    lines.push_back(j.dump());
  }
  return lines;
}

// The loss of every training step line.
inline std::vector<double> step_losses(const std::filesystem::path& out_dir) {
  std::vector<double> losses;
  std::ifstream in(out_dir / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (!j.contains("event")) losses.push_back(j["loss"].get<double>());
  }
  return losses;
}

// The "end" line's loss (the last one, after a resume).
inline double final_loss(const std::filesystem::path& out_dir) {
  double loss = -1.0;
  std::ifstream in(out_dir / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.value("event", "") == "end") loss = j["loss"].get<double>();
  }
  return loss;
}

inline void expect_close_losses(const std::vector<double>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  ASSERT_FALSE(want.empty());
  for (std::size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], 1e-5 * std::abs(want[i])) << "step " << i + 1;
  }
}

// `world` gloo ranks started by hand with the launcher's variables, each
// with `sets`; returns once they have all exited (each must exit 0).
inline void run_by_hand(const TempDir& dir, const std::string& config, int world, const std::string& out_dir,
                        const std::vector<std::string>& sets = {}) {
  const std::string store = "127.0.0.1:" + std::to_string(free_port());
  std::vector<Spawned> procs;
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> argv = {worker_bin(), "--config", config, "--set", "train.out_dir=" + out_dir};
    for (const auto& s : sets) argv.insert(argv.end(), {"--set", s});
    procs.push_back(spawn_process(argv,
                                  {{"DTRAIN_RANK", std::to_string(r)}, {"DTRAIN_WORLD_SIZE", std::to_string(world)},
                                   {"DTRAIN_STORE", store}, {"DTRAIN_TOKEN", "t"}, {"DTRAIN_RUN_ID", "hand"}},
                                  dir.file(fmt::format("hand{}.log", r))));
  }
  ASSERT_TRUE(wait_all(procs, std::chrono::seconds(120))) << "a rank started by hand hung";
  for (auto& p : procs) ASSERT_EQ(p.exit_code(), 0) << p.log();
}

// One cluster for every test of a binary; a test fails with the reason when
// Slurm is missing, the tests do not run as root (scripts/setup.sh and CI
// provide both) or the daemons did not come up.
class SlurmTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { cluster_ = std::make_unique<SlurmCluster>(2); }
  static void TearDownTestSuite() { cluster_.reset(); }

  void SetUp() override {
    ASSERT_TRUE(cluster_->missing().empty()) << cluster_->missing();
    ASSERT_TRUE(cluster_->up()) << cluster_->failure();
  }

  static SlurmCluster& cluster() { return *cluster_; }

  // Runs a Slurm command line; on failure, the output and the daemons' logs.
  static CommandResult run(const std::string& command, std::chrono::seconds limit = std::chrono::seconds(180)) {
    return cluster_->run(command, limit);
  }

  static inline std::unique_ptr<SlurmCluster> cluster_;
};

}  // namespace dtrain::testing
