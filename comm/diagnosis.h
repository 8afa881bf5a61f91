// When a collective fails, the ranks that did reach it say so through the
// store; whoever is absent is named in the error. Only failures pay for
// this: nothing is written to the store while operations succeed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/store.h"

namespace dtrain::comm {

struct ArrivalReport {
  // "rank 3 did not reach #5 and reported nothing; failed earlier: rank 1 at #4;
  // ranks 0, 2 reached it", or why nobody can tell.
  std::string text;
  std::vector<int> missing;  // ranks that reported nothing: dead, stopped or stuck elsewhere
};

// Records that `rank` reached operation `seq` of communicator `name`, then
// waits up to `grace` for the other ranks to record the same and reports who
// did not. Never throws: an unreachable store is reported in the text.
ArrivalReport report_arrival(Store* store, const std::string& name, int rank, int world_size,
                             std::uint64_t seq, Duration grace);

// "0-3", "0, 2, 5-7": a compact list of ranks for messages.
std::string format_ranks(const std::vector<int>& ranks);

}  // namespace dtrain::comm
