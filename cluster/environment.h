// cluster::Environment: who this process is in the job, read from whichever
// starter set its environment (docs/ARCHITECTURE.md, "Process contract"):
//   dtrain-launch  DTRAIN_RANK, DTRAIN_WORLD_SIZE, DTRAIN_LOCAL_RANK, ... (wins over the rest;
//                  it sets torchrun's variables too)
//   torchrun       RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK (or a script
//                  setting them by hand); the store at MASTER_ADDR:MASTER_PORT (next
//                  section). They win over mpirun's and srun's: torchrun started by
//                  mpirun or srun passes those down, and they describe the agent
//   mpirun         OMPI_COMM_WORLD_RANK/_SIZE/_LOCAL_RANK/_LOCAL_SIZE/_NODE_RANK
//   srun           SLURM_PROCID, SLURM_STEP_NUM_TASKS or SLURM_NTASKS, SLURM_LOCALID, ...
//                  (PMIX_RANK too with --mpi=pmix; OMPI_COMM_WORLD_* are unset there);
//                  the store's address from SLURM_STEP_NODELIST and DTRAIN_STORE_PORT
//   nothing        a single process: rank 0 of 1
// Partial or conflicting variables are an error that names them. A variable
// set to the empty string counts as unset.
//
// The store under torchrun: DTRAIN_STORE when set, else MASTER_ADDR with
// DTRAIN_STORE_PORT, or MASTER_PORT; rank 0 hosts it. When torchrun's agent
// keeps PyTorch's own store on MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=True,
// torchrun's static rendezvous), dtrain's goes on MASTER_PORT + 1.
#pragma once

#include <optional>
#include <string>

#include "cluster/env_vars.h"

namespace dtrain::cluster {

enum class Starter { single, launcher, torchrun, mpirun, slurm };
const char* starter_name(Starter starter);  // "single", "dtrain-launch", "torchrun", "mpirun", "srun"

struct Environment {
  Starter starter = Starter::single;
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  int node_rank = 0;
  bool pmix = false;                  // PMIx is present (mpirun, srun --mpi=pmix): MPI can start
  // "host:port" of the run's store, when known: DTRAIN_STORE; under torchrun
  // (world > 1) MASTER_ADDR and a port as above; under srun (world > 1) the
  // first host of SLURM_STEP_NODELIST with DTRAIN_STORE_PORT or the port
  // derived from the job and step ids (cluster/slurm_store.h).
  std::optional<std::string> store;
  bool store_from_slurm = false;      // `store` was derived that way: rank 0 must host it
  std::string token;                  // DTRAIN_TOKEN ("" when unset)
  std::string run_id;                 // DTRAIN_RUN_ID, else TORCHELASTIC_RUN_ID or SLURM_JOB_ID, else ""
  int restart = 0;                    // DTRAIN_RESTART, or torchrun's TORCHELASTIC_RESTART_COUNT
  // Slurm facts, when under srun (empty otherwise).
  std::string slurm_job_id;
  std::string slurm_step_id;
  std::string slurm_step_nodelist;    // e.g. "n[01-04]"
  std::string slurm_restart_count;    // SLURM_RESTART_COUNT: times the job was requeued ("" when never)
  std::string slurmd_nodename;        // SLURMD_NODENAME: the node this task runs on
  // What picks the CUDA device (cluster/devices.h), under any starter ("" when unset).
  std::string cuda_visible_devices;   // CUDA_VISIBLE_DEVICES
  std::string slurm_gpus;             // SLURM_STEP_GPUS, else SLURM_JOB_GPUS

  // "rank 3 of 8 (local 1 of 2, node 1), started by mpirun"
  std::string describe() const;
};

// Reads an Environment from `vars` (pure; tests pass their own map).
// Throws dtrain::Error naming the variables that are missing, malformed or
// in conflict, and what to do.
Environment detect_environment(const EnvMap& vars);

}  // namespace dtrain::cluster
