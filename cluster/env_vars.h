// Reading a process's environment variables with errors that name them:
// the map every starter's reader takes (tests pass their own), integers and
// ports, variables a starter sets together, and host:port addresses.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace dtrain::cluster {

inline constexpr int kMaxPort = 65535;

using EnvMap = std::map<std::string, std::string>;

// The process's own environment (environ) as an EnvMap.
EnvMap process_environment();

// A store address split into its parts: "node1:29500" -> {"node1", 29500},
// "[::1]:29500" -> {"::1", 29500} (an IPv6 host must be in brackets).
struct HostPort {
  std::string host;  // without the brackets of an IPv6 literal
  int port = 0;      // 1..65535
};

// Throws dtrain::Error naming `variable` (e.g. "DTRAIN_STORE") and the value
// when `address` is not host:port.
HostPort parse_host_port(const std::string& address, const std::string& variable);

// etcd's client endpoints: "h1:2379,h2:2379,h3" (a host without a port is on
// etcd's 2379), optionally after "etcd://", as the run's store address
// carries them to workers (DTRAIN_STORE=etcd://h1:2379,h2:2379). Throws
// dtrain::Error naming `what` and the entry that is not host[:port].
inline constexpr char kEtcdScheme[] = "etcd://";
inline constexpr int kEtcdDefaultPort = 2379;
bool is_etcd_address(const std::string& address);
std::vector<HostPort> parse_etcd_endpoints(const std::string& list, const std::string& what);
// "h1:2379,[::1]:2379": the endpoints as a list (IPv6 hosts in brackets).
std::string host_port_list(const std::vector<HostPort>& endpoints);
// "etcd://h1:2379,h2:2379": the store address of those endpoints.
std::string etcd_address(const std::vector<HostPort>& endpoints);

// The value of `name`, or nullptr when it is unset or empty.
const std::string* lookup(const EnvMap& vars, const std::string& name);
bool is_set(const EnvMap& vars, const std::string& name);
std::string value_or(const EnvMap& vars, const std::string& name, const std::string& fallback);

// `value` of variable `name` as an int; throws naming the variable.
int parse_int(const std::string& name, const std::string& value);
// nullopt when `name` is unset or empty.
std::optional<int> optional_int(const EnvMap& vars, const std::string& name);
// `value` of `name` as a port from 1 to 65535.
int port_in_range(const std::string& name, const std::string& value);

// `present` is set and `absent` is not; `starter` sets them together.
[[noreturn]] void throw_missing(const std::string& present, const std::string& absent,
                                const std::string& starter);
// `name`, which `starter` sets together with `set_with` (already read).
int required_int(const EnvMap& vars, const std::string& name, const std::string& set_with,
                 const std::string& starter);

}  // namespace dtrain::cluster
