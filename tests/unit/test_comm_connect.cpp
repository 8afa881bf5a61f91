// Choosing a backend from the environment, and finding the run's store.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "cluster/environment.h"
#include "comm/connect.h"
#include "comm/memory_store.h"
#include "core/error.h"
#include "support/processes.h"

namespace dtrain {
namespace {

using ::testing::HasSubstr;

cluster::Environment env_of(cluster::Starter starter, bool pmix, int world = 2) {
  cluster::Environment env;
  env.starter = starter;
  env.pmix = pmix;
  env.world_size = world;
  env.local_world_size = world;
  return env;
}

TEST(CommConnect, AutoPicksNcclOnCudaMpiUnderPmixGlooOtherwise) {
  using cluster::Starter;
  EXPECT_EQ(comm::resolve_backend("auto", "cuda", env_of(Starter::mpirun, true)), "nccl");
  EXPECT_EQ(comm::resolve_backend("auto", "cpu", env_of(Starter::mpirun, true)), "mpi");
  EXPECT_EQ(comm::resolve_backend("auto", "cpu", env_of(Starter::slurm, true)), "mpi");
  EXPECT_EQ(comm::resolve_backend("auto", "cpu", env_of(Starter::slurm, false)), "gloo");
  EXPECT_EQ(comm::resolve_backend("auto", "cpu", env_of(Starter::launcher, false)), "gloo");
  EXPECT_EQ(comm::resolve_backend("auto", "cpu", env_of(Starter::single, false, 1)), "gloo");
  EXPECT_EQ(comm::resolve_backend("gloo", "cpu", env_of(Starter::mpirun, true)), "gloo");
}

TEST(CommConnect, SingleProcessGetsAnInMemoryStoreAndAWorkingCommunicator) {
  const cluster::Environment env = cluster::detect_environment({});
  comm::OpenedStore opened = comm::open_store(env, std::chrono::seconds(5));
  ASSERT_NE(opened.store, nullptr);
  EXPECT_EQ(opened.server, nullptr);
  comm::ConnectOptions options;
  options.store = opened.store;
  auto comm = comm::connect(env, options);
  EXPECT_STREQ(comm->backend_name(), "gloo");
  float x = 3.0f;
  comm->allreduce(&x, 1, DType::f32, comm::ReduceOp::avg).wait();
  EXPECT_EQ(x, 3.0f);
}

TEST(CommConnect, RankZeroHostsTheStoreWhenNobodyElseDoes) {
  const std::string address = "127.0.0.1:" + std::to_string(testing::free_port());
  const auto rank0 = cluster::detect_environment(
      {{"DTRAIN_RANK", "0"}, {"DTRAIN_WORLD_SIZE", "2"}, {"DTRAIN_STORE", address}, {"DTRAIN_TOKEN", "x"}});
  const auto rank1 = cluster::detect_environment(
      {{"DTRAIN_RANK", "1"}, {"DTRAIN_WORLD_SIZE", "2"}, {"DTRAIN_STORE", address}, {"DTRAIN_TOKEN", "x"}});
  comm::OpenedStore host = comm::open_store(rank0, std::chrono::seconds(5));
  ASSERT_NE(host.server, nullptr);
  comm::OpenedStore guest = comm::open_store(rank1, std::chrono::seconds(5));
  EXPECT_EQ(guest.server, nullptr);  // the port is taken: rank 1 only connects
  guest.store->set("k", comm::to_bytes("v"));
  EXPECT_EQ(comm::to_string(host.store->get("k", std::chrono::seconds(1))), "v");
}

TEST(CommConnect, GlooWithoutAStoreSaysWhatToSet) {
  comm::ConnectOptions options;
  options.backend = "gloo";
  try {
    comm::connect(env_of(cluster::Starter::mpirun, true), options);
    FAIL() << "connected without a store";
  } catch (const CommError& e) {
    EXPECT_THAT(e.what(), HasSubstr("DTRAIN_STORE=host:port"));
  }
}

TEST(CommConnect, MpiOutsideMpirunIsRefused) {
  comm::ConnectOptions options;
  options.backend = "mpi";
  try {
    comm::connect(env_of(cluster::Starter::launcher, false), options);
    FAIL() << "mpi backend without mpirun";
  } catch (const CommError& e) {
    EXPECT_THAT(e.what(), HasSubstr("mpirun or srun --mpi=pmix"));
  }
}

}  // namespace
}  // namespace dtrain
