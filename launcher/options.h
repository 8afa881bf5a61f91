// What one dtrain-launch agent was asked to do: the command line
// (docs/launcher.md), completed from Slurm's variables when the agent runs as
// one task per node under srun, and checked.
//
// torchrun's contract: its flag spellings are aliases (--nproc_per_node,
// --node_rank, --rdzv_endpoint, --rdzv_id, --max_restarts, --master_addr and
// --master_port, which name the rendezvous endpoint as in torchrun's static
// rendezvous), --nproc-per-node takes N, auto, cpu or gpu, a program ending
// in .py runs under `python3 -u` (--no-python: as it is; --module: `python3
// -u -m`). The program starts after `--` or at the first argument that is
// neither a launcher option nor an option's value; an unknown option before
// it is an error naming it. torchrun's options whose work dtrain does its
// own way are accepted with that meaning: --rdzv-backend c10d|static (both:
// dtrain's store; etcd and torchrun's etcd-v2: an etcd cluster, spoken to
// with etcd's v3 API), --tee and --redirects (per-rank logs and the console,
// always; LaunchOptions::notes says so), --local-addr (the name this node
// advertises), --standalone with --nnodes 1.
//
// Pure functions, except detect_node_resources: they read only their
// arguments, so tests pass their own argument lists and environments.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "cluster/env_vars.h"
#include "cluster/environment.h"

namespace dtrain::launcher {

struct LaunchOptions {
  bool standalone = false;
  int min_nodes = 1;                // --nnodes N (MIN = MAX = N) or MIN:MAX
  int max_nodes = 1;
  std::optional<int> node_rank;     // --node-rank: this node's place (a preference when elastic)
  std::string endpoint_host;        // --rdzv-endpoint HOST:PORT (standalone: 127.0.0.1)
  int endpoint_port = 0;            // standalone: 0 until a free port is bound
  bool etcd = false;                // --rdzv-backend etcd (or etcd-v2): the rendezvous and the store live in etcd
  std::vector<cluster::HostPort> etcd_endpoints;  // --rdzv-endpoint h1:2379,h2:2379,... when etcd
  std::string run_id;               // --rdzv-id, else SLURM_JOB_ID; empty: the agent makes a fresh one
  std::string local_addr;           // --local-addr: the name this node advertises (empty: its hostname)
  std::string nproc_spec = "1";     // --nproc-per-node as given: N, auto, cpu or gpu
  int nproc_per_node = 1;           // resolved from nproc_spec by resolve_options
  int max_restarts = 0;
  double monitor_interval_s = 0.5;
  double hang_timeout_s = 300.0;    // 0: no hang detection
  double stop_timeout_s = 15.0;     // grace between SIGTERM and SIGKILL
  double rdzv_timeout_s = 600.0;    // waiting for nodes to join a round
  double last_call_s = 10.0;        // elastic: after MIN nodes joined, wait this long for more
  std::string log_dir = "logs";
  int metrics_port = 0;              // --metrics-port: serve /metrics here (0: off)
  std::string metrics_host = "127.0.0.1";  // --metrics-host: the address /metrics listens on
  double metrics_linger_s = 0.0;     // --metrics-linger: keep serving the final values this long
  double peak_flops = 0.0;           // --peak-flops: one worker's peak FLOP/s, for dtrain_mfu (0: not exported)
  std::vector<std::string> command;  // what each worker executes: PROGRAM ARGS... (python3 -u first for .py)
  bool from_slurm = false;           // nodes, rank and endpoint came from Slurm's variables
  std::vector<std::string> notes;    // what the agent says at start about options taken with another meaning

  bool elastic() const { return min_nodes != max_nodes; }
  bool multi_node() const { return !standalone; }
};

// Parses argv (argv[0] is the program). Throws dtrain::Error naming the
// option and the fix. For --help and --version, `message` is set to the text
// to print (and nothing else is checked).
LaunchOptions parse_command_line(const std::vector<std::string>& args, std::string* message);

// What --nproc-per-node auto|cpu|gpu counts on this node.
struct NodeResources {
  int cpus = 1;
  int gpus = 0;  // CUDA devices this process may use
};

// The CPUs online, and the GPUs: CUDA_VISIBLE_DEVICES's entries when it is
// set, else the NVIDIA driver's devices (/proc/driver/nvidia/gpus). Reads the
// machine, unlike the rest of this header.
NodeResources detect_node_resources(const cluster::EnvMap& env);

// torchrun's meanings: N; cpu: the CPUs; gpu: the GPUs (an error without
// one); auto: the GPUs if any, else the CPUs. Throws dtrain::Error naming
// --nproc-per-node.
int resolve_nproc_per_node(const std::string& spec, const NodeResources& node);

// Fills what the command line left out from `env` (Slurm: SLURM_JOB_ID,
// SLURM_NNODES, SLURM_NODEID, SLURM_STEP_NODELIST or SLURM_JOB_NODELIST; the
// port is DTRAIN_STORE_PORT or derived from the job and step ids as for
// srun-started workers, cluster/slurm_store.h: 20000-27999), resolves
// --nproc-per-node against `node`, and checks the whole. Throws
// dtrain::Error saying what is missing or inconsistent.
void resolve_options(LaunchOptions& options, const cluster::EnvMap& env, const NodeResources& node);

// "4", "2:4" -> {min, max}; throws naming --nnodes.
std::pair<int, int> parse_nnodes(const std::string& text);

}  // namespace dtrain::launcher
