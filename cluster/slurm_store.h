// Where the run's store lives when `srun -n N dtrain-worker` starts the job
// without a launcher (docs/cluster.md): rank 0, which Slurm places on the
// first host of SLURM_STEP_NODELIST, hosts it there on DTRAIN_STORE_PORT or
// on a port derived from the job and step ids, so that two jobs (or two
// steps of one job) sharing a node do not pick the same port.
//
// All functions are pure and thread-safe.
#pragma once

#include <filesystem>
#include <string>

namespace dtrain::cluster {

// Derived ports lie in [kSlurmStorePortBase, kSlurmStorePortBase + kSlurmStorePortSpan):
// below Linux's ephemeral range (32768-60999) and below 29500, the port
// people usually give DTRAIN_STORE by hand.
inline constexpr int kSlurmStorePortBase = 20000;
inline constexpr int kSlurmStorePortSpan = 8000;
// Steps of one job that get ports of their own before they wrap around.
inline constexpr int kSlurmStepsPerJob = 8;

// kSlurmStorePortBase + (job_id * 8 + step_id % 8) % 8000: consecutive jobs
// and the first 8 steps of each get distinct ports; two steps can only
// collide when their job ids differ by a multiple of 1000. Throws
// dtrain::Error naming SLURM_JOB_ID or SLURM_STEP_ID when one is not a
// non-negative integer (and suggesting DTRAIN_STORE_PORT).
int slurm_store_port(const std::string& job_id, const std::string& step_id);

// The file under `dir` (train.out_dir, on storage every node sees) through
// which rank 0 hands a generated run token to the other tasks of one step:
// ".store-token-<job>.<step>", with ".r<restart count>" after a requeue so
// that a requeued job never reads the token of its previous run.
std::filesystem::path slurm_token_file(const std::filesystem::path& dir, const std::string& job_id,
                                       const std::string& step_id, const std::string& restart_count);

}  // namespace dtrain::cluster
