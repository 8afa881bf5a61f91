// Builds a Communicator for this process from where it was started
// (cluster::Environment) and the configured backend.
#pragma once

#include <filesystem>
#include <memory>
#include <string>

#include "cluster/environment.h"
#include "cluster/run_token.h"
#include "comm/communicator.h"
#include "comm/store.h"
#include "comm/tcp_store_server.h"

namespace dtrain::comm {

// parallel.backend=auto: nccl for device cuda, mpi when started by mpirun or
// by srun with PMIx, gloo otherwise. nccl runs on the device that
// cluster::device_for_local_rank picks; its unique id travels through the
// store, or over MPI for a job that mpirun started without one.
std::string resolve_backend(const std::string& backend, const std::string& device,
                            const cluster::Environment& env);

struct ConnectOptions {
  std::string backend = "auto";     // auto | gloo | mpi | nccl
  std::string device = "cpu";       // cpu | cuda
  Duration timeout = std::chrono::seconds(300);
  std::string name = "world";
  // The run's store (needed by gloo and nccl for rendezvous; used by all for
  // failure diagnosis). May be null for mpi.
  std::shared_ptr<Store> store;
};

// The run's store as this process sees it: a TcpStore client on the
// environment's DTRAIN_STORE (scoped to the run id and restart round), plus
// the server itself on rank 0 when nothing listens on that port yet (a
// launcher binds it before starting workers; a job started by hand with
// DTRAIN_* or under mpirun/srun has rank 0 host it); a MemoryStore for a
// single process; none for a multi-rank job without DTRAIN_STORE (mpi needs none).
// Under srun without DTRAIN_STORE the environment names the first node of the
// step and a port (cluster/slurm_store.h); rank 0 always hosts it there, and
// without DTRAIN_TOKEN it makes up a random token and writes it to a 0600
// file in `token_dir` (train.out_dir: shared storage) for the other tasks,
// which wait for it up to `timeout`; the file is removed with the store.
// Without a token_dir such a run falls back to a token derived from the run
// id, as every other starter does without DTRAIN_TOKEN.
struct OpenedStore {
  cluster::OwnedTokenFile token_file;      // rank 0's token file, removed last
  std::unique_ptr<TcpStoreServer> server;  // declared before the client: destroyed after it
  std::shared_ptr<Store> store;
};
OpenedStore open_store(const cluster::Environment& env, Duration timeout,
                       const std::filesystem::path& token_dir = {});

// Creates and connects the backend (rendezvous happens here, bounded by
// options.timeout) and returns its communicator.
std::unique_ptr<Communicator> connect(const cluster::Environment& env, const ConnectOptions& options);

// The backends, for callers that want one explicitly (tests, benchmarks).
std::unique_ptr<Backend> make_gloo_backend(int rank, int world_size, std::shared_ptr<Store> store,
                                           Duration timeout, const std::string& hostname);
std::unique_ptr<Backend> make_mpi_backend(Duration timeout);  // MPI_COMM_WORLD; initialises MPI
std::unique_ptr<Backend> make_nccl_backend(int rank, int world_size, std::shared_ptr<Store> store,
                                           int device, Duration timeout);  // ConfigError without the CUDA plugin

// The CUDA device of this rank: its local rank among the devices it sees,
// as Slurm or CUDA_VISIBLE_DEVICES narrowed them (cluster/devices.h).
// ConfigError naming `field` (the setting that asked for a GPU: the config's
// `device`, a tool's --backend) when there is none.
int cuda_device_for(const cluster::Environment& env, const std::string& field = "device");

}  // namespace dtrain::comm
