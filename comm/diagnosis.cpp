#include "comm/diagnosis.h"

#include <exception>
#include <thread>

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace dtrain::comm {
namespace {

std::string arrival_key(const std::string& name, int rank) {
  return fmt::format("comm/{}/arrived/{}", name, rank);
}

// The operation `rank` has recorded reaching, or 0 when it has recorded none.
std::uint64_t recorded_seq(Store& store, const std::string& key) {
  if (!store.check(key)) return 0;
  const std::string text = to_string(store.get(key, Duration(1000)));
  return std::stoull(text);
}

}  // namespace

std::string format_ranks(const std::vector<int>& ranks) {
  std::string out;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ", ";
    out += j == i ? fmt::format("{}", ranks[i]) : fmt::format("{}-{}", ranks[i], ranks[j]);
    i = j + 1;
  }
  return out;
}

ArrivalReport report_arrival(Store* store, const std::string& name, int rank, int world_size,
                             std::uint64_t seq, Duration grace) {
  ArrivalReport report;
  if (store == nullptr) {
    report.text = "no store to tell which ranks did not arrive";
    return report;
  }
  try {
    store->set(arrival_key(name, rank), to_bytes(std::to_string(seq)));
    // What each rank recorded: 0 = nothing yet; >= seq = reached this operation;
    // below seq = failed at an earlier one (it is alive, just behind).
    std::vector<std::uint64_t> recorded(static_cast<std::size_t>(world_size), 0);
    recorded[static_cast<std::size_t>(rank)] = seq;
    const auto deadline = std::chrono::steady_clock::now() + grace;
    for (;;) {
      bool all = true;
      for (int r = 0; r < world_size; ++r) {
        auto& v = recorded[static_cast<std::size_t>(r)];
        if (v < seq) v = std::max(v, recorded_seq(*store, arrival_key(name, r)));
        all = all && v >= seq;
      }
      if (all || std::chrono::steady_clock::now() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    std::vector<int> reached;
    std::vector<std::string> behind;
    for (int r = 0; r < world_size; ++r) {
      const std::uint64_t v = recorded[static_cast<std::size_t>(r)];
      if (v >= seq) {
        reached.push_back(r);
      } else if (v == 0) {
        report.missing.push_back(r);
      } else {
        behind.push_back(fmt::format("rank {} at #{}", r, v));
      }
    }
    std::vector<std::string> parts;
    if (!report.missing.empty()) {
      parts.push_back(fmt::format("rank{} {} did not reach #{} and reported nothing",
                                  report.missing.size() > 1 ? "s" : "", format_ranks(report.missing), seq));
    }
    if (!behind.empty()) parts.push_back(fmt::format("failed earlier: {}", fmt::join(behind, ", ")));
    if (parts.empty()) {
      report.text = fmt::format("every rank reached #{}", seq);
    } else {
      parts.push_back(fmt::format("rank{} {} reached it", reached.size() > 1 ? "s" : "", format_ranks(reached)));
      report.text = fmt::format("{}", fmt::join(parts, "; "));
    }
  } catch (const std::exception& e) {
    report.text = fmt::format("could not ask the store which ranks arrived: {}", e.what());
  }
  return report;
}

}  // namespace dtrain::comm
