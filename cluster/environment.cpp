#include "cluster/environment.h"

#include <array>
#include <cctype>
#include <charconv>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "cluster/env_vars.h"
#include "cluster/hostlist.h"
#include "cluster/slurm_store.h"
#include "core/error.h"

namespace dtrain::cluster {
namespace {

// What dtrain-launch sets besides DTRAIN_RANK to place a worker. Any of them
// without DTRAIN_RANK is half a launch, most likely a stale export. The run
// variables (DTRAIN_STORE, DTRAIN_TOKEN, DTRAIN_RUN_ID) are not here: users
// export those under mpirun and srun on purpose.
constexpr std::array<const char*, 5> kLauncherLayoutVars = {
    "DTRAIN_WORLD_SIZE", "DTRAIN_LOCAL_RANK", "DTRAIN_LOCAL_WORLD_SIZE", "DTRAIN_NODE_RANK",
    "DTRAIN_RESTART"};

// torchrun's placement variables: any of them makes the worker read the
// torchrun family, which then must be whole.
constexpr std::array<const char*, 4> kTorchrunVars = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"};

// The variables each field was read from, so that a range error names them.
struct Sources {
  std::string rank;
  std::string world_size;
  std::string local_rank;
  std::string local_world_size;
  std::string node_rank;
};

// Local rank and local world size come as a pair; with neither, this process
// is taken to share one node with the whole world.
void read_local_pair(const EnvMap& vars, const Sources& sources, const std::string& starter,
                     Environment& env) {
  const std::optional<int> local_rank = optional_int(vars, sources.local_rank);
  const std::optional<int> local_world = optional_int(vars, sources.local_world_size);
  if (local_rank && !local_world) {
    throw_missing(sources.local_rank, sources.local_world_size, starter);
  }
  if (!local_rank && local_world) {
    throw_missing(sources.local_world_size, sources.local_rank, starter);
  }
  env.local_rank = local_rank.value_or(env.rank);
  env.local_world_size = local_world.value_or(env.world_size);
}

[[noreturn]] void throw_range(const Environment& env, const std::string& problem) {
  throw Error(fmt::format("{}, started by {}: the starter's variables disagree; check how the "
                          "job was launched and unset stale exports",
                          problem, starter_name(env.starter)));
}

void validate(const Environment& env, const Sources& src) {
  if (env.world_size < 1) {
    throw_range(env, fmt::format("{}={} must be at least 1", src.world_size, env.world_size));
  }
  if (env.rank < 0 || env.rank >= env.world_size) {
    throw_range(env, fmt::format("{}={} is outside 0..{} ({}={})", src.rank, env.rank,
                                 env.world_size - 1, src.world_size, env.world_size));
  }
  if (env.local_world_size < 1 || env.local_world_size > env.world_size) {
    throw_range(env, fmt::format("{}={} must be between 1 and {}={}", src.local_world_size,
                                 env.local_world_size, src.world_size, env.world_size));
  }
  if (env.local_rank < 0 || env.local_rank >= env.local_world_size) {
    throw_range(env,
                fmt::format("{}={} is outside 0..{} ({}={})", src.local_rank, env.local_rank,
                            env.local_world_size - 1, src.local_world_size, env.local_world_size));
  }
  if (env.node_rank < 0) {
    throw_range(env, fmt::format("{}={} must not be negative", src.node_rank, env.node_rank));
  }
}

// DTRAIN_STORE, DTRAIN_TOKEN and DTRAIN_RUN_ID, which dtrain-launch sets and
// users may export under any other starter.
void read_run_vars(const EnvMap& vars, Environment& env) {
  if (const std::string* store = lookup(vars, "DTRAIN_STORE")) {
    if (is_etcd_address(*store)) {
      parse_etcd_endpoints(*store, "DTRAIN_STORE");  // etcd's endpoints (dtrain-launch --rdzv-backend etcd)
    } else {
      parse_host_port(*store, "DTRAIN_STORE");
    }
    env.store = *store;
  }
  env.token = value_or(vars, "DTRAIN_TOKEN", "");
  env.run_id = value_or(vars, "DTRAIN_RUN_ID", "");
}

// PMIx sets PMIX_RANK for the same process the starter names; a different
// value means the environment mixes two launches.
void read_pmix(const EnvMap& vars, const std::string& rank_var, Environment& env) {
  const std::optional<int> pmix_rank = optional_int(vars, "PMIX_RANK");
  if (!pmix_rank) return;
  if (*pmix_rank != env.rank) {
    throw Error(
        fmt::format("PMIX_RANK={} and {}={} disagree: the environment mixes two launches; "
                    "unset the stale one",
                    *pmix_rank, rank_var, env.rank));
  }
  env.pmix = true;
}

// Rank, world, local rank and world, and node rank as `src` names them.
Environment read_ranks(const EnvMap& vars, const Sources& src, Starter starter) {
  const std::string name = starter_name(starter);
  Environment env;
  env.starter = starter;
  env.rank = parse_int(src.rank, *lookup(vars, src.rank));
  env.world_size = required_int(vars, src.world_size, src.rank, name);
  read_local_pair(vars, src, name, env);
  env.node_rank = optional_int(vars, src.node_rank).value_or(0);
  return env;
}

Environment from_launcher(const EnvMap& vars) {
  const Sources src{"DTRAIN_RANK", "DTRAIN_WORLD_SIZE", "DTRAIN_LOCAL_RANK",
                    "DTRAIN_LOCAL_WORLD_SIZE", "DTRAIN_NODE_RANK"};
  Environment env = read_ranks(vars, src, Starter::launcher);
  env.restart = optional_int(vars, "DTRAIN_RESTART").value_or(0);
  if (env.restart < 0) {
    throw Error(
        fmt::format("DTRAIN_RESTART={} must not be negative; fix or unset it", env.restart));
  }
  read_run_vars(vars, env);
  validate(env, src);
  return env;
}

// MASTER_ADDR with DTRAIN_STORE_PORT, MASTER_PORT, or MASTER_PORT + 1 when
// torchrun's agent keeps PyTorch's store on MASTER_PORT.
std::string torchrun_store(const EnvMap& vars, const Environment& env) {
  const std::string* addr = lookup(vars, "MASTER_ADDR");
  const std::string* port = lookup(vars, "MASTER_PORT");
  if (addr == nullptr && port == nullptr) {
    throw Error(fmt::format(
        "RANK and WORLD_SIZE={} are set but MASTER_ADDR and MASTER_PORT are not: torchrun sets them "
        "together (the host and port of rank 0's store); set them, or DTRAIN_STORE=host:port",
        env.world_size));
  }
  if (addr == nullptr) throw_missing("MASTER_PORT", "MASTER_ADDR", starter_name(Starter::torchrun));
  if (port == nullptr) throw_missing("MASTER_ADDR", "MASTER_PORT", starter_name(Starter::torchrun));
  int store_port = port_in_range("MASTER_PORT", *port);
  if (const std::string* own = lookup(vars, "DTRAIN_STORE_PORT")) {
    store_port = port_in_range("DTRAIN_STORE_PORT", *own);
  } else if (value_or(vars, "TORCHELASTIC_USE_AGENT_STORE", "") == "True") {
    if (store_port == kMaxPort) {
      throw Error("MASTER_PORT=65535 holds torchrun's own store and leaves no port above it for dtrain's: set "
                  "DTRAIN_STORE_PORT");
    }
    ++store_port;
  }
  return addr->find(':') == std::string::npos ? fmt::format("{}:{}", *addr, store_port)
                                              : fmt::format("[{}]:{}", *addr, store_port);
}

Environment from_torchrun(const EnvMap& vars) {
  const Sources src{"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK"};
  const std::string name = starter_name(Starter::torchrun);
  if (!is_set(vars, "RANK")) {
    for (const char* var : kTorchrunVars) {
      if (is_set(vars, var)) throw_missing(var, "RANK", name);
    }
  }
  Environment env = read_ranks(vars, src, Starter::torchrun);
  env.restart = optional_int(vars, "TORCHELASTIC_RESTART_COUNT").value_or(0);
  if (env.restart < 0) {
    throw Error(fmt::format("TORCHELASTIC_RESTART_COUNT={} must not be negative; fix or unset it", env.restart));
  }
  read_run_vars(vars, env);
  if (env.run_id.empty()) env.run_id = value_or(vars, "TORCHELASTIC_RUN_ID", "");
  validate(env, src);
  if (!env.store && env.world_size > 1) env.store = torchrun_store(vars, env);
  if (env.store) parse_host_port(*env.store, "MASTER_ADDR:MASTER_PORT");
  return env;
}

Environment from_mpirun(const EnvMap& vars) {
  const Sources src{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                    "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_NODE_RANK"};
  Environment env = read_ranks(vars, src, Starter::mpirun);
  read_pmix(vars, src.rank, env);
  read_run_vars(vars, env);
  if (env.run_id.empty()) env.run_id = value_or(vars, "SLURM_JOB_ID", "");
  validate(env, src);
  return env;
}

// Tasks on this node, from Slurm's "2(x3),1" form (one count per node id).
// Without it, this node is taken to run one task.
int slurm_local_world(const EnvMap& vars, const std::string& var, int node_id, int local_id) {
  const std::string* spec = lookup(vars, var);
  if (spec == nullptr) {
    if (local_id > 0) {
      throw Error(fmt::format(
          "SLURM_LOCALID={} but neither SLURM_STEP_TASKS_PER_NODE nor SLURM_TASKS_PER_NODE says "
          "how many tasks run on this node: srun sets them; start the worker with srun, or set "
          "SLURM_STEP_TASKS_PER_NODE",
          local_id));
    }
    return 1;
  }
  std::vector<int> counts;
  try {
    counts = expand_tasks_per_node(*spec);
  } catch (const Error& e) {
    throw Error(fmt::format("{}: {}", var, e.what()));
  }
  if (node_id < 0 || static_cast<size_t>(node_id) >= counts.size() ||
      counts[static_cast<size_t>(node_id)] < 1) {
    throw Error(fmt::format(
        "SLURM_NODEID={} but {}='{}' lists no task on that node; the Slurm variables disagree: "
        "check how the job was launched and unset stale exports",
        node_id, var, *spec));
  }
  return counts[static_cast<size_t>(node_id)];
}

// Without DTRAIN_STORE, a step of several tasks keeps its store on the first
// node of the step, where Slurm puts task 0, on DTRAIN_STORE_PORT or a port
// of the job and step's own.
void derive_slurm_store(const EnvMap& vars, Environment& env) {
  if (env.store || env.world_size < 2 || env.slurm_step_nodelist.empty()) return;
  std::string host;
  try {
    host = first_host(env.slurm_step_nodelist);
  } catch (const Error& e) {
    throw Error(fmt::format("SLURM_STEP_NODELIST: {}", e.what()));
  }
  int port = 0;
  if (const std::string* value = lookup(vars, "DTRAIN_STORE_PORT")) {
    port = port_in_range("DTRAIN_STORE_PORT", *value);
  } else {
    port = slurm_store_port(env.slurm_job_id, env.slurm_step_id);
  }
  env.store = host.find(':') == std::string::npos ? fmt::format("{}:{}", host, port)
                                                  : fmt::format("[{}]:{}", host, port);
  env.store_from_slurm = true;
}

Environment from_srun(const EnvMap& vars) {
  const std::string starter = starter_name(Starter::slurm);
  const std::string world_var =
      is_set(vars, "SLURM_STEP_NUM_TASKS") ? "SLURM_STEP_NUM_TASKS" : "SLURM_NTASKS";
  const std::string tasks_var =
      is_set(vars, "SLURM_STEP_TASKS_PER_NODE") ? "SLURM_STEP_TASKS_PER_NODE" : "SLURM_TASKS_PER_NODE";
  Sources src{"SLURM_PROCID", world_var, "SLURM_LOCALID", tasks_var, "SLURM_NODEID"};
  Environment env;
  env.starter = Starter::slurm;
  env.rank = parse_int(src.rank, *lookup(vars, src.rank));
  if (!is_set(vars, world_var)) {
    throw Error(
        "SLURM_PROCID is set inside an srun step but neither SLURM_STEP_NUM_TASKS nor "
        "SLURM_NTASKS is: srun sets them; start the worker with srun, or set "
        "SLURM_NTASKS");
  }
  env.world_size = parse_int(world_var, *lookup(vars, world_var));
  env.local_rank = required_int(vars, src.local_rank, src.rank, starter);
  env.node_rank = required_int(vars, src.node_rank, src.rank, starter);
  env.local_world_size = slurm_local_world(vars, tasks_var, env.node_rank, env.local_rank);
  src.local_world_size = fmt::format("{}[node {}]", tasks_var, env.node_rank);
  read_pmix(vars, src.rank, env);
  read_run_vars(vars, env);
  env.slurm_job_id = value_or(vars, "SLURM_JOB_ID", value_or(vars, "SLURM_JOBID", ""));
  env.slurm_step_id = value_or(vars, "SLURM_STEP_ID", value_or(vars, "SLURM_STEPID", ""));
  env.slurm_step_nodelist =
      value_or(vars, "SLURM_STEP_NODELIST", value_or(vars, "SLURM_JOB_NODELIST", ""));
  env.slurm_restart_count = value_or(vars, "SLURM_RESTART_COUNT", "");
  env.slurmd_nodename = value_or(vars, "SLURMD_NODENAME", "");
  if (env.run_id.empty()) env.run_id = env.slurm_job_id;
  validate(env, src);
  derive_slurm_store(vars, env);
  return env;
}

// No starter: rank 0 of 1. This includes a batch script running the worker
// itself (SLURM_PROCID without a step id), where no other task exists.
Environment single_process(const EnvMap& vars) {
  Environment env;
  read_run_vars(vars, env);
  if (env.run_id.empty()) env.run_id = value_or(vars, "SLURM_JOB_ID", "");
  return env;
}

Environment detect_starter(const EnvMap& vars) {
  if (is_set(vars, "DTRAIN_RANK")) return from_launcher(vars);
  for (const char* name : kLauncherLayoutVars) {
    if (is_set(vars, name)) throw_missing(name, "DTRAIN_RANK", starter_name(Starter::launcher));
  }
  for (const char* name : kTorchrunVars) {
    if (is_set(vars, name)) return from_torchrun(vars);
  }
  if (is_set(vars, "OMPI_COMM_WORLD_RANK")) return from_mpirun(vars);
  if (is_set(vars, "SLURM_PROCID") && (is_set(vars, "SLURM_STEP_ID") || is_set(vars, "SLURM_STEPID"))) {
    return from_srun(vars);
  }
  return single_process(vars);
}

}  // namespace

const char* starter_name(Starter starter) {
  switch (starter) {
    case Starter::single:
      return "single";
    case Starter::launcher:
      return "dtrain-launch";
    case Starter::torchrun:
      return "torchrun";
    case Starter::mpirun:
      return "mpirun";
    case Starter::slurm:
      return "srun";
  }
  return "unknown";
}

std::string Environment::describe() const {
  return fmt::format("rank {} of {} (local {} of {}, node {}), started by {}", rank, world_size,
                     local_rank, local_world_size, node_rank, starter_name(starter));
}

Environment detect_environment(const EnvMap& vars) {
  Environment env = detect_starter(vars);
  env.cuda_visible_devices = value_or(vars, "CUDA_VISIBLE_DEVICES", "");
  env.slurm_gpus = value_or(vars, "SLURM_STEP_GPUS", value_or(vars, "SLURM_JOB_GPUS", ""));
  return env;
}

}  // namespace dtrain::cluster
