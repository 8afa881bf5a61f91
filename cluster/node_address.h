// The address at which a Slurm node can be reached. Slurm names nodes by
// NodeName and reaches them at NodeAddr, which defaults to the name but may be
// anything (an IP address, an interconnect name) on clusters whose node names
// are in neither DNS nor /etc/hosts.
#pragma once

#include <chrono>
#include <optional>
#include <string>

namespace dtrain::cluster {

// `node` itself when the system resolver knows it; otherwise the NodeAddr that
// slurmctld records for it (`scontrol show node -o NODE`, bounded by
// `timeout`). Throws dtrain::Error naming the node and what to set when
// neither works.
std::string node_address(const std::string& node, std::chrono::milliseconds timeout);

// The NodeAddr field of one line of `scontrol show node -o` output, if any
// (pure; "NodeName=n1 Arch=x86_64 ... NodeAddr=10.0.0.1 NodeHostName=h1 ..." -> "10.0.0.1").
std::optional<std::string> parse_node_addr(const std::string& scontrol_output);

}  // namespace dtrain::cluster
