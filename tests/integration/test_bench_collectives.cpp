// dtrain-bench's collective benchmarks end to end: two ranks under mpirun,
// on the mpi and gloo backends, every collective at small sizes. Checks the
// nccl-tests table, the `name: value` lines and that every result was right.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <sstream>
#include <string>
#include <tuple>

#include <fmt/format.h>

#include "support/run_command.h"

namespace dtrain::testing {
namespace {

// A loopback TCP port that was free a moment ago (the store binds it next).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error("socket failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ::close(fd);
    throw std::runtime_error("bind to 127.0.0.1:0 failed");
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

// `mpirun -np 2 dtrain-bench ARGS --backend BACKEND`; gloo meets through a
// store that rank 0 hosts on a free loopback port.
CommandResult bench(const std::string& backend, const std::string& args) {
  std::string store_env, forward;
  if (backend == "gloo") {
    store_env = fmt::format("DTRAIN_STORE=127.0.0.1:{} ", free_port());
    forward = "-x DTRAIN_STORE ";
  }
  return run_command(fmt::format(
      "{}OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
      "OMPI_MCA_rmaps_base_oversubscribe=1 mpirun -np 2 {}{}/dtrain-bench {} --backend {} "
      "--timeout-s 20",
      store_env, forward, bin_dir(), args, backend));
}

// Table rows: lines whose first field is a size in bytes.
int table_rows(const std::string& output) {
  std::istringstream in(output);
  int rows = 0;
  for (std::string line; std::getline(in, line);) {
    std::istringstream fields(line);
    std::string first;
    if (fields >> first && first.find_first_not_of("0123456789") == std::string::npos) ++rows;
  }
  return rows;
}

void expect_header(const std::string& output) {
  for (const char* column : {"size(B)", "count", "type", "redop", "time(us)", "algbw(GB/s)",
                             "busbw(GB/s)", "#wrong"}) {
    EXPECT_NE(output.find(column), std::string::npos) << column << " missing in\n" << output;
  }
}

using Case = std::tuple<std::string, std::string>;  // collective, backend

class BenchCollective : public ::testing::TestWithParam<Case> {};

TEST_P(BenchCollective, PrintsTableAndEveryResultIsRight) {
  const auto& [collective, backend] = GetParam();
  const CommandResult r = bench(backend, collective + " --max-bytes 1M --iters 2 --warmup 1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_header(r.output);
  EXPECT_NE(r.output.find("# dtrain-bench " + collective + ": backend " + backend +
                          ", world size 2"),
            std::string::npos)
      << r.output;
  // 8 B .. 1 MiB doubling: 18 sizes, each holding a whole element per rank.
  EXPECT_EQ(table_rows(r.output), 18) << r.output;
  EXPECT_NE(r.output.find("wrong_total: 0\n"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("world_size: 2\n"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("backend: " + backend + "\n"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("busbw_avg: "), std::string::npos) << r.output;
}

INSTANTIATE_TEST_SUITE_P(
    TwoRanks, BenchCollective,
    ::testing::Combine(::testing::Values("allreduce", "reduce_scatter", "allgather", "broadcast"),
                       ::testing::Values("mpi", "gloo")),
    [](const ::testing::TestParamInfo<Case>& info) {
      return std::get<0>(info.param) + "_" + std::get<1>(info.param);
    });

// 16-bit dtypes with the reductions that are not plain sums.
TEST(BenchCollectives, HalfPrecisionAvgAndMaxAreRight) {
  const CommandResult avg = bench("gloo", "allreduce --dtype bf16 --op avg --max-bytes 64K "
                                          "--iters 1 --warmup 0");
  ASSERT_EQ(avg.exit_code, 0) << avg.output;
  EXPECT_NE(avg.output.find("wrong_total: 0\n"), std::string::npos) << avg.output;
  const CommandResult max = bench("mpi", "reduce_scatter --dtype f16 --op max --max-bytes 64K "
                                         "--iters 1 --warmup 0");
  ASSERT_EQ(max.exit_code, 0) << max.output;
  EXPECT_NE(max.output.find("wrong_total: 0\n"), std::string::npos) << max.output;
}

TEST(BenchCollectives, BroadcastFromTheLastRankIsRight) {
  const CommandResult r = bench("gloo", "broadcast --root 1 --max-bytes 64K --iters 1 --warmup 0");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("root 1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("wrong_total: 0\n"), std::string::npos) << r.output;
}

TEST(BenchCollectives, RootOutsideTheWorldIsAConfigError) {
  const CommandResult r = run_command(bin_dir() + "/dtrain-bench broadcast --root 3 --backend mpi");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--root"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace dtrain::testing
