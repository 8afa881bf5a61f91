// Rendezvous: how the agents of a job agree, round after round, on who takes
// part and which ranks each node runs. Every key lives under
// "<run id>/launch/" in the run's store (workers use "<run id>/round<R>/"):
//
//   round             the round agents join now (decimal)
//   r<R>/joined       agents that arrived at round R (a counter: arrival order)
//   r<R>/node/<i>     what agent i brings: "store=<0|1> hint=<node rank|-1> nproc=<P> host=<name>"
//   r<R>/closed       how many agents take part (the first <closed> arrivals)
//   r<R>/waiting      agents that arrived after the round closed (want the next one)
//   r<R>/alive/<n>    node n's agent beat (a counter it bumps while it supervises)
//   r<R>/end          why the round ended; the first writer wins (see RoundEnd)
//   r<R>/succeeded    agents whose workers all exited 0
//   r<R>/left         agents that saw the job end (the host waits for them before closing the store)
//   r<R>/master_port  the workers' MASTER_PORT (PyTorch's own store), chosen by node rank 0
//
// A round closes when MAX agents joined, or (elastic) when MIN joined and
// --rdzv-last-call passed without more. Node ranks: the store's host first,
// then by --node-rank, then by arrival.
//
// Threading: one agent thread uses a Rendezvous. Every wait is bounded.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/store.h"

namespace dtrain::launcher {

struct NodeInfo {
  bool hosts_store = false;
  int hint = -1;  // --node-rank, -1 when not given
  int nproc = 1;
  std::string host;
  int arrival = 0;
};

struct RoundPlan {
  int round = 0;
  int node_rank = 0;
  int num_nodes = 1;
  int world_size = 1;
  int rank_base = 0;  // this node's first global rank
  std::vector<NodeInfo> nodes;  // by node rank
};

// Why a round ended. Written once per round (the first writer wins).
struct RoundEnd {
  enum class Kind { failure, membership, stopped };
  Kind kind = Kind::failure;
  std::string headline;  // one line: what happened, where
  std::string details;   // more lines (a log's tail, a hang report); may be empty
  int signal = 0;        // kind stopped: the signal the job was stopped with
};

struct RendezvousOptions {
  int min_nodes = 1;
  int max_nodes = 1;
  std::chrono::milliseconds timeout{600'000};
  std::chrono::milliseconds last_call{10'000};
  // Called on every poll while waiting; may throw to give up (a stop signal).
  std::function<void()> poll_hook;
};

class Rendezvous {
 public:
  // `store` is the run's store already scoped to "<run id>/launch".
  Rendezvous(std::shared_ptr<comm::Store> store, RendezvousOptions options, NodeInfo self);

  // Joins the current round and waits until it closes; an agent that came
  // too late waits for the next round. Throws TimeoutError naming how many
  // nodes joined and how many were needed.
  RoundPlan join();

  // Records why `round` ended unless someone did first; returns the record
  // that stands.
  RoundEnd end_round(int round, const RoundEnd& end);
  std::optional<RoundEnd> round_end(int round);
  // Moves the job on to round + 1 (idempotent across agents).
  void advance(int round);
  // Agents arrived too late for `round` and waiting for the next one.
  std::int64_t waiting(int round);

  // This agent's beat; the beats of the other nodes of the plan.
  void beat(const RoundPlan& plan);
  std::vector<std::int64_t> beats(const RoundPlan& plan);

  // Counts this agent's workers as done; returns how many nodes are.
  std::int64_t mark_succeeded(int round);
  std::int64_t succeeded(int round);
  std::int64_t mark_left(int round);
  std::int64_t left(int round);

  // The workers' MASTER_PORT in the plan's round: node rank 0 sets it to
  // pick() (a free port on its host), the others wait for it (within the
  // rendezvous timeout: TimeoutError).
  int master_port(const RoundPlan& plan, const std::function<int()>& pick);

 private:
  int current_round();
  std::optional<int> close_wait(int round, std::chrono::steady_clock::time_point deadline);
  RoundPlan make_plan(int round, int arrival, int closed);

  std::shared_ptr<comm::Store> store_;
  RendezvousOptions options_;
  NodeInfo self_;
};

std::string encode(const RoundEnd& end);
RoundEnd decode_round_end(const std::string& text);

}  // namespace dtrain::launcher
