#include "launcher/options.h"

#include <filesystem>
#include <regex>
#include <thread>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "cluster/devices.h"
#include "cluster/env_vars.h"
#include "cluster/hostlist.h"
#include "cluster/slurm_store.h"
#include "core/command_line.h"
#include "core/error.h"

namespace dtrain::launcher {
namespace {

// torchrun's defaults for the half of --master-addr/--master-port not given.
constexpr const char* kMasterAddr = "127.0.0.1";
constexpr int kMasterPort = 29500;

// What the command line says before it becomes LaunchOptions.
struct RawArgs {
  std::string nnodes, endpoint, master_addr;
  std::string rdzv_backend = "c10d";
  std::string tee, redirects;  // torchrun's 0-3 or LOCAL_RANK:0-3,...
  int node_rank = -1;
  int master_port = 0;
  bool no_python = false;
  bool module = false;
};

// The usage line names the program, which CLI11 cannot know about.
class HelpFormatter : public CLI::Formatter {
 public:
  std::string make_usage(const CLI::App* /*app*/, std::string name) const override {
    return fmt::format("Usage: {} [OPTIONS] [--] PROGRAM [ARGS...]\n", name);
  }
};

void add_options(CLI::App& app, LaunchOptions& o, RawArgs& raw) {
  app.formatter(std::make_shared<HelpFormatter>());
  app.option_defaults()->always_capture_default();
  app.set_version_flag("--version", version_text("dtrain-launch"));
  app.add_flag("--standalone", o.standalone, "one node: host the store on a free loopback port");
  app.add_option("--nnodes", raw.nnodes, "nodes: N, or MIN:MAX for an elastic job")->default_str("1");
  app.add_option("--node-rank,--node_rank", raw.node_rank, "this node's rank (0 hosts the store)")
      ->default_str("arrival order");
  app.add_option("--rdzv-endpoint,--rdzv_endpoint", raw.endpoint,
                 "HOST:PORT of the rendezvous store; with --rdzv-backend etcd, etcd's client endpoints H1:P1,H2:P2,...")
      ->default_str("none");
  app.add_option("--master-addr,--master_addr", raw.master_addr,
                 "torchrun's spelling of the endpoint's host (with --master-port: HOST:PORT)")
      ->default_str(kMasterAddr);
  app.add_option("--master-port,--master_port", raw.master_port, "torchrun's spelling of the endpoint's port")
      ->default_str(std::to_string(kMasterPort));
  app.add_option("--rdzv-id,--rdzv_id", o.run_id, "the run id every agent of the job shares")
      ->default_str("$SLURM_JOB_ID, else a fresh one per job");
  app.add_option("--rdzv-backend,--rdzv_backend", raw.rdzv_backend,
                 "c10d or static (both: dtrain's built-in store, hosted by node rank 0), or etcd (torchrun's "
                 "etcd-v2 too): an etcd cluster at --rdzv-endpoint h1:2379,h2:2379,...");
  app.add_option("--local-addr,--local_addr", o.local_addr,
                 "the name or address this node advertises to the others (rendezvous, failure reports)")
      ->default_str("hostname");
  app.add_option("--nproc-per-node,--nproc_per_node", o.nproc_spec,
                 "workers on this node: N, auto (the GPUs, else the CPUs), cpu or gpu");
  app.add_option("--max-restarts,--max_restarts", o.max_restarts, "restarts of the whole job after failures");
  app.add_flag("--no-python,--no_python", raw.no_python, "run a .py PROGRAM as it is, not under python3 -u");
  app.add_flag("-m,--module", raw.module, "PROGRAM is a Python module: run python3 -u -m PROGRAM");
  app.add_option("--monitor-interval", o.monitor_interval_s, "seconds between health checks");
  app.add_option("--hang-timeout", o.hang_timeout_s, "seconds without progress before a hang (0: off)");
  app.add_option("--stop-timeout", o.stop_timeout_s, "seconds between SIGTERM and SIGKILL when stopping");
  app.add_option("--rdzv-timeout", o.rdzv_timeout_s, "seconds to wait for the nodes of a round");
  app.add_option("--rdzv-last-call", o.last_call_s, "elastic: seconds to wait for more nodes once MIN joined");
  app.add_option("--log-dir", o.log_dir, "where rank_K.log files go");
  app.add_option("-t,--tee", raw.tee,
                 "torchrun's; accepted: every worker's stdout and stderr always go to LOG_DIR/rank_K.log and to "
                 "the console as [rank K]")
      ->default_str("3 (always)");
  app.add_option("-r,--redirects", raw.redirects, "torchrun's; accepted, as --tee: logs and console, always")
      ->default_str("3 (always)");
  app.add_option("--metrics-port", o.metrics_port, "serve Prometheus /metrics on this port (0: off)");
  app.add_option("--metrics-host", o.metrics_host, "the address /metrics listens on");
  app.add_option("--metrics-linger", o.metrics_linger_s, "seconds /metrics keeps serving the final values after the job")
      ->check(at_least(0));
  app.add_option("--peak-flops", o.peak_flops, "one worker's peak FLOP/s (e.g. 989e12): /metrics then has dtrain_mfu")
      ->check(at_least(0));
}

// Splits args (argv[0] first) into the launcher's part and the program's:
// the program starts after "--" or at the first argument that is neither an
// option of `app` nor an option's value. An unknown option is an error here,
// so it is never run as the program.
std::vector<std::string> split_program(const CLI::App& app, const std::vector<std::string>& args,
                                       std::vector<std::string>& launcher_args) {
  for (std::size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--") return {args.begin() + static_cast<std::ptrdiff_t>(i) + 1, args.end()};
    if (a.size() < 2 || a[0] != '-') return {args.begin() + static_cast<std::ptrdiff_t>(i), args.end()};
    const std::string name = a.substr(0, a.find('='));
    const CLI::Option* opt = app.get_option_no_throw(name);
    if (opt == nullptr) {
      throw Error(fmt::format("unknown option '{}' before the program: it is not a dtrain-launch option "
                              "(dtrain-launch --help lists them, with the torchrun spellings it takes)",
                              name));
    }
    launcher_args.push_back(a);
    if (opt->get_expected_max() > 0 && name.size() == a.size() && i + 1 < args.size()) {
      launcher_args.push_back(args[++i]);
    }
  }
  return {};
}

// PROGRAM ARGS... as each worker executes it: a .py file (or, with --module,
// a module) under `python3 -u`, as torchrun runs its workers.
std::vector<std::string> worker_command(std::vector<std::string> program, const RawArgs& raw) {
  if (raw.no_python && raw.module) {
    throw Error("--no-python and --module contradict each other: a module needs python3; drop one");
  }
  if (program.empty()) return program;
  const bool py = std::filesystem::path(program.front()).extension() == ".py";
  if (raw.module) {
    program.insert(program.begin(), {"python3", "-u", "-m"});
  } else if (py && !raw.no_python) {
    program.insert(program.begin(), {"python3", "-u"});
  }
  return program;
}

// --rdzv-endpoint, or torchrun's --master-addr/--master-port for it.
void set_endpoint(LaunchOptions& o, const RawArgs& raw) {
  const bool master = !raw.master_addr.empty() || raw.master_port != 0;
  if (master && !raw.endpoint.empty()) {
    throw Error("--rdzv-endpoint and --master-addr/--master-port both name the rendezvous endpoint: give one");
  }
  std::string endpoint = raw.endpoint;
  if (master) {
    const std::string host = raw.master_addr.empty() ? kMasterAddr : raw.master_addr;
    const int port = raw.master_port != 0 ? raw.master_port : kMasterPort;
    endpoint = host.find(':') != std::string::npos ? fmt::format("[{}]:{}", host, port)
                                                   : fmt::format("{}:{}", host, port);
  }
  if (endpoint.empty()) return;
  if (o.etcd) {
    if (master) {
      throw Error("--rdzv-backend etcd takes etcd's endpoints from --rdzv-endpoint, not --master-addr/--master-port");
    }
    o.etcd_endpoints = cluster::parse_etcd_endpoints(endpoint, "--rdzv-endpoint");
    o.endpoint_host = o.etcd_endpoints.front().host;  // for messages; the store is the whole list
    o.endpoint_port = o.etcd_endpoints.front().port;
    return;
  }
  const cluster::HostPort hp = cluster::parse_host_port(endpoint, master ? "--master-addr:--master-port" : "--rdzv-endpoint");
  o.endpoint_host = hp.host;
  o.endpoint_port = hp.port;
}

// torchrun's --rdzv-backend: its c10d and static backends both come down to
// one store on the endpoint, which dtrain's built-in store is; etcd (and
// torchrun's etcd-v2, said to be the same with a note) keep the rendezvous
// and the workers' store in an etcd cluster.
void set_rdzv_backend(LaunchOptions& o, const std::string& backend) {
  if (backend == "c10d" || backend == "static") return;
  if (backend == "etcd" || backend == "etcd-v2") {
    o.etcd = true;
    if (backend == "etcd-v2") {
      o.notes.push_back("--rdzv-backend etcd-v2: torchrun's name, taken as dtrain's etcd backend, which speaks "
                        "etcd's v3 API (etcd 3.4 or later at --rdzv-endpoint)");
    }
    return;
  }
  throw Error(fmt::format("--rdzv-backend '{}' is not one dtrain-launch takes: c10d or static (both mean "
                          "dtrain's built-in store at --rdzv-endpoint, hosted by node rank 0), or etcd (etcd-v2) "
                          "for an etcd cluster at --rdzv-endpoint h1:2379,h2:2379,...",
                          backend));
}

// torchrun's --tee/--redirects value (0 none, 1 stdout, 2 stderr, 3 both;
// or LOCAL_RANK:0-3,...) is checked, then answered with a note: dtrain-launch
// always does what `3` asks of both, and keeps the console too.
void note_output_option(LaunchOptions& o, const std::string& option, const std::string& value) {
  if (value.empty()) return;
  static const std::regex form("[0-3]|[0-9]+:[0-3](,[0-9]+:[0-3])*");
  if (!std::regex_match(value, form)) {
    throw Error(fmt::format("{} '{}' is not torchrun's form: 0-3 (0 none, 1 stdout, 2 stderr, 3 both) or "
                            "LOCAL_RANK:0-3,... (e.g. 0:3,1:2)",
                            option, value));
  }
  o.notes.push_back(fmt::format("{} {}: accepted for torchrun's sake; dtrain-launch always writes every worker's "
                                "stdout and stderr to {}/rank_K.log and echoes them to this console as [rank K]",
                                option, value, o.log_dir));
}

// srun --ntasks-per-node=1 dtrain-launch ...: one agent per node of the job.
void resolve_from_slurm(LaunchOptions& o, const cluster::EnvMap& env) {
  const std::string* nnodes = cluster::lookup(env, "SLURM_NNODES");
  const std::string* nodeid = cluster::lookup(env, "SLURM_NODEID");
  const std::string* nodelist = cluster::lookup(env, "SLURM_STEP_NODELIST");
  if (nodelist == nullptr) nodelist = cluster::lookup(env, "SLURM_JOB_NODELIST");
  if (nnodes == nullptr || nodeid == nullptr || nodelist == nullptr) {
    throw Error("SLURM_JOB_ID is set but SLURM_NNODES, SLURM_NODEID or SLURM_STEP_NODELIST is not: start "
                "dtrain-launch with srun --ntasks-per-node=1, or pass --nnodes, --node-rank and "
                "--rdzv-endpoint (or --standalone)");
  }
  const std::string& job = *cluster::lookup(env, "SLURM_JOB_ID");
  o.min_nodes = o.max_nodes = cluster::parse_int("SLURM_NNODES", *nnodes);
  o.node_rank = cluster::parse_int("SLURM_NODEID", *nodeid);
  o.endpoint_host = cluster::first_host(*nodelist);
  if (const std::string* port = cluster::lookup(env, "DTRAIN_STORE_PORT")) {
    o.endpoint_port = cluster::parse_int("DTRAIN_STORE_PORT", *port);
  } else {
    const std::string* step = cluster::lookup(env, "SLURM_STEP_ID");
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
      const int n = cluster::parse_int("--nnodes", text);
      return {n, n};
    }
    return {cluster::parse_int("--nnodes", text.substr(0, colon)), cluster::parse_int("--nnodes", text.substr(colon + 1))};
  } catch (const Error&) {
    throw Error(fmt::format("--nnodes '{}' is neither N nor MIN:MAX", text));
  }
}

LaunchOptions parse_command_line(const std::vector<std::string>& args, std::string* message) {
  LaunchOptions o;
  RawArgs raw;
  CLI::App app{"dtrain-launch: start, supervise and restart the workers of a job on this node (torchrun's "
               "flags and worker environment included)",
               "dtrain-launch"};
  add_options(app, o, raw);
  std::vector<std::string> launcher_args = {args.empty() ? "dtrain-launch" : args.front()};
  std::vector<std::string> program;
  try {
    program = split_program(app, args, launcher_args);
    std::vector<const char*> argv;
    for (const auto& a : launcher_args) argv.push_back(a.c_str());
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::CallForHelp&) {
    if (message != nullptr) *message = app.help();
    return o;
  } catch (const CLI::CallForVersion& e) {
    if (message != nullptr) *message = std::string(e.what()) + "\n";
    return o;
  } catch (const CLI::ParseError& e) {
    throw Error(fmt::format("{} (see dtrain-launch --help)", e.what()));
  }
  o.command = worker_command(std::move(program), raw);
  if (!raw.nnodes.empty()) std::tie(o.min_nodes, o.max_nodes) = parse_nnodes(raw.nnodes);
  if (raw.node_rank >= 0) o.node_rank = raw.node_rank;
  set_rdzv_backend(o, raw.rdzv_backend);
  set_endpoint(o, raw);
  if (o.standalone && o.etcd) {
    throw Error("--standalone hosts its own store on this node; --rdzv-backend etcd is for jobs of several nodes "
                "that meet in an etcd cluster: drop one of them");
  }
  if (o.standalone && (o.min_nodes != 1 || o.max_nodes != 1 || !o.endpoint_host.empty() || o.node_rank)) {
    throw Error("--standalone runs one node with its own store: drop --node-rank, --rdzv-endpoint and "
                "--master-addr/--master-port, and --nnodes unless it is 1");
  }
  if (o.local_addr.find_first_of(" \t\n") != std::string::npos) {
    throw Error(fmt::format("--local-addr '{}' has white space: give one host name or address", o.local_addr));
  }
  note_output_option(o, "--tee", raw.tee);
  note_output_option(o, "--redirects", raw.redirects);
  return o;
}

NodeResources detect_node_resources(const cluster::EnvMap& env) {
  NodeResources node;
  node.cpus = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  if (const auto it = env.find("CUDA_VISIBLE_DEVICES"); it != env.end()) {
    node.gpus = cluster::count_devices(it->second);
    return node;
  }
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/driver/nvidia/gpus", ec)) {
    (void)entry;
    ++node.gpus;
  }
  return node;
}

int resolve_nproc_per_node(const std::string& spec, const NodeResources& node) {
  if (spec == "cpu") return node.cpus;
  if (spec == "auto") return node.gpus > 0 ? node.gpus : node.cpus;
  if (spec == "gpu") {
    if (node.gpus == 0) {
      throw Error("--nproc-per-node gpu: no GPU is visible here (CUDA_VISIBLE_DEVICES or the NVIDIA driver); "
                  "give a number, or cpu");
    }
    return node.gpus;
  }
  try {
    return cluster::parse_int("--nproc-per-node", spec);
  } catch (const Error&) {
    throw Error(fmt::format("--nproc-per-node '{}' is none of N, auto, cpu or gpu", spec));
  }
}

void resolve_options(LaunchOptions& o, const cluster::EnvMap& env, const NodeResources& node) {
  o.nproc_per_node = resolve_nproc_per_node(o.nproc_spec, node);
  if (o.etcd && o.endpoint_host.empty()) {
    throw Error("--rdzv-backend etcd needs --rdzv-endpoint with etcd's client endpoints, e.g. "
                "--rdzv-endpoint h1:2379,h2:2379,h3:2379");
  }
  const bool given = o.standalone || !o.endpoint_host.empty();
  if (!given && cluster::lookup(env, "SLURM_JOB_ID") != nullptr) resolve_from_slurm(o, env);
  if (!o.standalone && o.endpoint_host.empty()) {
    if (o.max_nodes > 1) {
      throw Error("a job of several nodes needs --rdzv-endpoint HOST:PORT (the host of node rank 0), or run "
                  "under srun --ntasks-per-node=1 so Slurm's variables say it; one node: --standalone");
    }
    o.standalone = true;  // one node and no endpoint: as torchrun, behave as --standalone
  }
  if (o.etcd && o.run_id.empty()) {
    if (const std::string* job = cluster::lookup(env, "SLURM_JOB_ID")) o.run_id = *job;
  }
  if (o.etcd && o.run_id.empty()) {
    throw Error("--rdzv-backend etcd needs --rdzv-id: the run id that every agent of the job gives and that "
                "scopes the job's keys in etcd (no agent hosts a store to hand out a fresh one)");
  }
  if (o.standalone) {
    o.endpoint_host = "127.0.0.1";
    o.min_nodes = o.max_nodes = 1;
    o.node_rank = 0;
  }
  check(o);
}

}  // namespace dtrain::launcher
