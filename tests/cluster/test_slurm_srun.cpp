// Jobs started by srun on a real Slurm cluster of two fake nodes:
// dtrain-worker directly (the store on the step's first node, the run token
// handed over in a file), with PMIx and the mpi backend, and one dtrain-launch
// per node. Each trains what the same job started by hand trains.
#include "cluster/cluster_testing.h"

namespace dtrain::testing {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

class SlurmSrun : public SlurmTest {};

// The names of the run token files left in out_dir.
std::vector<std::string> token_files(const std::filesystem::path& out_dir) {
  std::vector<std::string> found;
  for (const auto& e : std::filesystem::directory_iterator(out_dir)) {
    if (e.path().filename().string().rfind(".store-token", 0) == 0) found.push_back(e.path().filename());
  }
  return found;
}

TEST_F(SlurmSrun, FourTasksOnTwoNodesTrainExactlyWhatFourRanksStartedByHandTrain) {
  TempDir dir;
  const std::string config = dir.write("tiny.json", kTinyLm).string();
  run_by_hand(dir, config, 4, dir.file("hand"));
  const auto r = run(fmt::format("srun -O -N2 -n4 --mpi=none {} --config {} --set train.out_dir={}", worker_bin(),
                                 config, dir.file("srun")));
  ASSERT_EQ(r.exit_code, 0) << r.output << cluster().log_tails();
  EXPECT_THAT(r.output, HasSubstr("4 rank(s) (srun), backend gloo"));
  EXPECT_EQ(metrics_lines(dir / "srun"), metrics_lines(dir / "hand"));
  EXPECT_THAT(token_files(dir / "srun"), ::testing::IsEmpty()) << "rank 0 removes the token file at the end";
}

TEST_F(SlurmSrun, PmixStepPicksTheMpiBackendAcrossNodes) {
  TempDir dir;
  const std::string config = dir.write("tiny.json", kTinyLm).string();
  const auto ref = run_command(fmt::format("{} --config {} --set train.micro_batch_size=16 --set train.out_dir={}",
                                           worker_bin(), config, dir.file("ref")));
  ASSERT_EQ(ref.exit_code, 0) << ref.output;
  // Two ranks per fake node share one machine: Open MPI's shared-memory
  // transport would see them as different hosts, so TCP on loopback only.
  const auto r = run(fmt::format(
      "OMPI_MCA_btl=self,tcp OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo DTRAIN_TOKEN=secret "
      "srun -O -N2 -n4 --mpi=pmix {} --config {} --set train.out_dir={}",
      worker_bin(), config, dir.file("pmix")));
  ASSERT_EQ(r.exit_code, 0) << r.output << cluster().log_tails();
  EXPECT_THAT(r.output, HasSubstr("4 rank(s) (srun), backend mpi"));
  expect_close_losses(step_losses(dir / "pmix"), step_losses(dir / "ref"));
}

TEST_F(SlurmSrun, TokenFileOnStorageTheOtherNodeCannotSeeIsNamed) {
  TempDir dir;
  const std::string config = dir.write("tiny.json", kTinyLm).string();
  // Each node gets an out_dir of its own, as if it were not shared.
  const auto r = run(fmt::format(
      "srun -O -N2 -n2 --mpi=none bash -c 'exec {} --config {} --set parallel.timeout_s=3 "
      "--set train.out_dir={}/node$SLURM_NODEID'",
      worker_bin(), config, dir.str()));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("the run token file '" + dir.str() + "/node1/.store-token-"));
  EXPECT_THAT(r.output, HasSubstr("storage every node sees"));
}

TEST_F(SlurmSrun, OneLauncherPerNodeTrainsExactlyWhatFourRanksStartedByHandTrain) {
  ASSERT_TRUE(std::filesystem::exists(launch_bin())) << launch_bin() << " is not built";
  TempDir dir;
  const std::string config = dir.write("tiny.json", kTinyLm).string();
  run_by_hand(dir, config, 4, dir.file("hand"));
  const auto r = run(fmt::format(
      "DTRAIN_TOKEN=secret srun -O -N2 --ntasks-per-node=1 --mpi=none {} --nproc-per-node 2 --log-dir {} -- {} --config {} "
      "--set train.out_dir={}",
      launch_bin(), dir.file("logs"), worker_bin(), config, dir.file("launch")));
  ASSERT_EQ(r.exit_code, 0) << r.output << cluster().log_tails();
  EXPECT_THAT(r.output, HasSubstr("4 rank(s) (dtrain-launch), backend gloo"));
  EXPECT_EQ(metrics_lines(dir / "launch"), metrics_lines(dir / "hand"));
}

}  // namespace
}  // namespace dtrain::testing
