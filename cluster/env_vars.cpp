#include "cluster/env_vars.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstring>
#include <string_view>

#include <fmt/format.h>

#include "core/error.h"

extern char** environ;

namespace dtrain::cluster {

const std::string* lookup(const EnvMap& vars, const std::string& name) {
  const auto it = vars.find(name);
  return it == vars.end() || it->second.empty() ? nullptr : &it->second;
}

bool is_set(const EnvMap& vars, const std::string& name) { return lookup(vars, name) != nullptr; }

std::string value_or(const EnvMap& vars, const std::string& name, const std::string& fallback) {
  const std::string* value = lookup(vars, name);
  return value != nullptr ? *value : fallback;
}

int parse_int(const std::string& name, const std::string& value) {
  int result = 0;
  const char* end = value.data() + value.size();
  const auto [ptr, ec] = std::from_chars(value.data(), end, result);
  if (ec == std::errc::result_out_of_range) {
    throw Error(
        fmt::format("{}='{}' is out of range for an integer; fix or unset {}", name, value, name));
  }
  if (ec != std::errc() || ptr != end) {
    throw Error(fmt::format("{}='{}' is not an integer; fix or unset {}", name, value, name));
  }
  return result;
}

std::optional<int> optional_int(const EnvMap& vars, const std::string& name) {
  const std::string* value = lookup(vars, name);
  if (value == nullptr) return std::nullopt;
  return parse_int(name, *value);
}

[[noreturn]] void throw_missing(const std::string& present, const std::string& absent,
                                const std::string& starter) {
  throw Error(fmt::format(
      "{} is set but {} is not: {} sets them together; start the worker through {}, or set {} "
      "too, or unset {}",
      present, absent, starter, starter, absent, present));
}

int required_int(const EnvMap& vars, const std::string& name, const std::string& set_with,
                 const std::string& starter) {
  const std::optional<int> value = optional_int(vars, name);
  if (!value) throw_missing(set_with, name, starter);
  return *value;
}

int port_in_range(const std::string& name, const std::string& value) {
  const int port = parse_int(name, value);
  if (port < 1 || port > kMaxPort) {
    throw Error(fmt::format("{}={} must be a port from 1 to {}", name, port, kMaxPort));
  }
  return port;
}

EnvMap process_environment() {
  EnvMap vars;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    const std::string_view text(*entry);
    const size_t eq = text.find('=');
    if (eq == std::string_view::npos) continue;
    vars.emplace(std::string(text.substr(0, eq)), std::string(text.substr(eq + 1)));
  }
  return vars;
}

HostPort parse_host_port(const std::string& address, const std::string& variable) {
  const auto fail = [&](std::string_view problem) {
    throw Error(
        fmt::format("{}='{}' is not host:port ({}); write it like 'node1:29500' or "
                    "'[::1]:29500'",
                    variable, address, problem));
  };
  for (const char c : address) {
    if (!std::isgraph(static_cast<unsigned char>(c))) fail("it contains whitespace");
  }
  HostPort result;
  size_t port_at = 0;
  if (!address.empty() && address.front() == '[') {
    const size_t close = address.find(']');
    if (close == std::string::npos) fail("'[' is never closed");
    result.host = address.substr(1, close - 1);
    if (close + 1 >= address.size() || address[close + 1] != ':') fail("no ':port' after ']'");
    port_at = close + 2;
  } else {
    const size_t colon = address.rfind(':');
    if (colon == std::string::npos) fail("no ':port'");
    result.host = address.substr(0, colon);
    if (result.host.find(':') != std::string::npos) fail("an IPv6 host needs brackets");
    if (result.host.find_first_of("[]") != std::string::npos) fail("stray bracket");
    port_at = colon + 1;
  }
  if (result.host.empty()) fail("the host is empty");
  const std::string port = address.substr(port_at);
  const char* end = port.data() + port.size();
  const auto [ptr, ec] = std::from_chars(port.data(), end, result.port);
  if (port.empty() || ec != std::errc() || ptr != end || result.port < 1 ||
      result.port > kMaxPort) {
    fail(fmt::format("the port must be a number from 1 to {}", kMaxPort));
  }
  return result;
}

bool is_etcd_address(const std::string& address) { return address.rfind(kEtcdScheme, 0) == 0; }

std::vector<HostPort> parse_etcd_endpoints(const std::string& list, const std::string& what) {
  const std::string text = is_etcd_address(list) ? list.substr(std::strlen(kEtcdScheme)) : list;
  std::vector<HostPort> out;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = std::min(text.find(',', start), text.size());
    std::string item = text.substr(start, comma - start);
    if (item.rfind("http://", 0) == 0) item = item.substr(7);
    if (item.empty()) {
      throw Error(fmt::format("{}='{}' has an empty entry; write etcd's client endpoints as "
                              "'h1:2379,h2:2379,h3:2379'", what, list));
    }
    // Without a port (no ':' after the host, or after an IPv6 literal's ']'), etcd's own 2379.
    const bool bracketed = item.front() == '[';
    const bool has_port = bracketed ? item.find("]:") != std::string::npos
                                    : std::count(item.begin(), item.end(), ':') == 1;
    if (!has_port && (bracketed || item.find(':') == std::string::npos)) {
      item += fmt::format(":{}", kEtcdDefaultPort);
    }
    try {
      out.push_back(parse_host_port(item, "entry"));
    } catch (const Error& e) {
      throw Error(fmt::format("{}='{}' is not a list of etcd's client endpoints h1:2379,h2:2379,...: {}", what, list,
                              e.what()));
    }
    start = comma + 1;
  }
  return out;
}

std::string host_port_list(const std::vector<HostPort>& endpoints) {
  std::string out;
  for (const HostPort& e : endpoints) {
    if (!out.empty()) out += ",";
    out += e.host.find(':') != std::string::npos ? fmt::format("[{}]:{}", e.host, e.port)
                                                 : fmt::format("{}:{}", e.host, e.port);
  }
  return out;
}

std::string etcd_address(const std::vector<HostPort>& endpoints) { return kEtcdScheme + host_port_list(endpoints); }

}  // namespace dtrain::cluster
