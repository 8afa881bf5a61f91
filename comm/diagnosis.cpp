#include "comm/diagnosis.h"

#include <exception>
#include <thread>

#include <fmt/format.h>

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
    std::vector<char> arrived(static_cast<std::size_t>(world_size), 0);
    arrived[static_cast<std::size_t>(rank)] = 1;
    const auto deadline = std::chrono::steady_clock::now() + grace;
    for (;;) {
      bool all = true;
      for (int r = 0; r < world_size; ++r) {
        auto& a = arrived[static_cast<std::size_t>(r)];
        if (!a) a = recorded_seq(*store, arrival_key(name, r)) >= seq ? 1 : 0;
        all = all && a;
      }
      if (all || std::chrono::steady_clock::now() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    std::vector<int> present;
    for (int r = 0; r < world_size; ++r) {
      (arrived[static_cast<std::size_t>(r)] ? present : report.missing).push_back(r);
    }
    if (report.missing.empty()) {
      report.text = fmt::format("every rank reached #{}", seq);
    } else {
      report.text = fmt::format("rank{} {} did not reach #{} (rank{} {} did)",
                                report.missing.size() > 1 ? "s" : "", format_ranks(report.missing),
                                seq, present.size() > 1 ? "s" : "", format_ranks(present));
    }
  } catch (const std::exception& e) {
    report.text = fmt::format("could not ask the store which ranks arrived: {}", e.what());
  }
  return report;
}

}  // namespace dtrain::comm
