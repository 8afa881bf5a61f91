#include "worker/heartbeat.h"

#include <iostream>

#include <fmt/format.h>

#include "cluster/environment.h"
#include "comm/etcd_store.h"
#include "comm/tcp_store.h"
#include "core/error.h"
#include "telemetry/heartbeat_format.h"

namespace dtrain::worker {

const char* phase_name(Phase phase) {
  switch (phase) {
    case Phase::startup: return "startup";
    case Phase::forward: return "forward";
    case Phase::backward: return "backward";
    case Phase::optimizer: return "optimizer";
    case Phase::eval: return "eval";
    case Phase::checkpoint: return "checkpoint";
    case Phase::done: return "done";
  }
  return "?";
}

std::unique_ptr<Heartbeat> Heartbeat::from_environment(const cluster::Environment& env, const cluster::EnvMap& vars) {
  const auto it = vars.find("DTRAIN_HEARTBEAT_S");
  if (it == vars.end() || it->second.empty() || !env.store) return nullptr;
  double seconds = 0.0;
  try {
    seconds = std::stod(it->second);
  } catch (const std::exception&) {
    throw Error(fmt::format("DTRAIN_HEARTBEAT_S='{}' is not a number of seconds; unset it or fix it", it->second));
  }
  if (seconds <= 0.0) return nullptr;
  const std::string scope = fmt::format("{}/round{}", env.run_id.empty() ? "run" : env.run_id, env.restart);
  const auto interval = std::chrono::milliseconds(static_cast<long>(seconds * 1000.0));
  if (cluster::is_etcd_address(*env.store)) {  // dtrain-launch --rdzv-backend etcd
    auto etcd = comm::etcd_store_client(*env.store, std::chrono::seconds(30), std::chrono::seconds(5));
    return std::make_unique<Heartbeat>(std::make_shared<comm::PrefixStore>(scope, std::move(etcd)), env.rank, interval);
  }
  const cluster::HostPort endpoint = cluster::parse_host_port(*env.store, "DTRAIN_STORE");
  comm::TcpStore::Options options;
  options.host = endpoint.host;
  options.port = static_cast<std::uint16_t>(endpoint.port);
  options.token = env.token.empty() ? "dtrain:" + env.run_id : env.token;  // as comm::open_store
  options.connect_timeout = std::chrono::seconds(30);
  options.timeout = std::chrono::seconds(5);
  auto store = std::make_shared<comm::PrefixStore>(scope, std::make_shared<comm::TcpStore>(options));
  return std::make_unique<Heartbeat>(std::move(store), env.rank, interval);
}

Heartbeat::Heartbeat(std::shared_ptr<comm::Store> store, int rank, comm::Duration interval)
    : store_(std::move(store)),
      key_(fmt::format("heartbeat/{}", rank)),
      interval_(interval),
      metrics_key_(fmt::format("metrics/{}", rank)) {
  thread_ = std::thread([this] { run(); });
}

Heartbeat::~Heartbeat() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void Heartbeat::set_phase(Phase phase, std::int64_t step) {
  step_ = step;
  phase_ = static_cast<int>(phase);
}

void Heartbeat::set_communicator(const std::shared_ptr<comm::Communicator>& comm) {
  std::lock_guard<std::mutex> lock(mu_);
  comm_ = comm;
}

void Heartbeat::set_metrics_source(std::function<std::string()> source) {
  std::lock_guard<std::mutex> lock(mu_);
  metrics_source_ = std::move(source);
}

std::string Heartbeat::text() {
  std::uint64_t seq = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto comm = comm_.lock()) seq = comm->last_seq();
  }
  return telemetry::encode_heartbeat(
      {beat_.load(), step_.load(), phase_name(static_cast<Phase>(phase_.load())), seq});
}

void Heartbeat::run() {
  bool warned = false;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    const bool last = stopping_;  // one more publication after the stop: the final figures
    std::function<std::string()> metrics = metrics_source_;
    lock.unlock();
    ++beat_;
    try {
      store_->set(key_, comm::to_bytes(text()));
      if (metrics) store_->set(metrics_key_, comm::to_bytes(metrics()));
    } catch (const Error& e) {
      if (!warned) std::cerr << "dtrain-worker: heartbeat: cannot publish (" << e.what() << "); training goes on\n";
      warned = true;
    }
    lock.lock();
    if (last) return;
    wake_.wait_for(lock, interval_, [this] { return stopping_; });
  }
}

}  // namespace dtrain::worker
