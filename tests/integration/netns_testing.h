// Two network namespaces for tests of several "nodes" on one machine
// (198.51.100.1 and .2, talking only inside the namespaces).
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "support/run_command.h"

namespace dtrain::testing {

// Two network namespaces joined by a veth pair; removed (with their
// /etc/netns files, which give each namespace its own address for this
// host's name, as gloo listens on that) when the test ends.
class Namespaces {
 public:
  Namespaces()
      : a_(fmt::format("dtl-a-{}", ::getpid())), b_(fmt::format("dtl-b-{}", ::getpid())),
        had_etc_netns_(std::filesystem::exists("/etc/netns")) {}
  ~Namespaces() {
    for (const auto& ns : {a_, b_}) {
      if (made_) run_command("ip netns del " + ns);
      std::filesystem::remove_all("/etc/netns/" + ns);
    }
    std::error_code ec;
    if (!had_etc_netns_) std::filesystem::remove("/etc/netns", ec);  // only if empty
  }
  // Empty when every step worked; otherwise why not.
  std::string make() {
    const CommandResult add = run_command(fmt::format("ip netns add {} && ip netns add {}", a_, b_));
    if (add.exit_code != 0) return "ip netns add failed: " + add.output;
    made_ = true;
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    const std::string veth = fmt::format("v{}", ::getpid() % 100000);
    const CommandResult link = run_command(fmt::format(
        "ip link add {v}a type veth peer name {v}b && ip link set {v}a netns {a} && ip link set {v}b netns {b} && "
        "ip -n {a} addr add 198.51.100.1/24 dev {v}a && ip -n {b} addr add 198.51.100.2/24 dev {v}b && "
        "ip -n {a} link set {v}a up && ip -n {b} link set {v}b up && ip -n {a} link set lo up && "
        "ip -n {b} link set lo up && mkdir -p /etc/netns/{a} /etc/netns/{b} && "
        "printf '127.0.0.1 localhost\\n198.51.100.1 {h}\\n' > /etc/netns/{a}/hosts && "
        "printf '127.0.0.1 localhost\\n198.51.100.2 {h}\\n' > /etc/netns/{b}/hosts",
        fmt::arg("v", veth), fmt::arg("a", a_), fmt::arg("b", b_), fmt::arg("h", host)));
    return link.exit_code == 0 ? "" : "veth set-up failed: " + link.output;
  }
  const std::string& a() const { return a_; }
  const std::string& b() const { return b_; }

 private:
  std::string a_, b_;
  bool had_etc_netns_;
  bool made_ = false;
};

// `ip netns exec NS`, as the argv prefix of a program run inside namespace NS.
inline std::vector<std::string> in_namespace(const std::string& ns) {
  const std::string ip = std::filesystem::exists("/usr/sbin/ip") ? "/usr/sbin/ip" : "/sbin/ip";
  return {ip, "netns", "exec", ns};
}

}  // namespace dtrain::testing
