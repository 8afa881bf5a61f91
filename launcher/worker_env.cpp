#include "launcher/worker_env.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>

#include <fmt/format.h>

#include "core/error.h"
#include "core/syscall.h"

namespace dtrain::launcher {
namespace {

// torchrun's variables, which an enclosing torchrun may have given the agent.
constexpr std::array<const char*, 16> kTorchrunVars = {
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
    "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE"};

bool is_placement_variable(const std::string& name) {
  if (name.rfind("DTRAIN_", 0) == 0 || name.rfind("OMPI_COMM_WORLD_", 0) == 0 || name == "PMIX_RANK") return true;
  return std::find(kTorchrunVars.begin(), kTorchrunVars.end(), name) != kTorchrunVars.end();
}

}  // namespace

bool defaults_omp_threads(const LaunchOptions& options, const cluster::EnvMap& agent_env) {
  const auto it = agent_env.find("OMP_NUM_THREADS");
  return options.nproc_per_node > 1 && (it == agent_env.end() || it->second.empty());
}

std::map<std::string, std::string> worker_base_environment(const LaunchOptions& o, const RoundPlan& plan,
                                                           const cluster::EnvMap& agent_env,
                                                           const WorkerRound& round) {
  std::map<std::string, std::string> env;
  for (const auto& [k, v] : agent_env) {
    if (!is_placement_variable(k)) env[k] = v;
  }
  const std::string& host = o.endpoint_host;
  const bool ipv6 = host.find(':') != std::string::npos;
  env["DTRAIN_STORE"] = o.etcd ? cluster::etcd_address(o.etcd_endpoints)  // the workers reach etcd themselves
                        : ipv6 ? fmt::format("[{}]:{}", host, o.endpoint_port)
                               : fmt::format("{}:{}", host, o.endpoint_port);
  env["DTRAIN_TOKEN"] = round.token;
  env["DTRAIN_RUN_ID"] = o.run_id;
  env["DTRAIN_RESTART"] = std::to_string(plan.round);
  env["DTRAIN_WORLD_SIZE"] = std::to_string(plan.world_size);
  env["DTRAIN_LOCAL_WORLD_SIZE"] = std::to_string(o.nproc_per_node);
  env["DTRAIN_NODE_RANK"] = std::to_string(plan.node_rank);
  if (round.heartbeat_s > 0) env["DTRAIN_HEARTBEAT_S"] = fmt::format("{}", round.heartbeat_s);
  if (round.metrics) env["DTRAIN_METRICS"] = std::string("1");  // the heartbeat also publishes metrics/<rank>
  if (o.peak_flops > 0.0) env["DTRAIN_PEAK_FLOPS"] = fmt::format("{:g}", o.peak_flops);  // MFU on the console too
  // PyTorch's env:// rendezvous: rank 0 hosts PyTorch's store on
  // MASTER_ADDR:MASTER_PORT, on node rank 0, which also hosts dtrain's.
  env["WORLD_SIZE"] = env["ROLE_WORLD_SIZE"] = std::to_string(plan.world_size);
  env["LOCAL_WORLD_SIZE"] = std::to_string(o.nproc_per_node);
  env["GROUP_RANK"] = std::to_string(plan.node_rank);
  env["GROUP_WORLD_SIZE"] = std::to_string(plan.num_nodes);
  env["ROLE_NAME"] = std::string("default");
  // With etcd no agent hosts a store: MASTER_ADDR is node rank 0's advertised name.
  env["MASTER_ADDR"] = o.etcd && !plan.nodes.empty() ? plan.nodes.front().host : host;
  env["MASTER_PORT"] = std::to_string(round.master_port);
  env["TORCHELASTIC_RESTART_COUNT"] = std::to_string(round.restarts);
  env["TORCHELASTIC_MAX_RESTARTS"] = std::to_string(o.max_restarts);
  env["TORCHELASTIC_RUN_ID"] = o.run_id;
  env["TORCHELASTIC_USE_AGENT_STORE"] = std::string("False");  // the agent keeps no PyTorch store: rank 0 hosts one
  if (defaults_omp_threads(o, agent_env)) {
    env["OMP_NUM_THREADS"] = std::string("1");
    env["DTRAIN_OMP_DEFAULTED"] = std::string("1");
  }
  return env;
}

std::map<std::string, std::string> worker_rank_environment(int rank, int local_rank, const std::string& error_file) {
  return {{"DTRAIN_RANK", std::to_string(rank)}, {"DTRAIN_LOCAL_RANK", std::to_string(local_rank)},
          {"RANK", std::to_string(rank)},        {"ROLE_RANK", std::to_string(rank)},
          {"LOCAL_RANK", std::to_string(local_rank)}, {"TORCHELASTIC_ERROR_FILE", error_file}};
}

int free_tcp_port() {
  const int fd = DTRAIN_SYSCALL(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), "a free port for MASTER_PORT");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof addr;
  try {
    DTRAIN_SYSCALL(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), "a free port for MASTER_PORT");
    DTRAIN_SYSCALL(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), "a free port for MASTER_PORT");
  } catch (const IoError&) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

}  // namespace dtrain::launcher
