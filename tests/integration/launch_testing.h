// Shared by the dtrain-launch tests: starting the launcher as a real
// process, comparing metrics.jsonl files (waiting for lines in its output:
// support/processes.h).
#pragma once

#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "support/processes.h"
#include "support/run_command.h"
#include "support/temp_dir.h"
#include "support/tiny_lm.h"

namespace dtrain::testing {

using namespace std::chrono_literals;

// A tiny LM that trains in well under a second per 20 steps on one core.
inline const std::string kLaunchLm = tiny_lm_json(1, 60);

inline std::string launcher() { return bin_dir() + "/dtrain-launch"; }
inline std::string worker() { return bin_dir() + "/dtrain-worker"; }

// dtrain-worker --config CONFIG --set train.out_dir=OUT --set SETS...
inline std::vector<std::string> worker_command(const std::filesystem::path& config, const std::filesystem::path& out,
                                               const std::vector<std::string>& sets = {}) {
  std::vector<std::string> argv = {worker(), "--config", config.string(), "--set", "train.out_dir=" + out.string()};
  for (const auto& s : sets) argv.insert(argv.end(), {"--set", s});
  return argv;
}

// dtrain-launch ARGS -- COMMAND, output to `log`.
inline Spawned start_launch(const std::vector<std::string>& args, const std::vector<std::string>& command,
                            const std::string& log, const std::map<std::string, std::string>& env = {}) {
  std::vector<std::string> argv = {launcher()};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.push_back("--");
  argv.insert(argv.end(), command.begin(), command.end());
  return spawn_process(argv, env, log);
}

// The step lines of metrics.jsonl without their timing fields, and the other
// lines whole: what two runs of one job must agree on.
inline std::vector<std::string> comparable_metrics(const std::filesystem::path& metrics) {
  std::vector<std::string> out;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    j.erase("tokens_per_s");
    j.erase("step_ms");
    out.push_back(j.dump());
  }
  return out;
}

// Loss per step of a metrics.jsonl (a step logged twice, as after a restart, keeps its last line).
inline std::map<long, double> losses_by_step(const std::filesystem::path& metrics) {
  std::map<long, double> out;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (!j.contains("event")) out[j["step"].get<long>()] = j["loss"].get<double>();
  }
  return out;
}

// The job started by hand: DTRAIN_* variables, rank 0 hosting the store.
inline bool run_by_hand(const TempDir& dir, int world, const std::vector<std::string>& command) {
  const std::string store = "127.0.0.1:" + std::to_string(free_port());
  std::vector<Spawned> procs;
  for (int r = 0; r < world; ++r) {
    procs.push_back(spawn_process(command,
                                  {{"DTRAIN_RANK", std::to_string(r)}, {"DTRAIN_WORLD_SIZE", std::to_string(world)},
                                   {"DTRAIN_LOCAL_RANK", std::to_string(r)}, {"DTRAIN_LOCAL_WORLD_SIZE", std::to_string(world)},
                                   {"DTRAIN_STORE", store}, {"DTRAIN_TOKEN", "t"}, {"DTRAIN_RUN_ID", "hand"}},
                                  dir.file(fmt::format("hand{}.log", r))));
  }
  if (!wait_all(procs, 120s)) return false;
  for (auto& p : procs) {
    if (p.exit_code() != 0) return false;
  }
  return true;
}

// The pids "dtrain-launch: round R: rank K is pid P" announced in `log` for round `round`.
inline std::vector<pid_t> announced_pids(const std::string& log, int round) {
  std::vector<pid_t> pids;
  const std::string text = read_file(log);
  const std::regex re(fmt::format("round {}: rank \\d+ is pid (\\d+)", round));
  for (auto it = std::sregex_iterator(text.begin(), text.end(), re); it != std::sregex_iterator(); ++it) {
    pids.push_back(std::stoi((*it)[1]));
  }
  return pids;
}

// Whether `pid` is gone (or a zombie nobody reaped yet).
inline bool process_gone(pid_t pid) {
  std::ifstream stat(fmt::format("/proc/{}/stat", pid));
  std::string line;
  if (!std::getline(stat, line)) return true;
  const auto close = line.rfind(')');
  return close != std::string::npos && line.size() > close + 2 && line[close + 2] == 'Z';
}

}  // namespace dtrain::testing
