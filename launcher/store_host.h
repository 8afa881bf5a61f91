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

// DTRAIN_TOKEN when the user exported it (a job of several nodes needs the
// same one on every node), otherwise a random one for this run alone.
// Throws dtrain::Error for a job of several nodes without DTRAIN_TOKEN.
std::string run_token(const LaunchOptions& options, const cluster::EnvMap& env);

// Whether this agent hosts the store: --standalone; node rank 0; or, without a
// node rank, the endpoint's port can be bound here (its host is this machine).
bool hosts_store(const LaunchOptions& options);

struct StoreConnection {
  std::unique_ptr<comm::TcpStoreServer> server;  // set on the hosting agent; outlives `store`
  std::shared_ptr<comm::Store> store;            // a client, unscoped
};

// Hosts (when hosts_store) and connects. For --standalone, sets
// options.endpoint_port to the port bound. Throws dtrain::CommError naming
// HOST:PORT and what to do when the port is taken or the store cannot be
// reached within options.rdzv_timeout_s.
StoreConnection open_run_store(LaunchOptions& options, const std::string& token);

}  // namespace dtrain::launcher
