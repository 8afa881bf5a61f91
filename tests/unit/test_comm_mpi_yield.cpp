// The mpi backend asks Open MPI to yield the core when a blocking call finds
// nothing to do (comm/mpi/backend.h), unless the environment already says
// otherwise; MPI itself (read back through its tool interface) takes the value.
#include <gtest/gtest.h>

#include <mpi.h>

#include <cstdlib>
#include <string>

#include "comm/mpi/backend.h"

namespace dtrain::comm::mpi_backend {
namespace {

constexpr const char* kVariable = "OMPI_MCA_mpi_yield_when_idle";

TEST(MpiYieldWhenIdle, SetWhenTheEnvironmentIsSilent) {
  unsetenv(kVariable);
  EXPECT_TRUE(default_yield_when_idle());
  ASSERT_NE(std::getenv(kVariable), nullptr);
  EXPECT_STREQ(std::getenv(kVariable), "1");
  unsetenv(kVariable);
}

TEST(MpiYieldWhenIdle, TheUsersValueWins) {
  setenv(kVariable, "0", 1);
  EXPECT_FALSE(default_yield_when_idle());
  EXPECT_STREQ(std::getenv(kVariable), "0");
  unsetenv(kVariable);
}

// A singleton MPI process (no mpirun): the backend initialises MPI, and
// Open MPI's control variable holds the value dtrain chose.
TEST(MpiYieldWhenIdle, OpenMpiTakesTheValue) {
  unsetenv(kVariable);
  const MpiBackend backend;
  int provided = 0;
  ASSERT_EQ(MPI_T_init_thread(MPI_THREAD_SINGLE, &provided), MPI_SUCCESS);
  int index = -1;
  ASSERT_EQ(MPI_T_cvar_get_index("mpi_yield_when_idle", &index), MPI_SUCCESS)
      << "this Open MPI has no control variable mpi_yield_when_idle";
  MPI_T_cvar_handle handle;
  int count = 0;
  ASSERT_EQ(MPI_T_cvar_handle_alloc(index, nullptr, &handle, &count), MPI_SUCCESS);
  int value = 0;  // zeroed first, so that a variable narrower than int reads right too
  ASSERT_EQ(MPI_T_cvar_read(handle, &value), MPI_SUCCESS);
  EXPECT_NE(value, 0);
  MPI_T_cvar_handle_free(&handle);
  MPI_T_finalize();
  unsetenv(kVariable);
}

}  // namespace
}  // namespace dtrain::comm::mpi_backend
