#include "comm/connect.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include <fmt/format.h>

#include "comm/gloo/backend.h"
#include "comm/memory_store.h"
#include "comm/mpi/backend.h"
#include "comm/tcp_store.h"
#include "dtrain/config.h"
#include "core/error.h"
#if DTRAIN_HAVE_CUDA
#include "comm/nccl/backend.h"
#endif

namespace dtrain::comm {
namespace {

// Whether something already listens on `port` of this machine (the
// launcher's store): binding the port for a moment tells.
bool port_taken(std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw_errno("socket", "");
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(port);
  const bool taken = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 && errno == EADDRINUSE;
  ::close(fd);
  return taken;
}

bool is_loopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

// The address this rank's gloo pairs listen on: loopback for a job whose
// store is on loopback (one machine), this host's name otherwise.
std::string gloo_hostname(const cluster::Environment& env) {
  if (!env.store || is_loopback(cluster::parse_host_port(*env.store, "DTRAIN_STORE").host)) return "127.0.0.1";
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) throw_errno("gethostname", "");
  return name;
}

std::shared_ptr<Store> require_store(const ConnectOptions& options, const char* backend) {
  if (options.store) return options.store;
  throw CommError(fmt::format(
      "backend {} needs the run's store to find the other ranks: start the job with dtrain-launch, "
      "or set DTRAIN_STORE=host:port (rank 0 then hosts it there)", backend));
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

OpenedStore open_store(const cluster::Environment& env, Duration timeout) {
  OpenedStore opened;
  if (!env.store) {
    if (env.world_size == 1) opened.store = std::make_shared<MemoryStore>();
    return opened;  // mpi needs none; gloo and nccl will say what to set
  }
  const cluster::HostPort endpoint = cluster::parse_host_port(*env.store, "DTRAIN_STORE");
  const std::string token = env.token.empty() ? "dtrain:" + env.run_id : env.token;
  // Rank 0 hosts the store unless someone (dtrain-launch) already does.
  if (env.rank == 0 && !port_taken(static_cast<std::uint16_t>(endpoint.port))) {
    TcpStoreServer::Options server;
    server.host = is_loopback(endpoint.host) ? endpoint.host : "0.0.0.0";
    server.port = static_cast<std::uint16_t>(endpoint.port);
    server.token = token;
    opened.server = std::make_unique<TcpStoreServer>(server);
  }
  TcpStore::Options client;
  client.host = endpoint.host;
  client.port = static_cast<std::uint16_t>(endpoint.port);
  client.token = token;
  client.connect_timeout = timeout;
  // Calls that do not wait are round trips: they need seconds, not the
  // collective timeout (a failure's diagnosis must not hang on a dead store).
  client.timeout = std::min<Duration>(timeout, std::chrono::seconds(30));
  auto tcp = std::make_shared<TcpStore>(client);
  // Keys of one run and one restart round never meet another's.
  opened.store = std::make_shared<PrefixStore>(
      fmt::format("{}/round{}", env.run_id.empty() ? "run" : env.run_id, env.restart), std::move(tcp));
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
#if DTRAIN_HAVE_CUDA
  return nccl_backend::make_backend(rank, world_size, std::move(store), device, timeout);
#else
  (void)rank, (void)world_size, (void)store, (void)device, (void)timeout;
  throw CommError("backend nccl is not available: this dtrain was built without CUDA "
                  "(configure with -DDTRAIN_WITH_CUDA=ON where the CUDA toolkit is installed)");
#endif
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
    impl = make_nccl_backend(env.rank, env.world_size, require_store(options, "nccl"), env.local_rank,
                             options.timeout);
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
