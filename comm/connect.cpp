#include "comm/connect.h"

#include <unistd.h>

#include <cstring>

#include <fmt/format.h>

#include "cluster/devices.h"
#include "cluster/node_address.h"
#include "cluster/slurm_store.h"
#include "comm/etcd_store.h"
#include "comm/gloo/backend.h"
#include "comm/memory_store.h"
#include "comm/mpi/backend.h"
#include "comm/tcp_store.h"
#include "dtrain/config.h"
#include "comm/nccl/backend.h"
#include "core/error.h"
#include "core/plugin.h"

namespace dtrain::comm {
namespace {

bool is_loopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

// How long `scontrol show node` may take to name a node's address.
constexpr std::chrono::seconds kNodeAddressTimeout{20};

// Where clients reach the store: as given, except that a Slurm node name
// the resolver does not know is replaced by its NodeAddr.
std::string store_host(const cluster::Environment& env, const cluster::HostPort& endpoint) {
  return env.store_from_slurm ? cluster::node_address(endpoint.host, kNodeAddressTimeout) : endpoint.host;
}

// The address this rank's gloo pairs listen on: loopback for a job whose
// store is on loopback (one machine; with etcd, its first endpoint), this
// host's name otherwise.
std::string gloo_hostname(const cluster::Environment& env) {
  const auto store_endpoint = [&] {
    return cluster::is_etcd_address(*env.store) ? cluster::parse_etcd_endpoints(*env.store, "DTRAIN_STORE").front().host
                                                : store_host(env, cluster::parse_host_port(*env.store, "DTRAIN_STORE"));
  };
  if (!env.store || is_loopback(store_endpoint())) {
    return "127.0.0.1";
  }
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) throw_errno("gethostname", "");
  return name;
}

// Rank 0's store server on `endpoint` (every interface unless the address is
// a loopback one).
std::unique_ptr<TcpStoreServer> host_store(const cluster::Environment& env, const cluster::HostPort& endpoint,
                                           const std::string& token) {
  if (env.store_from_slurm && !env.slurmd_nodename.empty() && env.slurmd_nodename != endpoint.host) {
    throw CommError(fmt::format(
        "rank 0 runs on node {}, not on {}, the first node of SLURM_STEP_NODELIST where the other tasks look "
        "for the store (a --distribution that moves task 0?); set DTRAIN_STORE={}:PORT for the step",
        env.slurmd_nodename, endpoint.host, env.slurmd_nodename));
  }
  TcpStoreServer::Options server;
  server.host = is_loopback(endpoint.host) ? endpoint.host : "0.0.0.0";
  server.port = static_cast<std::uint16_t>(endpoint.port);
  server.token = token;
  try {
    return std::make_unique<TcpStoreServer>(server);
  } catch (const CommError& e) {
    if (!env.store_from_slurm) throw;
    throw CommError(fmt::format("{} (port {} is derived from SLURM_JOB_ID and SLURM_STEP_ID, or is "
                                "DTRAIN_STORE_PORT: set DTRAIN_STORE_PORT to a free port for this step)",
                                e.what(), endpoint.port));
  }
}

std::shared_ptr<Store> require_store(const ConnectOptions& options, const char* backend) {
  if (options.store) return options.store;
  throw CommError(fmt::format(
      "backend {} needs the run's store to find the other ranks: start the job with dtrain-launch, "
      "or set DTRAIN_STORE=host:port (rank 0 then hosts it there)", backend));
}

nccl_backend::ShareUniqueId share_through_store(std::shared_ptr<Store> store, int rank, Duration timeout) {
  return [store = std::move(store), rank, timeout](void* id, std::size_t bytes) {
    const std::string key = "nccl/unique_id";
    auto* data = static_cast<std::uint8_t*>(id);
    if (rank == 0) {
      store->set(key, Bytes(data, data + bytes));
      return;
    }
    const Bytes value = store->get(key, timeout);
    DTRAIN_CHECK(value.size() == bytes, "nccl unique id of {} bytes, expected {}", value.size(), bytes);
    std::memcpy(data, value.data(), bytes);
  };
}

// For a job started by mpirun (or srun --mpi=pmix) without a store: MPI is
// initialised for this one broadcast and finalised after it.
nccl_backend::ShareUniqueId share_through_mpi() {
  return [](void* id, std::size_t bytes) {
    DTRAIN_CHECK(bytes % sizeof(std::int32_t) == 0, "nccl unique id of {} bytes", bytes);
    mpi_backend::MpiBackend mpi;
    Op op;
    op.kind = OpKind::broadcast;
    op.input = id;
    op.output = id;
    op.count = bytes / sizeof(std::int32_t);
    op.dtype = DType::i32;
    op.root = 0;
    mpi.run(op);
  };
}

// NCCL's unique id travels through the store, or over MPI when mpirun (or
// srun with PMIx) started a job that has no store.
std::unique_ptr<Backend> connect_nccl(const cluster::Environment& env, const ConnectOptions& options) {
  // The field the user set: device=cuda, or parallel.backend=nccl on its own.
  const int device = cuda_device_for(env, options.device == "cuda" ? "device" : "parallel.backend");
  if (!options.store && env.pmix) {
    return nccl_backend::load_backend(env.rank, env.world_size, share_through_mpi(), device, options.timeout);
  }
  return nccl_backend::load_backend(env.rank, env.world_size,
                                    share_through_store(require_store(options, "nccl"), env.rank, options.timeout),
                                    device, options.timeout);
}

}  // namespace

std::string resolve_backend(const std::string& backend, const std::string& device,
                            const cluster::Environment& env) {
  if (backend != "auto") return backend;
  if (device == "cuda") return "nccl";
  if (env.pmix && (env.starter == cluster::Starter::mpirun || env.starter == cluster::Starter::slurm)) {
    return "mpi";
  }
  return "gloo";
}

OpenedStore open_store(const cluster::Environment& env, Duration timeout,
                       const std::filesystem::path& token_dir) {
  OpenedStore opened;
  if (!env.store) {
    if (env.world_size == 1) opened.store = std::make_shared<MemoryStore>();
    return opened;  // mpi needs none; gloo and nccl will say what to set
  }
  const std::string scope = fmt::format("{}/round{}", env.run_id.empty() ? "run" : env.run_id, env.restart);
  if (cluster::is_etcd_address(*env.store)) {
    // The job's store is an etcd cluster: every process reaches it itself, nobody hosts one.
    opened.store = std::make_shared<PrefixStore>(
        scope, etcd_store_client(*env.store, timeout, std::min<Duration>(timeout, std::chrono::seconds(30))));
    return opened;
  }
  const cluster::HostPort endpoint = cluster::parse_host_port(*env.store, "DTRAIN_STORE");
  // Rank 0 hosts the store unless someone (dtrain-launch) already does; under
  // srun nobody else can, so a taken port is an error there.
  const bool host_here =
      env.rank == 0 && (env.store_from_slurm || !tcp_port_in_use(endpoint.port));
  const bool token_file = env.token.empty() && env.store_from_slurm && !token_dir.empty();
  std::string token = env.token.empty() ? "dtrain:" + env.run_id : env.token;
  if (token_file && host_here) token = cluster::random_token();
  if (host_here) opened.server = host_store(env, endpoint, token);
  if (token_file) {
    const std::filesystem::path path =
        cluster::slurm_token_file(token_dir, env.slurm_job_id, env.slurm_step_id, env.slurm_restart_count);
    if (host_here) {
      cluster::write_token_file(path, token);
      opened.token_file = cluster::OwnedTokenFile(path);
    } else {
      token = cluster::read_token_file(path, std::chrono::duration_cast<std::chrono::milliseconds>(timeout));
    }
  }
  TcpStore::Options client;
  client.host = store_host(env, endpoint);
  client.port = static_cast<std::uint16_t>(endpoint.port);
  client.token = token;
  client.connect_timeout = timeout;
  // Calls that do not wait are round trips: they need seconds, not the
  // collective timeout (a failure's diagnosis must not hang on a dead store).
  client.timeout = std::min<Duration>(timeout, std::chrono::seconds(30));
  auto tcp = std::make_shared<TcpStore>(client);
  // Keys of one run and one restart round never meet another's.
  opened.store = std::make_shared<PrefixStore>(scope, std::move(tcp));
  return opened;
}

std::unique_ptr<Backend> make_gloo_backend(int rank, int world_size, std::shared_ptr<Store> store,
                                           Duration timeout, const std::string& hostname) {
  return std::make_unique<gloo_backend::GlooBackend>(
      rank, world_size, std::make_shared<PrefixStore>("gloo", std::move(store)), timeout, hostname);
}

std::unique_ptr<Backend> make_mpi_backend(Duration /*timeout*/) {
  return std::make_unique<mpi_backend::MpiBackend>();
}

std::unique_ptr<Backend> make_nccl_backend(int rank, int world_size, std::shared_ptr<Store> store,
                                           int device, Duration timeout) {
  return nccl_backend::load_backend(rank, world_size, share_through_store(std::move(store), rank, timeout), device,
                                    timeout);
}

int cuda_device_for(const cluster::Environment& env, const std::string& field) {
  std::string why;
  const cluster::GpuView view{cuda_device_count(&why), env.cuda_visible_devices, env.slurm_gpus};
  if (view.visible_count == 0) {
    throw ConfigError(field, fmt::format("{} needs a GPU: {}", field == "device" ? "cuda" : "nccl", why));
  }
  return cluster::device_for_local_rank(env.local_rank, env.local_world_size, view);
}

std::unique_ptr<Backend> nccl_backend::load_backend(int rank, int world_size, ShareUniqueId share, int device,
                                                    Duration timeout) {
  auto* make = reinterpret_cast<MakeBackendFn*>(plugin_symbol(kCudaPlugin, kMakeBackendSymbol, "parallel.backend"));
  return std::unique_ptr<Backend>(make(rank, world_size, &share, device, static_cast<long long>(timeout.count())));
}

std::unique_ptr<Communicator> connect(const cluster::Environment& env, const ConnectOptions& options) {
  const std::string backend = resolve_backend(options.backend, options.device, env);
  std::unique_ptr<Backend> impl;
  if (backend == "gloo") {
    impl = make_gloo_backend(env.rank, env.world_size, require_store(options, "gloo"), options.timeout,
                             gloo_hostname(env));
  } else if (backend == "mpi") {
    if (!env.pmix && env.world_size > 1) {
      throw CommError(fmt::format(
          "backend mpi needs a job started by mpirun or srun --mpi=pmix, but this process was started "
          "by {}; use parallel.backend=gloo (or auto)", cluster::starter_name(env.starter)));
    }
    impl = make_mpi_backend(options.timeout);
    if (impl->world_size() != env.world_size || impl->rank() != env.rank) {
      throw CommError(fmt::format("MPI sees rank {} of {}, but the environment says {}; start the job "
                                  "with mpirun or srun --mpi=pmix only", impl->rank(), impl->world_size(),
                                  env.describe()));
    }
  } else if (backend == "nccl") {
    impl = connect_nccl(env, options);
  } else {
    throw ConfigError("parallel.backend", fmt::format("unknown backend '{}' (auto, gloo, mpi, nccl)", backend));
  }
  CommunicatorOptions copts;
  copts.name = options.name;
  copts.timeout = options.timeout;
  copts.store = options.store;
  return std::make_unique<Communicator>(std::move(impl), std::move(copts));
}

}  // namespace dtrain::comm
