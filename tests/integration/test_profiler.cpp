// The scheduled profiler (train.profile_steps, worker/profiler.h): its
// schedule's parsing and config rules; a 2-rank run with --profile-steps
// writes one gzip'd trace under <tensorboard_dir>/plugins/profile/<run>/
// holding both ranks' processes, and kernel, collective and training events
// of the active steps only; and TensorBoard (.venv's, with
// tensorboard-plugin-profile), started here on loopback, lists the run's
// profile and serves its trace, every event of both ranks, through the
// plugin's own routes (runs, run_tools, data).
#include <gmock/gmock.h>
#include <gtest/gtest.h>


#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>
#include <set>

#include "core/error.h"
#include "integration/observability_testing.h"
#include "support/processes.h"
#include "support/run_command.h"
#include "support/temp_dir.h"
#include "support/tiny_lm.h"
#include "worker/config.h"
#include "worker/profiler.h"

namespace dtrain::testing {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::json;
using namespace std::chrono_literals;

TEST(ProfileSteps, ParsesTheScheduleAndNamesTheFieldWhenMalformed) {
  EXPECT_FALSE(worker::parse_profile_steps("").has_value());
  const auto s = worker::parse_profile_steps("wait=1,warmup=2,active=3");
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->wait, 1);
  EXPECT_EQ(s->warmup, 2);
  EXPECT_EQ(s->active, 3);
  const auto only_active = worker::parse_profile_steps("active=2");
  EXPECT_EQ(only_active->wait, 0);
  EXPECT_EQ(only_active->warmup, 0);
  EXPECT_EQ(only_active->active, 2);
  for (const char* bad : {"active=0", "wait=1", "wait=1,active", "active=x", "active=-1", "repeat=2,active=1",
                          "active=1,active=2", "active=1,", "3"}) {
    try {
      worker::parse_profile_steps(bad);
      ADD_FAILURE() << "'" << bad << "' was accepted";
    } catch (const ConfigError& e) {
      EXPECT_THAT(e.what(), HasSubstr("train.profile_steps")) << bad;
      EXPECT_THAT(e.what(), HasSubstr("wait=W,warmup=U,active=A")) << bad;
    }
  }
  EXPECT_EQ(worker::profile_run_name(std::chrono::system_clock::from_time_t(1700000000)), "2023_11_14_22_13_20");
}

TEST(ProfileSteps, ConfigRulesNeedAFolderAndAStepToRecord) {
  TempDir dir;
  const auto config = dir.write("tiny.json", kTinyLm).string();  // 20 steps
  EXPECT_EQ(worker::load_config(config, {"train.profile_steps=wait=18,warmup=1,active=5"}).train().profile_steps(),
            "wait=18,warmup=1,active=5");
  try {
    worker::load_config(config, {"train.profile_steps=wait=19,warmup=1,active=1"});
    ADD_FAILURE() << "a profile after the last step was accepted";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), HasSubstr("records from step 21 on"));
  }
  try {
    worker::load_config(config, {"train.profile_steps=active=1", "train.tensorboard_dir="});
    ADD_FAILURE() << "a profile without a TensorBoard folder was accepted";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), HasSubstr("train.tensorboard_dir"));
  }
}

// The files under <tb>/plugins/profile/<run>/ (one run), sorted.
std::vector<std::filesystem::path> profile_files(const std::filesystem::path& tb) {
  std::vector<std::filesystem::path> files;
  const auto root = tb / "plugins" / "profile";
  if (std::filesystem::exists(root)) {
    for (const auto& e : std::filesystem::recursive_directory_iterator(root)) {
      if (e.is_regular_file()) files.push_back(e.path());
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

TEST(Profiler, TwoRanksWriteOneTraceOfTheActiveStepsThatTensorBoardServes) {
  TempDir dir;
  const auto config = dir.write("tiny.json", kTinyLm);  // 20 steps, 2 micro-batches each
  const std::string store = "127.0.0.1:" + std::to_string(free_port());
  const auto out = dir / "dp";
  std::vector<Spawned> procs;
  for (int r = 0; r < 2; ++r) {
    procs.push_back(spawn_process({bin_dir() + "/dtrain-worker", "--config", config.string(), "--set",
                                   "train.out_dir=" + out.string(), "--set", "checkpoint.every_steps=4",
                                   "--profile-steps", "wait=1,warmup=1,active=3"},
                                  {{"DTRAIN_RANK", std::to_string(r)}, {"DTRAIN_WORLD_SIZE", "2"},
                                   {"DTRAIN_STORE", store}, {"DTRAIN_TOKEN", "t"}, {"DTRAIN_RUN_ID", "prof"}},
                                  dir.file("rank" + std::to_string(r) + ".log")));
  }
  ASSERT_TRUE(wait_all(procs, 120s)) << "a worker hung";
  for (auto& p : procs) ASSERT_EQ(p.exit_code(), 0) << p.log();
  const std::vector<std::filesystem::path> files = profile_files(out / "tensorboard");
  ASSERT_EQ(files.size(), 2u) << "<host>.trace.json.gz and <host>.xplane.pb";
  const std::filesystem::path file = files[0];
  const std::string run = file.parent_path().filename().string();
  const std::string host = file.filename().string().substr(0, file.filename().string().find('.'));
  EXPECT_EQ(file.filename().string(), host + ".trace.json.gz");
  EXPECT_EQ(files[1], file.parent_path() / (host + ".xplane.pb"));
  EXPECT_THAT(run, ::testing::MatchesRegex("[0-9]{4}_[0-9]{2}_[0-9]{2}_[0-9]{2}_[0-9]{2}_[0-9]{2}"));
  EXPECT_THAT(procs[0].log(), HasSubstr("profile of steps 3 to 5 (2 rank(s)): " + file.string()));

  const Json trace = Json::parse(gunzip(read_file(file)));
  ASSERT_TRUE(trace["traceEvents"].is_array());
  std::map<int, std::string> processes;
  std::map<std::pair<int, int>, std::string> threads;
  // Per rank: each step's iteration [start of the step, end of its last
  // training-thread event (a checkpoint's)] in µs, and the events by category.
  std::map<int, std::map<std::int64_t, std::pair<double, double>>> steps;
  std::map<int, std::map<std::string, int>> categories;
  std::map<int, std::set<std::string>> kernel_names;
  std::map<int, std::map<std::string, int>> names;  // complete events by name
  for (const Json& e : trace["traceEvents"]) {
    const int pid = e["pid"];
    if (e["ph"] == "M") {
      if (e["name"] == "process_name") processes[pid] = e["args"]["name"];
      if (e["name"] == "thread_name") threads[{pid, e["tid"].get<int>()}] = e["args"]["name"];
      continue;
    }
    ASSERT_EQ(e["ph"], "X") << e.dump();
    const std::int64_t step = e["args"]["step"];
    EXPECT_TRUE(step >= 3 && step <= 5) << "an event of step " << step << " outside the active steps: " << e.dump();
    ++categories[pid][e["cat"]];
    ++names[pid][e["name"]];
    if (e["cat"] == "train") {
      auto& [start, end] = steps[pid].try_emplace(step, 1e300, 0.0).first->second;
      start = std::min(start, e["ts"].get<double>());
      end = std::max(end, e["ts"].get<double>() + e["dur"].get<double>());
    }
    if (e["cat"] == "kernel") {
      kernel_names[pid].insert(e["name"]);
      EXPECT_GE(e["args"]["calls"].get<std::int64_t>(), 1) << e.dump();
      EXPECT_GE(e["dur"].get<double>(), 0.0) << e.dump();
    }
    if (e["cat"] == "comm") {
      EXPECT_GT(e["args"]["bytes"].get<std::int64_t>(), 0) << e.dump();
    }
  }
  EXPECT_EQ(processes, (std::map<int, std::string>{{0, "rank 0"}, {1, "rank 1"}}));
  for (int pid : {0, 1}) {
    EXPECT_EQ(threads[std::pair(pid, 0)], "training");
    EXPECT_EQ(threads[std::pair(pid, 1)], "comm");
    EXPECT_EQ(threads[std::pair(pid, 2)], "kernels");
    ASSERT_EQ(steps[pid].size(), 3u) << "rank " << pid << ": the active steps";
    EXPECT_EQ(names[pid]["step"], 3) << "rank " << pid;
    // The save after step 4, in its parts (checkpoint.every_steps=4).
    for (const char* part : {"checkpoint", "checkpoint write", "checkpoint gather", "checkpoint commit"}) {
      EXPECT_EQ(names[pid][part], 1) << "rank " << pid << ": " << part;
    }
    EXPECT_GT(categories[pid]["kernel"], 0) << "rank " << pid;
    EXPECT_GT(categories[pid]["comm"], 0) << "rank " << pid;
    EXPECT_GT(categories[pid]["train"], 3) << "rank " << pid;
    for (const char* kernel : {"gemm", "adamw", "copy"}) {
      EXPECT_EQ(kernel_names[pid].count(kernel), 1u) << "rank " << pid << " has no " << kernel << " event";
    }
  }
  // Every kernel and collective lies within its step's iteration, give or
  // take the microsecond the timestamps are rounded to.
  for (const Json& e : trace["traceEvents"]) {
    if (e["ph"] != "X" || e["cat"] == "train") continue;
    const auto [start, end] = steps[e["pid"].get<int>()][e["args"]["step"].get<std::int64_t>()];
    EXPECT_GE(e["ts"].get<double>(), start - 1.0) << e.dump();
    EXPECT_LE(e["ts"].get<double>() + e["dur"].get<double>(), end + 1.0) << e.dump();
  }

  // TensorBoard with the profile plugin lists the run and serves its trace
  // (from the XSpace): every rank a process, every event there.
  const std::string tensorboard = source_dir() + "/.venv/bin/tensorboard";
  ASSERT_TRUE(std::filesystem::exists(tensorboard)) << tensorboard << " is missing: run scripts/setup.sh";
  std::vector<Spawned> server{spawn_process({"/usr/bin/timeout", "-s", "KILL", "180", tensorboard, "--logdir",
                                             (out / "tensorboard").string(), "--host", "127.0.0.1", "--port", "0"},
                                            {}, dir.file("tensorboard.log"))};
  const auto at = wait_for_text(server[0].log_path, R"(TensorBoard \S+ at http://127\.0\.0\.1:([0-9]+)/)", 120s);
  if (at.empty()) {
    wait_all(server, 0ms);
    FAIL() << "TensorBoard did not start: " << server[0].log();
  }
  const int port = std::stoi(at[1]);
  const auto listing = http_get(port, "/data/plugins_listing", 10);
  ASSERT_TRUE(listing.has_value()) << server[0].log();
  EXPECT_TRUE(Json::parse(*listing).contains("profile")) << "tensorboard-plugin-profile is not installed: " << *listing;
  const auto runs = http_get(port, "/data/plugin/profile/runs", 10);
  const auto tools = http_get(port, "/data/plugin/profile/run_tools?run=" + run, 10);
  const auto served =
      http_get(port, fmt::format("/data/plugin/profile/data?run={}&tag=trace_viewer&host={}", run, host), 10);
  ::kill(server[0].pid, SIGTERM);
  wait_all(server, 30s);
  ASSERT_TRUE(runs.has_value()) << server[0].log();
  EXPECT_EQ(Json::parse(*runs), Json::array({run})) << *runs;
  ASSERT_TRUE(tools.has_value()) << server[0].log();
  EXPECT_THAT(*tools, HasSubstr("trace_viewer"));
  ASSERT_TRUE(served.has_value()) << server[0].log();
  std::map<int, std::string> served_processes;
  std::map<int, std::map<std::string, int>> served_names;
  const Json viewer = Json::parse(*served);
  for (const Json& e : viewer["traceEvents"]) {
    if (e.empty()) continue;  // the list's closing {}
    if (e["ph"] == "M" && e["name"] == "process_name") served_processes[e["pid"]] = e["args"]["name"];
    if (e["ph"] == "X") ++served_names[e["pid"]][e["name"]];
  }
  ASSERT_EQ(served_processes.size(), 2u) << *served;
  int rank = 0;
  for (const auto& [pid, name] : served_processes) {
    EXPECT_EQ(name, fmt::format("/device:CUSTOM:{}", rank));
    EXPECT_EQ(served_names[pid], names[rank]) << "rank " << rank << "'s events as the plugin serves them";
    ++rank;
  }
}

// A resumed run counts the schedule from its own first step, and a run that
// ends inside the active steps writes what it recorded.
TEST(Profiler, AResumedRunCountsFromItsFirstStepAndAShortRunWritesWhatItHas) {
  TempDir dir;
  const auto config = dir.write("tiny.json", kTinyLm);
  const auto out = dir / "run";
  const std::string worker = fmt::format("{}/dtrain-worker --config {} --set train.out_dir={} "
                                         "--set schedule.warmup_steps=2 ",
                                         bin_dir(), config.string(), out.string());
  const CommandResult first = run_command(worker + "--set train.steps=4 --set checkpoint.every_steps=4");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const CommandResult resumed = run_command(
      worker + "--set train.steps=8 --set checkpoint.resume=auto --profile-steps wait=1,warmup=1,active=5");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_THAT(resumed.output, HasSubstr("resumed from"));
  EXPECT_THAT(resumed.output, HasSubstr("profile of steps 7 to 8 (1 rank(s))")) << "steps 5 and 6 wait and warm up";
  const std::vector<std::filesystem::path> files = profile_files(out / "tensorboard");
  ASSERT_EQ(files.size(), 2u);
  const Json trace = Json::parse(gunzip(read_file(files[0])));
  std::set<std::int64_t> steps;
  for (const Json& e : trace["traceEvents"]) {
    if (e["ph"] == "X") steps.insert(e["args"]["step"].get<std::int64_t>());
  }
  EXPECT_EQ(steps, (std::set<std::int64_t>{7, 8})) << "the run ended after step 8";
}

// Observability never stops a run: a profile that cannot be written is one
// warning naming the file.
TEST(Profiler, AnUnwritableFolderCostsAWarningNotTheRun) {
  TempDir dir;
  const auto config = dir.write("tiny.json", kTinyLm);
  const auto blocker = dir.write("a-file", "not a folder");
  const CommandResult r = run_command(fmt::format(
      "{}/dtrain-worker --config {} --set train.out_dir={} --set train.tensorboard_dir={} "
      "--profile-steps wait=1,warmup=1,active=3",
      bin_dir(), config.string(), dir.file("run"), (blocker / "tb").string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr(fmt::format("warning: the profile of steps 3 to 5 is lost: cannot write '{}",
                                              (blocker / "tb" / "plugins" / "profile").string())));
  EXPECT_THAT(r.output, HasSubstr("training goes on"));
}

}  // namespace
}  // namespace dtrain::testing
