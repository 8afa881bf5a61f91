#include "launcher/store_host.h"

#include <fmt/format.h>

#include "cluster/node_address.h"
#include "cluster/run_token.h"
#include "comm/etcd_store.h"
#include "comm/tcp_store.h"
#include "comm/tcp_store_server.h"
#include "core/error.h"

namespace dtrain::launcher {
namespace {

bool is_loopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

std::unique_ptr<comm::TcpStoreServer> host(LaunchOptions& o, const std::string& token) {
  const std::string where = fmt::format("{}:{}", o.endpoint_host, o.endpoint_port);
  if (o.endpoint_port != 0 && comm::tcp_port_in_use(o.endpoint_port)) {
    throw CommError(fmt::format(
        "cannot host the rendezvous store on {}: port {} is already in use (another job's store or another "
        "program listens there); pick a free port with --rdzv-endpoint HOST:PORT{} or stop that program",
        where, o.endpoint_port, o.from_slurm ? " or DTRAIN_STORE_PORT" : ""));
  }
  comm::TcpStoreServer::Options server;
  server.host = is_loopback(o.endpoint_host) ? o.endpoint_host : "0.0.0.0";
  server.port = static_cast<std::uint16_t>(o.endpoint_port);
  server.token = token;
  server.log = [](const std::string& line) { fmt::print(stderr, "dtrain-launch: store: {}\n", line); };
  try {
    auto s = std::make_unique<comm::TcpStoreServer>(server);
    o.endpoint_port = s->port();
    return s;
  } catch (const CommError& e) {
    throw CommError(fmt::format("cannot host the rendezvous store on {}: {}", where, e.what()));
  }
}

}  // namespace

std::string run_token(const LaunchOptions& options, const cluster::EnvMap& env) {
  const auto it = env.find("DTRAIN_TOKEN");
  if (it != env.end() && !it->second.empty()) return it->second;
  if (options.max_nodes > 1 && !options.etcd) {
    throw Error("a job of several nodes needs one secret shared by every agent: export DTRAIN_TOKEN (for "
                "example DTRAIN_TOKEN=$(od -An -tx8 -N16 /dev/urandom | tr -d ' ')) where every node's "
                "dtrain-launch inherits it (srun passes the environment on)");
  }
  return cluster::random_token();
}

bool hosts_store(const LaunchOptions& options) {
  if (options.etcd) return false;
  if (options.standalone) return true;
  if (options.node_rank) return *options.node_rank == 0;
  return !comm::tcp_port_in_use(options.endpoint_port);
}

StoreConnection open_run_store(LaunchOptions& o, const std::string& token) {
  StoreConnection c;
  if (o.etcd) {
    comm::EtcdStore::Options etcd;
    etcd.endpoints = o.etcd_endpoints;
    // etcd runs before the job does: a cluster that does not answer now is
    // misconfigured more often than late, so the wait is short.
    etcd.connect_timeout = std::min(std::chrono::milliseconds(static_cast<long>(o.rdzv_timeout_s * 1000)),
                                    std::chrono::milliseconds(kEtcdConnectTimeoutMs));
    etcd.lease_ttl = std::chrono::seconds(kAgentLeaseTtlS);
    etcd.log = [](const std::string& line) { fmt::print(stderr, "dtrain-launch: etcd: {}\n", line); };
    try {
      c.store = std::make_shared<comm::EtcdStore>(etcd);
    } catch (const CommError& e) {
      throw CommError(fmt::format("--rdzv-backend etcd: {}", e.what()));
    }
    return c;
  }
  // A Slurm node name the resolver does not know is reached at its NodeAddr.
  if (o.from_slurm) o.endpoint_host = cluster::node_address(o.endpoint_host, std::chrono::seconds(20));
  if (hosts_store(o)) c.server = host(o, token);
  comm::TcpStore::Options client;
  client.host = o.endpoint_host;
  client.port = static_cast<std::uint16_t>(o.endpoint_port);
  client.token = token;
  client.connect_timeout = std::chrono::milliseconds(static_cast<long>(o.rdzv_timeout_s * 1000));
  client.timeout = std::chrono::seconds(30);
  client.client = fmt::format("dtrain-launch pid {}", ::getpid());
  try {
    c.store = std::make_shared<comm::TcpStore>(client);
  } catch (const CommError& e) {
    throw CommError(fmt::format("cannot reach the rendezvous store at {}:{} (hosted by the agent of node rank "
                                "0): {}; start that agent, check --rdzv-endpoint and that every node exports "
                                "the same DTRAIN_TOKEN",
                                o.endpoint_host, o.endpoint_port, e.what()));
  }
  return c;
}

}  // namespace dtrain::launcher
