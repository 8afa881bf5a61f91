// The environment of this node's workers in one round (docs/launcher.md,
// "What the workers get"): the agent's own environment, less the placement an
// enclosing launch gave the agent (srun, mpirun, dtrain-launch, torchrun),
// plus two contracts that agree with each other:
//   dtrain's   DTRAIN_RANK, DTRAIN_WORLD_SIZE, DTRAIN_LOCAL_RANK, ... DTRAIN_STORE
//   torchrun's RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,
//              ROLE_RANK, ROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
//              TORCHELASTIC_RESTART_COUNT / _MAX_RESTARTS / _RUN_ID / _ERROR_FILE
// so that dtrain-worker and a PyTorch script (init_process_group with
// init_method="env://") both run under the launcher unchanged.
#pragma once

#include <map>
#include <string>

#include "cluster/environment.h"
#include "launcher/options.h"
#include "launcher/rendezvous.h"

namespace dtrain::launcher {

// What the round adds to the options and the plan.
struct WorkerRound {
  std::string token;        // the run's store token (DTRAIN_TOKEN)
  int master_port = 0;      // PyTorch's own store, on node rank 0's host (not dtrain's store)
  int restarts = 0;         // restarts after failures so far (TORCHELASTIC_RESTART_COUNT)
  double heartbeat_s = 0;   // DTRAIN_HEARTBEAT_S; 0: no heartbeat
  bool metrics = false;     // DTRAIN_METRICS: the heartbeat publishes metrics snapshots
};

// Several workers share this node and `agent_env` has no OMP_NUM_THREADS: as
// torchrun, the workers get OMP_NUM_THREADS=1 (and DTRAIN_OMP_DEFAULTED=1,
// by which dtrain-worker knows to split the node's cores itself).
bool defaults_omp_threads(const LaunchOptions& options, const cluster::EnvMap& agent_env);

// Every worker's variables of the round (pure).
std::map<std::string, std::string> worker_base_environment(const LaunchOptions& options, const RoundPlan& plan,
                                                           const cluster::EnvMap& agent_env,
                                                           const WorkerRound& round);

// One worker's own: DTRAIN_RANK, DTRAIN_LOCAL_RANK, RANK, ROLE_RANK,
// LOCAL_RANK, and TORCHELASTIC_ERROR_FILE (`error_file`: launcher/error_file.h).
std::map<std::string, std::string> worker_rank_environment(int rank, int local_rank, const std::string& error_file);

// A TCP port free on this host a moment ago (bound to port 0 and released):
// node rank 0's choice of MASTER_PORT. Throws IoError.
int free_tcp_port();

}  // namespace dtrain::launcher
