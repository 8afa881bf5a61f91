// examples/slurm/train.sbatch on a real Slurm cluster of two fake nodes:
// `sbatch --wait` with one dtrain-launch per node, and preemption: a running
// job signalled with USR1 checkpoints, requeues itself, resumes and ends
// with the loss of a run that was never interrupted.
#include "cluster/cluster_testing.h"

#include <regex>

namespace dtrain::testing {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

class SlurmBatch : public SlurmTest {
 protected:
  static std::string script() { return source_dir() + "/examples/slurm/train.sbatch"; }

  // The variables the example script reads, pointed at this test's files.
  static std::string script_env(const TempDir& dir, const std::string& config, const std::string& launch) {
    return fmt::format("CONFIG={} OUT_DIR={} BIN_DIR={} LAUNCH={} NPROC_PER_NODE=2 ", config, dir.file("run"),
                       bin_dir(), launch);
  }

  // `scontrol show job` fields of job `id` ("JobState", "Restarts").
  static std::string job_field(const std::string& id, const std::string& field) {
    const auto r = run("scontrol show job -o " + id, 20s);
    std::smatch m;
    const std::regex re(field + "=(\\S+)");
    return std::regex_search(r.output, m, re) ? m[1].str() : "";
  }

  static std::size_t lines_in(const std::filesystem::path& file) {
    std::ifstream in(file);
    std::size_t n = 0;
    for (std::string line; std::getline(in, line);) ++n;
    return n;
  }
};

TEST_F(SlurmBatch, ExampleScriptWithOneLauncherPerNodeTrainsWhatRanksStartedByHandTrain) {
  ASSERT_TRUE(std::filesystem::exists(launch_bin())) << launch_bin() << " is not built";
  TempDir dir;
  const std::string config = dir.write("tiny.json", kTinyLm).string();
  run_by_hand(dir, config, 4, dir.file("hand"));
  const auto r = run(script_env(dir, config, "dtrain-launch") +
                     fmt::format("sbatch --wait -O -N2 --ntasks-per-node=1 -o {} {}", dir.file("job.out"), script()));
  const std::string job_out = read_file(dir / "job.out");
  ASSERT_EQ(r.exit_code, 0) << r.output << job_out << cluster().log_tails();
  EXPECT_THAT(job_out, HasSubstr("4 rank(s) (dtrain-launch), backend gloo"));
  EXPECT_THAT(job_out, HasSubstr("finished"));
  EXPECT_EQ(metrics_lines(dir / "run"), metrics_lines(dir / "hand"));
}

// LAUNCH=srun: one dtrain-worker per task; dtrain-launch: one launcher per
// node with two workers each. Both run 4 ranks on the 2 nodes.
class SlurmPreemption : public SlurmBatch, public ::testing::WithParamInterface<std::string> {};

TEST_P(SlurmPreemption, SignalledJobCheckpointsRequeuesItselfAndEndsWithTheUninterruptedLoss) {
  const std::string launch = GetParam();
  ASSERT_TRUE(launch != "dtrain-launch" || std::filesystem::exists(launch_bin())) << launch_bin() << " is not built";
  TempDir dir;
  const std::string config = dir.write("tiny.json", kTinyLm).string();
  // Long enough that the signal lands mid-run; the test waits for progress first.
  const std::string sets = "--set train.steps=400 --set train.eval_every=200";
  const auto ref = run(fmt::format("srun -O -N2 -n4 --mpi=none {} --config {} --set train.out_dir={} {}",
                                   worker_bin(), config, dir.file("ref"), sets));
  ASSERT_EQ(ref.exit_code, 0) << ref.output;

  const auto submit = run(script_env(dir, config, launch) +
                          fmt::format("sbatch --parsable -O -N2 --ntasks-per-node={} -o {} {} {}",
                                      launch == "srun" ? 2 : 1, dir.file("job.out"), script(), sets));
  ASSERT_EQ(submit.exit_code, 0) << submit.output;
  const std::string id = submit.output.substr(0, submit.output.find_first_of(";\n"));
  ASSERT_TRUE(SlurmCluster::wait_until([&] { return lines_in(dir / "run" / "metrics.jsonl") >= 5; }, 120s))
      << "the job never trained: " << read_file(dir / "job.out") << cluster().log_tails();
  const auto signal = run("scancel --signal=USR1 " + id, 20s);  // the job steps, not the batch script
  ASSERT_EQ(signal.exit_code, 0) << signal.output;

  std::string state;
  const bool ended = SlurmCluster::wait_until(
      [&] {
        state = job_field(id, "JobState");
        return state == "COMPLETED" || state == "FAILED" || state == "CANCELLED" || state == "TIMEOUT";
      },
      180s);
  const std::string job_out = read_file(dir / "job.out");
  ASSERT_TRUE(ended) << "job " << id << " still " << state << ": " << job_out << cluster().log_tails();
  ASSERT_EQ(state, "COMPLETED") << job_out;
  EXPECT_EQ(job_field(id, "Restarts"), "1") << job_out;
  std::smatch stop;
  ASSERT_TRUE(std::regex_search(job_out, stop, std::regex("stopping after step (\\d+) on signal 10: checkpoint saved")))
      << job_out;
  RecordProperty("stopped_after_step", stop[1].str());
  EXPECT_THAT(job_out, HasSubstr("requeueing"));
  EXPECT_THAT(job_out, HasSubstr("resumed from"));
  EXPECT_THAT(job_out, HasSubstr("finished"));
  EXPECT_EQ(step_losses(dir / "run"), step_losses(dir / "ref")) << "every step, before and after the requeue";
  EXPECT_EQ(final_loss(dir / "run"), final_loss(dir / "ref"));
}

INSTANTIATE_TEST_SUITE_P(Launch, SlurmPreemption, ::testing::Values("srun", "dtrain-launch"),
                         [](const auto& info) { return info.param == "srun" ? "Srun" : "DtrainLaunch"; });

}  // namespace
}  // namespace dtrain::testing
