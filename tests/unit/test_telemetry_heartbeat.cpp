// telemetry/heartbeat_format.h: what a worker writes, the launcher reads
// back field for field; text that is not a whole heartbeat is refused.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

#include "telemetry/heartbeat_format.h"

namespace dtrain::telemetry {
namespace {

TEST(HeartbeatFormat, RoundTrips) {
  const HeartbeatRecord h{41, 7, "backward", std::numeric_limits<std::uint64_t>::max()};
  const std::string text = encode_heartbeat(h);
  EXPECT_EQ(text, "beat=41 step=7 phase=backward seq=18446744073709551615");
  const auto back = parse_heartbeat(text);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->beat, h.beat);
  EXPECT_EQ(back->step, h.step);
  EXPECT_EQ(back->phase, h.phase);
  EXPECT_EQ(back->seq, h.seq);
}

TEST(HeartbeatFormat, ReadsFieldsInAnyOrderAndSkipsUnknownOnes) {
  const auto h = parse_heartbeat("seq=3  phase=eval later=x beat=2 step=1");
  ASSERT_TRUE(h.has_value());
  EXPECT_EQ(h->beat, 2);
  EXPECT_EQ(h->step, 1);
  EXPECT_EQ(h->phase, "eval");
  EXPECT_EQ(h->seq, 3u);
}

TEST(HeartbeatFormat, RefusesMalformedText) {
  const char* const kNotHeartbeats[][2] = {
      {"", "empty"},
      {"hello", "no field"},
      {"beat=1 step=2 phase=forward", "seq missing"},
      {"beat=1 beat=2 step=2 phase=forward", "a repeated field does not stand in for seq"},
      {"beat=1 step=2 phase=forward seq=x", "not a number"},
      {"beat=1 step=2x phase=forward seq=3", "trailing characters"},
      {"beat=1 step=2 phase=forward seq=-3", "a sign on seq"},
      {"beat=99999999999999999999 step=2 phase=forward seq=3", "out of range"},
      {"beat=1 step=2 phase= seq=3", "empty phase"},
      {"beat=1 step=2 phase=forward seq=3 junk", "a field without '='"},
  };
  for (const auto& [text, why] : kNotHeartbeats) EXPECT_FALSE(parse_heartbeat(text).has_value()) << why;
}

}  // namespace
}  // namespace dtrain::telemetry
