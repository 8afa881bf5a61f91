// Naming the ranks that did not reach a failed operation.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "comm/diagnosis.h"
#include "comm/memory_store.h"

namespace dtrain {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

TEST(CommDiagnosis, SilentRanksAreMissingAndRanksBehindAreNamedWithTheirOperation) {
  comm::MemoryStore store;
  // rank 1 failed at #24 (it was still finishing it); rank 3 said nothing.
  store.set("comm/world/arrived/1", comm::to_bytes("24"));
  store.set("comm/world/arrived/2", comm::to_bytes("25"));
  const auto report = comm::report_arrival(&store, "world", 0, 4, 25, 100ms);
  EXPECT_THAT(report.missing, ElementsAre(3));
  EXPECT_THAT(report.text, HasSubstr("rank 3 did not reach #25 and reported nothing"));
  EXPECT_THAT(report.text, HasSubstr("failed earlier: rank 1 at #24"));
  EXPECT_THAT(report.text, HasSubstr("ranks 0, 2 reached it"));
  EXPECT_EQ(comm::to_string(store.get("comm/world/arrived/0", 1s)), "25");
}

TEST(CommDiagnosis, EveryoneArrivedMeansTheCauseIsElsewhere) {
  comm::MemoryStore store;
  store.set("comm/g/arrived/1", comm::to_bytes("7"));
  const auto report = comm::report_arrival(&store, "g", 0, 2, 7, 1s);
  EXPECT_TRUE(report.missing.empty());
  EXPECT_EQ(report.text, "every rank reached #7");
}

TEST(CommDiagnosis, WithoutAStoreItSaysSo) {
  const auto report = comm::report_arrival(nullptr, "g", 0, 2, 7, 1s);
  EXPECT_THAT(report.text, HasSubstr("no store"));
}

TEST(CommDiagnosis, RankListsAreCompact) {
  EXPECT_EQ(comm::format_ranks({0, 1, 2, 5, 7, 8}), "0-2, 5, 7-8");
  EXPECT_EQ(comm::format_ranks({3}), "3");
}

}  // namespace
}  // namespace dtrain
