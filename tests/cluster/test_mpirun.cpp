// examples/mpirun.sh: `mpirun -np 2 dtrain-worker` with no store and no
// DTRAIN_* variables takes rank and world from Open MPI, picks the mpi
// backend, and trains what one rank with the combined batch trains.
#include "cluster/cluster_testing.h"

namespace dtrain::testing {
namespace {

using ::testing::HasSubstr;

TEST(Mpirun, ExampleScriptTrainsWithTheMpiBackendAndNoStore) {
  TempDir dir;
  const std::string config = dir.write("tiny.json", kTinyLm).string();
  const auto ref = run_command(fmt::format("{} --config {} --set train.micro_batch_size=8 --set train.out_dir={}",
                                           worker_bin(), config, dir.file("ref")));
  ASSERT_EQ(ref.exit_code, 0) << ref.output;
  const auto r = run_command(fmt::format(
      "env -u DTRAIN_STORE -u DTRAIN_TOKEN CONFIG={} OUT_DIR={} BIN_DIR={} timeout -s KILL 180 {}/examples/mpirun.sh 2 "
      "--set parallel.zero_stage=2",
      config, dir.file("mpirun"), bin_dir(), source_dir()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("2 rank(s) (mpirun), backend mpi, ZeRO stage 2"));
  expect_close_losses(step_losses(dir / "mpirun"), step_losses(dir / "ref"));
}

}  // namespace
}  // namespace dtrain::testing
