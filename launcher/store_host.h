// The run's store as an agent sees it: the agent that hosts it binds the
// endpoint (standalone: a free loopback port) before any worker starts, so
// workers connect as clients (comm/connect.h); the others connect to it.
// Also the run's secret token, which reaches workers by environment only.
#pragma once

#include <memory>
#include <string>

#include "comm/store.h"
#include "comm/tcp_store_server.h"
#include "launcher/options.h"

namespace dtrain::launcher {

// With --rdzv-backend etcd, how long the agent tries etcd's endpoints at
// start (at most; --rdzv-timeout when shorter), and the TTL of its lease: the
// keys it set (its node record) expire this long after it died.
inline constexpr long kEtcdConnectTimeoutMs = 30'000;
inline constexpr long kAgentLeaseTtlS = 10;

// DTRAIN_TOKEN when the user exported it (a job of several nodes needs the
// same one on every node), otherwise a random one for this run alone.
// Throws dtrain::Error for a job of several nodes without DTRAIN_TOKEN (but
// with etcd, which has its own access control, the token is not used).
std::string run_token(const LaunchOptions& options, const cluster::EnvMap& env);

// Whether this agent hosts the store: --standalone; node rank 0; or, without a
// node rank, the endpoint's port can be bound here (its host is this machine).
// Never with etcd: the store is the etcd cluster.
bool hosts_store(const LaunchOptions& options);

struct StoreConnection {
  std::unique_ptr<comm::TcpStoreServer> server;  // set on the hosting agent; outlives `store`
  std::shared_ptr<comm::Store> store;            // a client, unscoped (etcd: keys under "dtrain/")
};

// Hosts (when hosts_store) and connects; with etcd, connects to the etcd
// cluster with a lease of kAgentLeaseTtlS. For --standalone, sets
// options.endpoint_port to the port bound. Throws dtrain::CommError naming
// HOST:PORT and what to do when the port is taken or the store cannot be
// reached within options.rdzv_timeout_s.
StoreConnection open_run_store(LaunchOptions& options, const std::string& token);

}  // namespace dtrain::launcher
