#include "launcher/rendezvous.h"

#include <algorithm>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "core/error.h"

namespace dtrain::launcher {
namespace {

using Clock = std::chrono::steady_clock;
using comm::to_bytes;
using comm::to_string;
constexpr std::chrono::milliseconds kPoll{100};
constexpr std::chrono::seconds kGet{10};

std::string key(int round, const std::string& name) { return fmt::format("r{}/{}", round, name); }

std::string encode(const NodeInfo& n) {
  return fmt::format("store={} hint={} nproc={} host={}", n.hosts_store ? 1 : 0, n.hint, n.nproc, n.host);
}

NodeInfo decode_node(const std::string& text, int arrival) {
  NodeInfo n;
  n.arrival = arrival;
  std::istringstream in(text);
  for (std::string item; in >> item;) {
    const auto eq = item.find('=');
    const std::string k = item.substr(0, eq), v = eq == std::string::npos ? "" : item.substr(eq + 1);
    if (k == "store") n.hosts_store = v == "1";
    if (k == "hint") n.hint = std::stoi(v);
    if (k == "nproc") n.nproc = std::stoi(v);
    if (k == "host") n.host = v;
  }
  return n;
}

}  // namespace

std::string encode(const RoundEnd& end) {
  return fmt::format("{}\n{}\n{}\n{}", static_cast<int>(end.kind), end.signal, end.headline, end.details);
}

RoundEnd decode_round_end(const std::string& text) {
  RoundEnd end;
  std::istringstream in(text);
  std::string line;
  std::getline(in, line);
  end.kind = static_cast<RoundEnd::Kind>(std::stoi(line.empty() ? "0" : line));
  std::getline(in, line);
  end.signal = std::stoi(line.empty() ? "0" : line);
  std::getline(in, end.headline);
  std::stringstream rest;
  rest << in.rdbuf();
  end.details = rest.str();
  return end;
}

Rendezvous::Rendezvous(std::shared_ptr<comm::Store> store, RendezvousOptions options, NodeInfo self)
    : store_(std::move(store)), options_(options), self_(std::move(self)) {}

int Rendezvous::current_round() {
  if (!store_->check("round")) return 0;
  return std::stoi(to_string(store_->get("round", kGet)));
}

RoundPlan Rendezvous::join() {
  const auto deadline = Clock::now() + options_.timeout;
  for (;;) {
    const int round = current_round();
    const int arrival = static_cast<int>(store_->add(key(round, "joined"), 1)) - 1;
    store_->set(key(round, fmt::format("node/{}", arrival)), to_bytes(encode(self_)));
    const std::optional<int> closed = close_wait(round, deadline);
    if (closed && arrival < *closed) return make_plan(round, arrival, *closed);
    // Too late for this round: say so (elastic agents then make room) and wait for the next.
    store_->add(key(round, "waiting"), 1);
    while (current_round() == round) {
      if (Clock::now() > deadline) {
        throw TimeoutError(fmt::format("rendezvous: this node arrived after round {} closed and no new round began "
                                       "within --rdzv-timeout {:.0f} s",
                                       round, std::chrono::duration<double>(options_.timeout).count()));
      }
      if (options_.poll_hook) options_.poll_hook();
      std::this_thread::sleep_for(kPoll * 2);
    }
  }
}

std::optional<int> Rendezvous::close_wait(int round, Clock::time_point deadline) {
  std::optional<Clock::time_point> min_since;
  const std::string closed_key = key(round, "closed");
  for (;;) {
    if (store_->check(closed_key)) return std::stoi(to_string(store_->get(closed_key, kGet)));
    const std::int64_t joined = store_->add(key(round, "joined"), 0);
    if (joined >= options_.min_nodes && !min_since) min_since = Clock::now();
    const bool full = joined >= options_.max_nodes;
    if (full || (min_since && Clock::now() - *min_since >= options_.last_call)) {
      const auto n = std::min<std::int64_t>(joined, options_.max_nodes);
      store_->compare_set(closed_key, {}, to_bytes(std::to_string(n)));
      continue;
    }
    if (Clock::now() > deadline) {
      throw TimeoutError(fmt::format(
          "rendezvous: round {} has {} of {} node(s) after --rdzv-timeout {:.0f} s; start dtrain-launch on the "
          "missing node(s) with the same --rdzv-endpoint, --rdzv-id and DTRAIN_TOKEN",
          round, joined, options_.min_nodes, std::chrono::duration<double>(options_.timeout).count()));
    }
    if (options_.poll_hook) options_.poll_hook();
    std::this_thread::sleep_for(kPoll);
  }
}

RoundPlan Rendezvous::make_plan(int round, int arrival, int closed) {
  std::vector<std::string> keys;
  for (int i = 0; i < closed; ++i) keys.push_back(key(round, fmt::format("node/{}", i)));
  store_->wait(keys, std::chrono::seconds(30));  // each arrival writes its record right after counting itself
  RoundPlan plan;
  plan.round = round;
  for (int i = 0; i < closed; ++i) plan.nodes.push_back(decode_node(to_string(store_->get(keys[i], kGet)), i));
  std::stable_sort(plan.nodes.begin(), plan.nodes.end(), [](const NodeInfo& a, const NodeInfo& b) {
    const auto order = [](const NodeInfo& n) {
      return std::tuple(n.hosts_store ? 0 : 1, n.hint < 0 ? 1 << 30 : n.hint, n.arrival);
    };
    return order(a) < order(b);
  });
  plan.num_nodes = closed;
  plan.world_size = 0;
  for (int n = 0; n < closed; ++n) {
    if (plan.nodes[n].arrival == arrival) {
      plan.node_rank = n;
      plan.rank_base = plan.world_size;
    }
    plan.world_size += plan.nodes[n].nproc;
  }
  return plan;
}

RoundEnd Rendezvous::end_round(int round, const RoundEnd& end) {
  const comm::Bytes now = store_->compare_set(key(round, "end"), {}, to_bytes(encode(end)));
  return decode_round_end(to_string(now));
}

std::optional<RoundEnd> Rendezvous::round_end(int round) {
  if (!store_->check(key(round, "end"))) return std::nullopt;
  return decode_round_end(to_string(store_->get(key(round, "end"), kGet)));
}

void Rendezvous::advance(int round) {
  const std::string next = std::to_string(round + 1);
  const comm::Bytes now = store_->compare_set("round", to_bytes(std::to_string(round)), to_bytes(next));
  if (round == 0 && now.empty()) store_->compare_set("round", {}, to_bytes(next));
}

std::int64_t Rendezvous::waiting(int round) { return store_->add(key(round, "waiting"), 0); }

void Rendezvous::beat(const RoundPlan& plan) { store_->add(key(plan.round, fmt::format("alive/{}", plan.node_rank)), 1); }

std::vector<std::int64_t> Rendezvous::beats(const RoundPlan& plan) {
  std::vector<std::int64_t> out;
  for (int n = 0; n < plan.num_nodes; ++n) out.push_back(store_->add(key(plan.round, fmt::format("alive/{}", n)), 0));
  return out;
}

std::int64_t Rendezvous::mark_succeeded(int round) { return store_->add(key(round, "succeeded"), 1); }
std::int64_t Rendezvous::succeeded(int round) { return store_->add(key(round, "succeeded"), 0); }
std::int64_t Rendezvous::mark_left(int round) { return store_->add(key(round, "left"), 1); }
std::int64_t Rendezvous::left(int round) { return store_->add(key(round, "left"), 0); }

int Rendezvous::master_port(const RoundPlan& plan, const std::function<int()>& pick) {
  const std::string k = key(plan.round, "master_port");
  if (plan.node_rank == 0) {
    const int port = pick();
    store_->set(k, to_bytes(std::to_string(port)));
    return port;
  }
  try {
    return std::stoi(to_string(store_->get(k, options_.timeout)));
  } catch (const TimeoutError&) {
    throw TimeoutError(fmt::format("round {}: node rank 0 never published the workers' MASTER_PORT within the "
                                   "rendezvous timeout; is its agent alive?", plan.round));
  }
}

}  // namespace dtrain::launcher
