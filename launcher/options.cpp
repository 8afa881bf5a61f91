#include "launcher/options.h"

#include <charconv>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "cluster/hostlist.h"
#include "cluster/slurm_store.h"
#include "core/error.h"

namespace dtrain::launcher {
namespace {

const std::string* find(const cluster::EnvMap& env, const std::string& name) {
  const auto it = env.find(name);
  return it == env.end() || it->second.empty() ? nullptr : &it->second;
}

int parse_int(const std::string& what, const std::string& text) {
  int value = 0;
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || ptr != text.data() + text.size()) {
    throw Error(fmt::format("{}='{}' is not an integer", what, text));
  }
  return value;
}

// srun --ntasks-per-node=1 dtrain-launch ...: one agent per node of the job.
void resolve_from_slurm(LaunchOptions& o, const cluster::EnvMap& env) {
  const std::string* nnodes = find(env, "SLURM_NNODES");
  const std::string* nodeid = find(env, "SLURM_NODEID");
  const std::string* nodelist = find(env, "SLURM_STEP_NODELIST");
  if (nodelist == nullptr) nodelist = find(env, "SLURM_JOB_NODELIST");
  if (nnodes == nullptr || nodeid == nullptr || nodelist == nullptr) {
    throw Error("SLURM_JOB_ID is set but SLURM_NNODES, SLURM_NODEID or SLURM_STEP_NODELIST is not: start "
                "dtrain-launch with srun --ntasks-per-node=1, or pass --nnodes, --node-rank and "
                "--rdzv-endpoint (or --standalone)");
  }
  const std::string& job = *find(env, "SLURM_JOB_ID");
  o.min_nodes = o.max_nodes = parse_int("SLURM_NNODES", *nnodes);
  o.node_rank = parse_int("SLURM_NODEID", *nodeid);
  o.endpoint_host = cluster::first_host(*nodelist);
  if (const std::string* port = find(env, "DTRAIN_STORE_PORT")) {
    o.endpoint_port = parse_int("DTRAIN_STORE_PORT", *port);
  } else {
    const std::string* step = find(env, "SLURM_STEP_ID");
    o.endpoint_port = cluster::slurm_store_port(job, step != nullptr ? *step : "0");
  }
  if (o.run_id.empty()) o.run_id = job;
  o.from_slurm = true;
}

void check(const LaunchOptions& o) {
  if (o.command.empty()) {
    throw Error("no program to start: put it after the options, e.g. dtrain-launch --standalone "
                "--nproc-per-node 2 -- dtrain-worker --config job.json");
  }
  if (o.nproc_per_node < 1) throw Error("--nproc-per-node must be at least 1");
  if (o.max_restarts < 0) throw Error("--max-restarts must be 0 or more");
  if (o.min_nodes < 1 || o.max_nodes < o.min_nodes) {
    throw Error(fmt::format("--nnodes {}:{} is not a range MIN:MAX with 1 <= MIN <= MAX", o.min_nodes, o.max_nodes));
  }
  if (o.node_rank && (*o.node_rank < 0 || (!o.elastic() && *o.node_rank >= o.max_nodes))) {
    throw Error(fmt::format("--node-rank {} is outside 0..{} (--nnodes {})", *o.node_rank, o.max_nodes - 1,
                            o.max_nodes));
  }
  if (o.monitor_interval_s <= 0 || o.stop_timeout_s < 0 || o.hang_timeout_s < 0 || o.rdzv_timeout_s <= 0 ||
      o.last_call_s < 0) {
    throw Error("--monitor-interval and --rdzv-timeout must be positive; --hang-timeout, --stop-timeout and "
                "--rdzv-last-call must not be negative");
  }
  if (o.metrics_port < 0 || o.metrics_port > 65535) {
    throw Error(fmt::format("--metrics-port {} is not in 0..65535 (0 turns /metrics off)", o.metrics_port));
  }
  if (o.multi_node() && (o.endpoint_port < 1 || o.endpoint_port > 65535)) {
    throw Error(fmt::format("rendezvous port {} is not in 1..65535", o.endpoint_port));
  }
}

}  // namespace

std::pair<int, int> parse_nnodes(const std::string& text) {
  const auto colon = text.find(':');
  try {
    if (colon == std::string::npos) {
      const int n = parse_int("--nnodes", text);
      return {n, n};
    }
    return {parse_int("--nnodes", text.substr(0, colon)), parse_int("--nnodes", text.substr(colon + 1))};
  } catch (const Error&) {
    throw Error(fmt::format("--nnodes '{}' is neither N nor MIN:MAX", text));
  }
}

LaunchOptions parse_command_line(const std::vector<std::string>& args, std::string* help) {
  LaunchOptions o;
  std::string nnodes, endpoint;
  int node_rank = -1;
  CLI::App app{"dtrain-launch: start, supervise and restart the workers of a dtrain job on this node"};
  app.prefix_command();  // everything from the first positional (or after --) is the program
  app.add_flag("--standalone", o.standalone, "one node: host the store on a free loopback port");
  app.add_option("--nnodes", nnodes, "nodes: N, or MIN:MAX for an elastic job");
  app.add_option("--node-rank", node_rank, "this node's rank (0 hosts the store)");
  app.add_option("--rdzv-endpoint", endpoint, "HOST:PORT of the rendezvous store");
  app.add_option("--rdzv-id", o.run_id, "the run id every agent of the job shares");
  app.add_option("--nproc-per-node", o.nproc_per_node, "workers on this node");
  app.add_option("--max-restarts", o.max_restarts, "restarts of the whole job after failures");
  app.add_option("--monitor-interval", o.monitor_interval_s, "seconds between health checks");
  app.add_option("--hang-timeout", o.hang_timeout_s, "seconds without progress before a hang (0: off)");
  app.add_option("--stop-timeout", o.stop_timeout_s, "seconds between SIGTERM and SIGKILL when stopping");
  app.add_option("--rdzv-timeout", o.rdzv_timeout_s, "seconds to wait for the nodes of a round");
  app.add_option("--rdzv-last-call", o.last_call_s, "elastic: seconds to wait for more nodes once MIN joined");
  app.add_option("--log-dir", o.log_dir, "where rank_K.log files go");
  app.add_option("--metrics-port", o.metrics_port, "serve Prometheus /metrics on this port (0: off)");
  app.add_option("--metrics-host", o.metrics_host, "the address /metrics listens on (default 127.0.0.1)");
  app.add_option("--peak-flops", o.peak_flops, "one worker's peak FLOP/s (e.g. 989e12): /metrics then has dtrain_mfu")
      ->check(CLI::NonNegativeNumber);
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::CallForHelp&) {
    if (help != nullptr) *help = app.help();
    return o;
  } catch (const CLI::ParseError& e) {
    throw Error(fmt::format("{} (see dtrain-launch --help)", e.what()));
  }
  o.command = app.remaining();
  if (!o.command.empty() && o.command.front() == "--") o.command.erase(o.command.begin());
  if (!nnodes.empty()) std::tie(o.min_nodes, o.max_nodes) = parse_nnodes(nnodes);
  if (node_rank >= 0) o.node_rank = node_rank;
  if (!endpoint.empty()) {
    const cluster::HostPort hp = cluster::parse_host_port(endpoint, "--rdzv-endpoint");
    o.endpoint_host = hp.host;
    o.endpoint_port = hp.port;
  }
  if (o.standalone && (!nnodes.empty() || !endpoint.empty() || o.node_rank)) {
    throw Error("--standalone runs one node with its own store: drop --nnodes, --node-rank and --rdzv-endpoint");
  }
  return o;
}

void resolve_options(LaunchOptions& o, const cluster::EnvMap& env) {
  const bool given = o.standalone || !o.endpoint_host.empty();
  if (!given && find(env, "SLURM_JOB_ID") != nullptr) resolve_from_slurm(o, env);
  if (!o.standalone && o.endpoint_host.empty()) {
    if (o.max_nodes > 1) {
      throw Error("a job of several nodes needs --rdzv-endpoint HOST:PORT (the host of node rank 0), or run "
                  "under srun --ntasks-per-node=1 so Slurm's variables say it; one node: --standalone");
    }
    o.standalone = true;  // one node and no endpoint: as torchrun, behave as --standalone
  }
  if (o.standalone) {
    o.endpoint_host = "127.0.0.1";
    o.min_nodes = o.max_nodes = 1;
    o.node_rank = 0;
  }
  if (o.run_id.empty()) o.run_id = "dtrain";
  check(o);
}

}  // namespace dtrain::launcher
