// The mpi backend in real processes started by mpirun (Open MPI): every
// collective against closed-form results for 1-4 ranks, and a rank that
// never arrives (the watchdog turns MPI's endless wait into a TimeoutError
// naming the missing rank, found through the store rank 0 hosts).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "support/processes.h"
#include "support/run_command.h"

namespace dtrain {
namespace {

using ::testing::HasSubstr;

// mpirun as root, more ranks than cores, shared memory between ranks.
std::string mpirun(int np) {
  return "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 "
         "timeout -s KILL 300 mpirun -np " + std::to_string(np) + " ";
}

class MpiWorld : public ::testing::TestWithParam<int> {};

TEST_P(MpiWorld, EveryCollectiveMatchesClosedForm) {
  const int np = GetParam();
  const auto result = testing::run_command(mpirun(np) + testing::program_dir() +
                                           "/comm_conformance --backend mpi --large");
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_THAT(result.output, HasSubstr("wrong_total: 0"));
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, MpiWorld, ::testing::Values(1, 2, 3, 4));

TEST(CommMpi, RankThatNeverArrivesIsNamedByTheOthers) {
  const std::string store = "127.0.0.1:" + std::to_string(testing::free_port());
  const auto result = testing::run_command(
      "DTRAIN_STORE=" + store + " DTRAIN_TOKEN=t " + mpirun(3) + "-x DTRAIN_STORE -x DTRAIN_TOKEN " +
      testing::program_dir() + "/comm_conformance --backend mpi --timeout-ms 1500 --hang-rank 2");
  EXPECT_NE(result.exit_code, 0);
  EXPECT_THAT(result.output, HasSubstr("TimeoutError"));
  EXPECT_THAT(result.output, HasSubstr("allreduce #1 (f32 x 1024, sum)"));
  EXPECT_THAT(result.output, HasSubstr("rank 2 did not reach #1"));
}

}  // namespace
}  // namespace dtrain
