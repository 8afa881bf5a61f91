// A 3-member etcd cluster of the test's own, on loopback or inside network
// namespaces the test made (ports chosen free, data in a temporary folder),
// for the tests of the etcd store and of dtrain-launch's etcd rendezvous.
// start() waits for every member's health (etcdctl endpoint health) within a
// timeout; members can be killed and started again one by one; the
// destructor stops whatever still runs. Needs the etcd binary (Debian's
// etcd-server, which scripts/setup.sh installs): etcd_binary() is empty
// without it, and tests skip saying so.
#pragma once

#include <signal.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "support/processes.h"
#include "support/run_command.h"
#include "support/temp_dir.h"

namespace dtrain::testing {

// The etcd server binary, or "" when it is not installed.
inline std::string etcd_binary() {
  for (const char* p : {"/usr/bin/etcd", "/usr/local/bin/etcd"}) {
    if (std::filesystem::exists(p)) return p;
  }
  return "";
}

inline constexpr char kNoEtcd[] =
    "no etcd binary (/usr/bin/etcd): run scripts/setup.sh (it installs Debian's etcd-server)";

// Where a member runs: its address, and what its command line starts with
// (e.g. `ip netns exec NS` for a member inside a network namespace).
struct EtcdPlace {
  std::string host = "127.0.0.1";
  std::vector<std::string> prefix;
};

class EtcdCluster {
 public:
  explicit EtcdCluster(int members = 3) : EtcdCluster(std::vector<EtcdPlace>(static_cast<std::size_t>(members))) {}
  explicit EtcdCluster(const std::vector<EtcdPlace>& places) {
    for (const auto& place : places) members_.push_back({place, free_port(), free_port(), {}});
  }
  ~EtcdCluster() {
    for (auto& m : members_) {
      if (m.process.pid > 0 && !m.process.reaped) ::kill(m.process.pid, SIGKILL);
    }
    std::vector<Spawned> all;
    for (auto& m : members_) {
      if (m.process.pid > 0 && !m.process.reaped) all.push_back(m.process);
    }
    wait_all(all, std::chrono::seconds(10));
  }
  EtcdCluster(const EtcdCluster&) = delete;
  EtcdCluster& operator=(const EtcdCluster&) = delete;

  // Starts every member and waits until each says it is healthy;
  // empty when they all did within `timeout`, else what went wrong.
  std::string start(std::chrono::seconds timeout = std::chrono::seconds(30)) {
    std::string initial;
    for (std::size_t i = 0; i < members_.size(); ++i) {
      initial += fmt::format("{}e{}=http://{}:{}", i ? "," : "", i, members_[i].place.host, members_[i].peer_port);
    }
    for (std::size_t i = 0; i < members_.size(); ++i) {
      const Member& m = members_[i];
      const std::string client = fmt::format("http://{}:{}", m.place.host, m.client_port);
      const std::string peer = fmt::format("http://{}:{}", m.place.host, m.peer_port);
      const std::vector<std::string> etcd = {
          etcd_binary(), "--name", fmt::format("e{}", i), "--data-dir", dir_.file(fmt::format("data{}", i)),
          "--listen-client-urls", client, "--advertise-client-urls", client, "--listen-peer-urls", peer,
          "--initial-advertise-peer-urls", peer, "--initial-cluster", initial, "--initial-cluster-state", "new",
          "--initial-cluster-token", fmt::format("dtrain-test-{}", ::getpid()), "--heartbeat-interval", "50",
          "--election-timeout", "500", "--log-level", "warn"};
      commands_.push_back(m.place.prefix);
      commands_.back().insert(commands_.back().end(), etcd.begin(), etcd.end());
      members_[i].process = spawn_process(commands_.back(), {}, dir_.file(fmt::format("etcd{}.log", i)));
    }
    const auto until = std::chrono::steady_clock::now() + timeout;
    for (std::size_t i = 0; i < members_.size(); ++i) {
      while (!healthy(static_cast<int>(i))) {
        if (std::chrono::steady_clock::now() > until) {
          return fmt::format("etcd member e{} was not healthy within {} s; its log:\n{}", i, timeout.count(),
                             read_file(dir_ / fmt::format("etcd{}.log", i)));
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    }
    return "";
  }

  // Whether member i says it is healthy (etcdctl endpoint health, within 3 s).
  bool healthy(int i) const {
    const Member& m = members_[static_cast<std::size_t>(i)];
    std::string prefix;
    for (const auto& word : m.place.prefix) prefix += word + " ";
    const CommandResult r = run_command(fmt::format(
        "ETCDCTL_API=3 timeout -s KILL 5 {}etcdctl --command-timeout 3s --endpoints {}:{} endpoint health 2>&1",
        prefix, m.place.host, m.client_port));
    return r.output.find("is healthy") != std::string::npos;
  }

  // Starts member i again (after kill): it rejoins from its data folder.
  void restart(int i) {
    const auto n = static_cast<std::size_t>(i);
    members_[n].process = spawn_process(commands_[n], {}, dir_.file(fmt::format("etcd{}.again.log", i)));
  }

  // SIGKILLs member i and reaps it.
  void kill(int i) {
    Spawned& p = members_[static_cast<std::size_t>(i)].process;
    ::kill(p.pid, SIGKILL);
    std::vector<Spawned> one{p};
    wait_all(one, std::chrono::seconds(10));
    p = one.front();
  }

  // "HOST0:P0,HOST1:P1,HOST2:P2": the client endpoints, as --rdzv-endpoint takes them.
  std::string endpoints() const {
    std::string out;
    for (const auto& m : members_) out += fmt::format("{}{}:{}", out.empty() ? "" : ",", m.place.host, m.client_port);
    return out;
  }
  int client_port(int i) const { return members_[static_cast<std::size_t>(i)].client_port; }

 private:
  struct Member {
    EtcdPlace place;
    int client_port;
    int peer_port;
    Spawned process;
  };
  TempDir dir_;
  std::vector<Member> members_;
  std::vector<std::vector<std::string>> commands_;  // each member's command line
};

}  // namespace dtrain::testing
