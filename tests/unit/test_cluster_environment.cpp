#include "cluster/environment.h"
#include "cluster/slurm_store.h"

#include <cstdlib>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/error.h"

namespace dtrain::cluster {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

// The message of the Error that detecting `vars` raises.
std::string env_error(const EnvMap& vars) {
  try {
    detect_environment(vars);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "detect_environment did not throw";
  return "";
}

// `vars` with the variables in `set` set (added, or replacing what was there).
EnvMap with(EnvMap vars, const EnvMap& set) {
  for (const auto& [name, value] : set) vars[name] = value;
  return vars;
}

// What dtrain-launch gives rank 3 of 8 (4 per node).
EnvMap launcher_vars() {
  return {{"DTRAIN_RANK", "3"},       {"DTRAIN_WORLD_SIZE", "8"},
          {"DTRAIN_LOCAL_RANK", "3"}, {"DTRAIN_LOCAL_WORLD_SIZE", "4"},
          {"DTRAIN_NODE_RANK", "0"},  {"DTRAIN_STORE", "node1:29500"},
          {"DTRAIN_TOKEN", "secret"}, {"DTRAIN_RUN_ID", "run-7"},
          {"DTRAIN_RESTART", "2"}};
}

// What Open MPI's mpirun gives rank 5 of 8, two nodes of 4.
EnvMap mpirun_vars() {
  return {{"OMPI_COMM_WORLD_RANK", "5"},
          {"OMPI_COMM_WORLD_SIZE", "8"},
          {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
          {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
          {"OMPI_COMM_WORLD_NODE_RANK", "1"}};
}

// What srun -N3 -n7 gives task 5 (tasks per node 3,2,2: node 2, local 0).
EnvMap srun_vars() {
  return {{"SLURM_PROCID", "5"},
          {"SLURM_NTASKS", "7"},
          {"SLURM_STEP_NUM_TASKS", "7"},
          {"SLURM_LOCALID", "0"},
          {"SLURM_NODEID", "2"},
          {"SLURM_STEP_TASKS_PER_NODE", "3,2(x2)"},
          {"SLURM_TASKS_PER_NODE", "3,2(x2)"},
          {"SLURM_JOB_ID", "1234"},
          {"SLURM_STEP_ID", "0"},
          {"SLURM_STEP_NODELIST", "n[01-03]"},
          {"SLURM_JOB_NODELIST", "n[01-04]"}};
}

// What torchrun gives rank 3 of 4 (2 per node), restarted once.
EnvMap torchrun_vars() {
  return {{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"}, {"GROUP_RANK", "1"},
          {"MASTER_ADDR", "node0"}, {"MASTER_PORT", "29500"}, {"TORCHELASTIC_RESTART_COUNT", "1"},
          {"TORCHELASTIC_RUN_ID", "tr-9"}};
}

TEST(ClusterEnvironment, NothingIsASingleProcess) {
  const Environment env = detect_environment({{"HOME", "/root"}, {"PATH", "/bin"}});
  // describe() names the starter, rank, world size, local rank and size, and
  // node: this one line checks all six.
  EXPECT_EQ(env.describe(), "rank 0 of 1 (local 0 of 1, node 0), started by single");
  EXPECT_FALSE(env.pmix);
  EXPECT_FALSE(env.store.has_value());
  EXPECT_EQ(env.token, "");
  EXPECT_EQ(env.run_id, "");
}

TEST(ClusterEnvironment, LauncherFullSet) {
  const Environment env = detect_environment(launcher_vars());
  EXPECT_EQ(env.describe(), "rank 3 of 8 (local 3 of 4, node 0), started by dtrain-launch");
  EXPECT_EQ(env.store, "node1:29500");
  EXPECT_EQ(env.token, "secret");
  EXPECT_EQ(env.run_id, "run-7");
  EXPECT_EQ(env.restart, 2);
  EXPECT_FALSE(env.pmix);
}

TEST(ClusterEnvironment, LauncherMinimalSetDefaultsToOneNode) {
  const Environment env = detect_environment({{"DTRAIN_RANK", "2"}, {"DTRAIN_WORLD_SIZE", "4"}});
  EXPECT_EQ(env.starter, Starter::launcher);
  EXPECT_EQ(env.local_rank, 2);
  EXPECT_EQ(env.local_world_size, 4);
  EXPECT_EQ(env.node_rank, 0);
  EXPECT_EQ(env.restart, 0);
  EXPECT_FALSE(env.store.has_value());
}

TEST(ClusterEnvironment, LauncherIgnoresMpiAndSlurmVariables) {
  // `srun dtrain-launch` hands its workers srun's SLURM_* as well.
  const EnvMap vars = with(with(launcher_vars(), srun_vars()),
                           {{"PMIX_RANK", "0"}, {"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}});
  const Environment env = detect_environment(vars);
  EXPECT_EQ(env.starter, Starter::launcher);
  EXPECT_EQ(env.rank, 3);
  EXPECT_EQ(env.world_size, 8);
  EXPECT_FALSE(env.pmix);
  EXPECT_EQ(env.run_id, "run-7");
  EXPECT_EQ(env.slurm_job_id, "");
  EXPECT_EQ(env.slurm_step_nodelist, "");
}

TEST(ClusterEnvironment, LauncherWithoutWorldSizeNamesIt) {
  EXPECT_THAT(env_error({{"DTRAIN_RANK", "0"}}),
              AllOf(HasSubstr("DTRAIN_WORLD_SIZE is not"), HasSubstr("DTRAIN_RANK is set"),
                    HasSubstr("dtrain-launch")));
}

TEST(ClusterEnvironment, LayoutVariableWithoutRankIsAPartialSet) {
  for (const char* name : {"DTRAIN_WORLD_SIZE", "DTRAIN_LOCAL_RANK", "DTRAIN_LOCAL_WORLD_SIZE",
                           "DTRAIN_NODE_RANK", "DTRAIN_RESTART"}) {
    EXPECT_THAT(env_error({{name, "1"}}),
                AllOf(HasSubstr(std::string(name) + " is set"), HasSubstr("DTRAIN_RANK is not")))
        << name;
  }
  // Also under mpirun: a stale export must not pass silently.
  EnvMap vars = mpirun_vars();
  vars["DTRAIN_WORLD_SIZE"] = "8";
  EXPECT_THAT(env_error(vars), HasSubstr("DTRAIN_RANK is not"));
}

TEST(ClusterEnvironment, LauncherLocalPairMustComeTogether) {
  EXPECT_THAT(
      env_error({{"DTRAIN_RANK", "0"}, {"DTRAIN_WORLD_SIZE", "2"}, {"DTRAIN_LOCAL_RANK", "0"}}),
      AllOf(HasSubstr("DTRAIN_LOCAL_RANK is set"), HasSubstr("DTRAIN_LOCAL_WORLD_SIZE is not")));
  EXPECT_THAT(
      env_error(
          {{"DTRAIN_RANK", "0"}, {"DTRAIN_WORLD_SIZE", "2"}, {"DTRAIN_LOCAL_WORLD_SIZE", "2"}}),
      AllOf(HasSubstr("DTRAIN_LOCAL_WORLD_SIZE is set"), HasSubstr("DTRAIN_LOCAL_RANK is not")));
}

TEST(ClusterEnvironment, EmptyValuesCountAsUnset) {
  const Environment env = detect_environment({{"DTRAIN_RANK", ""}, {"DTRAIN_STORE", ""}});
  EXPECT_EQ(env.starter, Starter::single);
  EXPECT_FALSE(env.store.has_value());
}

TEST(ClusterEnvironment, MalformedIntegersNameVariableAndValue) {
  EXPECT_THAT(env_error(with(launcher_vars(), {{"DTRAIN_RANK", "3x"}})),
              AllOf(HasSubstr("DTRAIN_RANK='3x'"), HasSubstr("not an integer")));
  EXPECT_THAT(env_error(with(launcher_vars(), {{"DTRAIN_WORLD_SIZE", " 8"}})), HasSubstr("DTRAIN_WORLD_SIZE=' 8'"));
  EXPECT_THAT(env_error(with(launcher_vars(), {{"DTRAIN_RESTART", "99999999999"}})),
              AllOf(HasSubstr("DTRAIN_RESTART='99999999999'"), HasSubstr("out of range")));
  EXPECT_THAT(env_error(with(mpirun_vars(), {{"OMPI_COMM_WORLD_LOCAL_SIZE", "four"}})),
              HasSubstr("OMPI_COMM_WORLD_LOCAL_SIZE='four'"));
  EXPECT_THAT(env_error(with(srun_vars(), {{"SLURM_LOCALID", "1.0"}})), HasSubstr("SLURM_LOCALID='1.0'"));
  EXPECT_THAT(env_error(with(srun_vars(), {{"PMIX_RANK", "-"}})), HasSubstr("PMIX_RANK='-'"));
}

TEST(ClusterEnvironment, RanksOutOfRangeNameTheVariables) {
  EXPECT_THAT(env_error(with(launcher_vars(), {{"DTRAIN_RANK", "8"}})),
              AllOf(HasSubstr("DTRAIN_RANK=8 is outside 0..7"), HasSubstr("DTRAIN_WORLD_SIZE=8")));
  EXPECT_THAT(env_error(with(launcher_vars(), {{"DTRAIN_RANK", "-1"}})), HasSubstr("DTRAIN_RANK=-1 is outside"));
  EXPECT_THAT(env_error(with(launcher_vars(), {{"DTRAIN_WORLD_SIZE", "0"}, {"DTRAIN_RANK", "0"}})),
              HasSubstr("DTRAIN_WORLD_SIZE=0 must be at least 1"));
  EXPECT_THAT(env_error(with(launcher_vars(), {{"DTRAIN_LOCAL_RANK", "4"}})),
              AllOf(HasSubstr("DTRAIN_LOCAL_RANK=4 is outside 0..3"), HasSubstr("DTRAIN_LOCAL_WORLD_SIZE=4")));
  EXPECT_THAT(env_error(with(launcher_vars(), {{"DTRAIN_LOCAL_WORLD_SIZE", "9"}})),
              HasSubstr("DTRAIN_LOCAL_WORLD_SIZE=9 must be between 1 and"));
  EXPECT_THAT(env_error(with(launcher_vars(), {{"DTRAIN_NODE_RANK", "-2"}})),
              HasSubstr("DTRAIN_NODE_RANK=-2 must not be negative"));
  EXPECT_THAT(env_error(with(launcher_vars(), {{"DTRAIN_RESTART", "-1"}})),
              HasSubstr("DTRAIN_RESTART=-1 must not be negative"));
  EXPECT_THAT(env_error(with(mpirun_vars(), {{"OMPI_COMM_WORLD_RANK", "9"}})),
              AllOf(HasSubstr("OMPI_COMM_WORLD_RANK=9"), HasSubstr("mpirun")));
}

TEST(ClusterEnvironment, StoreAddressIsValidated) {
  EnvMap vars = launcher_vars();
  vars["DTRAIN_STORE"] = "[::1]:29500";
  EXPECT_EQ(detect_environment(vars).store, "[::1]:29500");
  for (const char* bad : {"node1", "node1:", ":29500", "node1:0", "node1:65536", "node1:29x",
                          "::1:29500", "[::1]29500", "[::1", "[]:1", "no de:1", "a]:1"}) {
    vars["DTRAIN_STORE"] = bad;
    EXPECT_THAT(env_error(vars),
                AllOf(HasSubstr(std::string("DTRAIN_STORE='") + bad + "'"), HasSubstr("host:port")))
        << bad;
  }
}

// dtrain-launch --rdzv-backend etcd gives workers etcd's endpoints.
TEST(ClusterEnvironment, StoreMayBeAnEtcdEndpointList) {
  EnvMap vars = launcher_vars();
  vars["DTRAIN_STORE"] = "etcd://e1:2379,[::1]:2380,e3";
  EXPECT_EQ(detect_environment(vars).store, "etcd://e1:2379,[::1]:2380,e3");
  const std::vector<HostPort> endpoints = parse_etcd_endpoints(*detect_environment(vars).store, "DTRAIN_STORE");
  ASSERT_EQ(endpoints.size(), 3u);
  EXPECT_EQ(endpoints[1].host, "::1");
  EXPECT_EQ(endpoints[1].port, 2380);
  EXPECT_EQ(endpoints[2].port, 2379);
  EXPECT_EQ(etcd_address(endpoints), "etcd://e1:2379,[::1]:2380,e3:2379");
  for (const char* bad : {"etcd://", "etcd://e1:2379,", "etcd://e1:x", "etcd://e1:0"}) {
    vars["DTRAIN_STORE"] = bad;
    EXPECT_THAT(env_error(vars), HasSubstr(std::string("DTRAIN_STORE='") + bad + "'")) << bad;
  }
}

TEST(ClusterEnvironment, ParseHostPort) {
  const HostPort v4 = parse_host_port("10.0.0.1:29500", "X");
  EXPECT_EQ(v4.host, "10.0.0.1");
  EXPECT_EQ(v4.port, 29500);
  const HostPort v6 = parse_host_port("[fd42:1::2]:1", "X");
  EXPECT_EQ(v6.host, "fd42:1::2");
  EXPECT_EQ(v6.port, 1);
  EXPECT_EQ(parse_host_port("node-01.cluster:65535", "X").host, "node-01.cluster");
  EXPECT_THAT([] { parse_host_port("::1:80", "MY_VAR"); },
              ::testing::ThrowsMessage<Error>(
                  AllOf(HasSubstr("MY_VAR='::1:80'"), HasSubstr("needs brackets"))));
}

TEST(ClusterEnvironment, MpirunWithoutPmix) {
  const Environment env = detect_environment(mpirun_vars());
  EXPECT_EQ(env.describe(), "rank 5 of 8 (local 1 of 4, node 1), started by mpirun");
  EXPECT_FALSE(env.pmix);
}

TEST(ClusterEnvironment, MpirunWithPmix) {
  EnvMap vars = mpirun_vars();
  vars["PMIX_RANK"] = "5";
  EXPECT_TRUE(detect_environment(vars).pmix);
}

TEST(ClusterEnvironment, MpirunPmixConflictNamesBoth) {
  EnvMap vars = mpirun_vars();
  vars["PMIX_RANK"] = "4";
  EXPECT_THAT(env_error(vars), AllOf(HasSubstr("PMIX_RANK=4"), HasSubstr("OMPI_COMM_WORLD_RANK=5"),
                                     HasSubstr("disagree")));
}

TEST(ClusterEnvironment, MpirunNeedsSize) {
  EXPECT_THAT(env_error({{"OMPI_COMM_WORLD_RANK", "0"}}),
              AllOf(HasSubstr("OMPI_COMM_WORLD_SIZE is not"), HasSubstr("mpirun")));
}

TEST(ClusterEnvironment, MpirunWithoutLocalVariablesDefaultsToOneNode) {
  const Environment env =
      detect_environment({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}});
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, 2);
  EXPECT_EQ(env.node_rank, 0);
}

TEST(ClusterEnvironment, MpirunHonoursUserRunVariables) {
  EnvMap vars = mpirun_vars();
  vars["DTRAIN_STORE"] = "head:29400";
  vars["DTRAIN_TOKEN"] = "t";
  vars["SLURM_JOB_ID"] = "77";  // mpirun inside a Slurm allocation
  const Environment env = detect_environment(vars);
  EXPECT_EQ(env.store, "head:29400");
  EXPECT_EQ(env.token, "t");
  EXPECT_EQ(env.run_id, "77");
  EXPECT_EQ(env.slurm_job_id, "");  // Slurm facts only under srun
  vars["DTRAIN_RUN_ID"] = "mine";
  EXPECT_EQ(detect_environment(vars).run_id, "mine");
}

TEST(ClusterEnvironment, MpirunWinsOverSlurm) {
  EXPECT_EQ(detect_environment(with(srun_vars(), mpirun_vars())).starter, Starter::mpirun);
}

TEST(ClusterEnvironment, SrunWithoutPmix) {
  const Environment env = detect_environment(srun_vars());
  EXPECT_EQ(env.describe(), "rank 5 of 7 (local 0 of 2, node 2), started by srun");
  EXPECT_FALSE(env.pmix);
  EXPECT_EQ(env.slurm_job_id, "1234");
  EXPECT_EQ(env.slurm_step_id, "0");
  EXPECT_EQ(env.slurm_step_nodelist, "n[01-03]");
  EXPECT_EQ(env.run_id, "1234");
  // The store: rank 0's node (the step's first) on the job and step's port.
  EXPECT_EQ(env.store, "n01:" + std::to_string(slurm_store_port("1234", "0")));
  EXPECT_TRUE(env.store_from_slurm);
}

TEST(ClusterEnvironment, SrunWithPmix) {
  EnvMap vars = srun_vars();
  vars["PMIX_RANK"] = "5";
  EXPECT_TRUE(detect_environment(vars).pmix);
  vars["PMIX_RANK"] = "0";
  EXPECT_THAT(env_error(vars), AllOf(HasSubstr("PMIX_RANK=0"), HasSubstr("SLURM_PROCID=5")));
}

TEST(ClusterEnvironment, SrunStepVariablesWinOverJobVariables) {
  // A step smaller than its job: srun -n2 inside an allocation of 8.
  EnvMap vars = {{"SLURM_PROCID", "1"},
                 {"SLURM_STEPID", "3"},
                 {"SLURM_NTASKS", "8"},
                 {"SLURM_STEP_NUM_TASKS", "2"},
                 {"SLURM_LOCALID", "1"},
                 {"SLURM_NODEID", "0"},
                 {"SLURM_TASKS_PER_NODE", "4(x2)"},
                 {"SLURM_STEP_TASKS_PER_NODE", "2"},
                 {"SLURM_JOB_NODELIST", "n[1-2]"},
                 {"SLURM_JOBID", "55"}};
  const Environment env = detect_environment(vars);
  EXPECT_EQ(env.world_size, 2);
  EXPECT_EQ(env.local_world_size, 2);
  EXPECT_EQ(env.slurm_step_id, "3");
  EXPECT_EQ(env.slurm_step_nodelist, "n[1-2]");  // falls back to the job's list
  EXPECT_EQ(env.slurm_job_id, "55");
  EXPECT_EQ(env.run_id, "55");
}

TEST(ClusterEnvironment, SrunJobLevelVariablesAlone) {
  EnvMap vars = srun_vars();
  vars.erase("SLURM_STEP_NUM_TASKS");
  vars.erase("SLURM_STEP_TASKS_PER_NODE");
  vars["SLURM_TASKS_PER_NODE"] = "2(x2),3";
  vars["SLURM_NTASKS"] = "7";
  vars["SLURM_PROCID"] = "6";
  vars["SLURM_LOCALID"] = "2";
  const Environment env = detect_environment(vars);
  EXPECT_EQ(env.world_size, 7);
  EXPECT_EQ(env.local_world_size, 3);
}

TEST(ClusterEnvironment, SrunTasksPerNodeForEachNode) {
  const int expected[] = {2, 2, 2, 1};
  for (int node = 0; node < 4; ++node) {
    EnvMap vars = {{"SLURM_PROCID", "0"},
                   {"SLURM_STEP_ID", "0"},
                   {"SLURM_NTASKS", "7"},
                   {"SLURM_LOCALID", "0"},
                   {"SLURM_NODEID", std::to_string(node)},
                   {"SLURM_STEP_TASKS_PER_NODE", "2(x3),1"}};
    EXPECT_EQ(detect_environment(vars).local_world_size, expected[node]) << node;
  }
}

TEST(ClusterEnvironment, SrunWithoutTasksPerNodeIsOneTaskPerNode) {
  EnvMap vars = srun_vars();
  vars.erase("SLURM_STEP_TASKS_PER_NODE");
  vars.erase("SLURM_TASKS_PER_NODE");
  EXPECT_EQ(detect_environment(vars).local_world_size, 1);
  vars["SLURM_LOCALID"] = "1";
  EXPECT_THAT(env_error(vars),
              AllOf(HasSubstr("SLURM_LOCALID=1"), HasSubstr("SLURM_STEP_TASKS_PER_NODE"),
                    HasSubstr("SLURM_TASKS_PER_NODE")));
}

TEST(ClusterEnvironment, SrunBadTasksPerNodeNamesTheVariable) {
  EnvMap vars = srun_vars();
  vars["SLURM_STEP_TASKS_PER_NODE"] = "2(x";
  EXPECT_THAT(env_error(vars), AllOf(HasSubstr("SLURM_STEP_TASKS_PER_NODE"), HasSubstr("'2(x'")));
  vars["SLURM_STEP_TASKS_PER_NODE"] = "3,2";  // node 2 is not listed
  EXPECT_THAT(env_error(vars), AllOf(HasSubstr("SLURM_NODEID=2"), HasSubstr("'3,2'"),
                                     HasSubstr("no task on that node")));
  vars["SLURM_STEP_TASKS_PER_NODE"] = "3,2,0";
  EXPECT_THAT(env_error(vars), AllOf(HasSubstr("SLURM_NODEID=2"), HasSubstr("no task")));
  vars["SLURM_STEP_TASKS_PER_NODE"] = "3,2,8";  // more tasks on a node than in the step
  EXPECT_THAT(env_error(vars), HasSubstr("SLURM_STEP_TASKS_PER_NODE[node 2]=8 must be between 1"));
}

TEST(ClusterEnvironment, SrunMissingTaskCountNamesBoth) {
  EnvMap vars = srun_vars();
  vars.erase("SLURM_NTASKS");
  vars.erase("SLURM_STEP_NUM_TASKS");
  EXPECT_THAT(env_error(vars), AllOf(HasSubstr("SLURM_STEP_NUM_TASKS"), HasSubstr("SLURM_NTASKS")));
}

TEST(ClusterEnvironment, SrunMissingLocalOrNodeIdNamesIt) {
  EnvMap vars = srun_vars();
  vars.erase("SLURM_LOCALID");
  EXPECT_THAT(env_error(vars), HasSubstr("SLURM_LOCALID is not"));
  vars = srun_vars();
  vars.erase("SLURM_NODEID");
  EXPECT_THAT(env_error(vars), HasSubstr("SLURM_NODEID is not"));
}

TEST(ClusterEnvironment, SrunRankOutOfRange) {
  EnvMap vars = srun_vars();
  vars["SLURM_PROCID"] = "7";
  EXPECT_THAT(env_error(vars), AllOf(HasSubstr("SLURM_PROCID=7 is outside 0..6"),
                                     HasSubstr("SLURM_STEP_NUM_TASKS=7"), HasSubstr("srun")));
}

TEST(ClusterEnvironment, SrunHonoursUserStore) {
  EnvMap vars = srun_vars();
  vars["DTRAIN_STORE"] = "n01:29500";
  vars["DTRAIN_RUN_ID"] = "exp1";
  const Environment env = detect_environment(vars);
  EXPECT_EQ(env.store, "n01:29500");
  EXPECT_FALSE(env.store_from_slurm);
  EXPECT_EQ(env.run_id, "exp1");
  EXPECT_EQ(env.slurm_job_id, "1234");
}

TEST(ClusterEnvironment, BatchScriptWithoutStepIsSingle) {
  // sbatch runs the script as task 0 of the allocation, outside any srun step.
  EnvMap vars = srun_vars();
  vars.erase("SLURM_STEP_ID");
  vars["SLURM_NTASKS"] = "8";
  const Environment env = detect_environment(vars);
  EXPECT_EQ(env.starter, Starter::single);
  EXPECT_EQ(env.world_size, 1);
  EXPECT_EQ(env.rank, 0);
  EXPECT_EQ(env.run_id, "1234");
  EXPECT_EQ(env.slurm_job_id, "");
}

TEST(ClusterEnvironment, SingleHonoursUserRunVariables) {
  const Environment env = detect_environment(
      {{"DTRAIN_STORE", "localhost:1"}, {"DTRAIN_TOKEN", "x"}, {"DTRAIN_RUN_ID", "r"}});
  EXPECT_EQ(env.starter, Starter::single);
  EXPECT_EQ(env.store, "localhost:1");
  EXPECT_EQ(env.token, "x");
  EXPECT_EQ(env.run_id, "r");
}

TEST(ClusterEnvironment, TorchrunFullSet) {
  const Environment env = detect_environment(torchrun_vars());
  EXPECT_EQ(env.describe(), "rank 3 of 4 (local 1 of 2, node 1), started by torchrun");
  EXPECT_EQ(env.store, "node0:29500");  // rank 0 hosts it
  EXPECT_EQ(env.restart, 1);
  EXPECT_EQ(env.run_id, "tr-9");
  EXPECT_FALSE(env.store_from_slurm || env.pmix);
}

TEST(ClusterEnvironment, TorchrunStorePortAvoidsTheAgentsOwnStore) {
  EnvMap vars = torchrun_vars();
  vars["TORCHELASTIC_USE_AGENT_STORE"] = "True";  // torchrun's agent serves PyTorch's store on MASTER_PORT
  EXPECT_EQ(detect_environment(vars).store, "node0:29501");
  vars["DTRAIN_STORE_PORT"] = "31000";
  EXPECT_EQ(detect_environment(vars).store, "node0:31000");
  vars["DTRAIN_STORE"] = "other:1";
  EXPECT_EQ(detect_environment(vars).store, "other:1");
  vars = torchrun_vars();
  vars["MASTER_ADDR"] = "fd42:1::1";
  EXPECT_EQ(detect_environment(vars).store, "[fd42:1::1]:29500");
  vars["MASTER_PORT"] = "70000";
  EXPECT_THAT(env_error(vars), HasSubstr("MASTER_PORT=70000 must be a port"));
}

TEST(ClusterEnvironment, TorchrunPartialSetsNameTheVariables) {
  EXPECT_THAT(env_error({{"RANK", "0"}}), AllOf(HasSubstr("RANK is set but WORLD_SIZE is not"), HasSubstr("torchrun")));
  EXPECT_THAT(env_error({{"LOCAL_RANK", "0"}}), HasSubstr("LOCAL_RANK is set but RANK is not"));
  EXPECT_THAT(env_error({{"WORLD_SIZE", "2"}}), HasSubstr("WORLD_SIZE is set but RANK is not"));
  EXPECT_THAT(env_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}}),
              AllOf(HasSubstr("MASTER_ADDR and MASTER_PORT are not"), HasSubstr("DTRAIN_STORE")));
  EXPECT_THAT(env_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}}),
              HasSubstr("MASTER_ADDR is set but MASTER_PORT is not"));
  EXPECT_THAT(env_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}, {"MASTER_ADDR", "h"},
                         {"MASTER_PORT", "1"}}),
              HasSubstr("LOCAL_RANK is set but LOCAL_WORLD_SIZE is not"));
  EXPECT_THAT(env_error({{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}}),
              HasSubstr("RANK=2 is outside 0..1 (WORLD_SIZE=2)"));
  // A world of one needs no store; MASTER_ADDR alone (exported for srun jobs) starts nothing.
  EXPECT_EQ(detect_environment({{"RANK", "0"}, {"WORLD_SIZE", "1"}}).starter, Starter::torchrun);
  EXPECT_EQ(detect_environment({{"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}}).starter, Starter::single);
}

TEST(ClusterEnvironment, PrecedenceLauncherThenTorchrunThenMpirunThenSrun) {
  const EnvMap vars = with(with(with(srun_vars(), mpirun_vars()), {{"PMIX_RANK", "5"}}), torchrun_vars());
  // torchrun started by srun or mpirun: its workers inherit the agent's placement, which is not theirs.
  Environment env = detect_environment(vars);
  EXPECT_EQ(env.starter, Starter::torchrun);
  EXPECT_EQ(env.rank, 3);
  EXPECT_FALSE(env.pmix);
  // dtrain-launch sets both families; its own wins.
  env = detect_environment(with(vars, launcher_vars()));
  EXPECT_EQ(env.starter, Starter::launcher);
  EXPECT_EQ(env.store, "node1:29500");
  EXPECT_EQ(env.restart, 2);
}

TEST(ClusterEnvironment, StarterNames) {
  EXPECT_STREQ(starter_name(Starter::single), "single");
  EXPECT_STREQ(starter_name(Starter::launcher), "dtrain-launch");
  EXPECT_STREQ(starter_name(Starter::torchrun), "torchrun");
  EXPECT_STREQ(starter_name(Starter::mpirun), "mpirun");
  EXPECT_STREQ(starter_name(Starter::slurm), "srun");
}

TEST(ClusterEnvironment, ProcessEnvironmentReadsEnviron) {
  ASSERT_EQ(setenv("DTRAIN_TEST_ENV_PROBE", "a=b", 1), 0);
  const EnvMap vars = process_environment();
  unsetenv("DTRAIN_TEST_ENV_PROBE");
  ASSERT_EQ(vars.count("DTRAIN_TEST_ENV_PROBE"), 1u);
  EXPECT_EQ(vars.at("DTRAIN_TEST_ENV_PROBE"), "a=b");
  EXPECT_THAT(vars, Not(::testing::Contains(::testing::Key(""))));
}

}  // namespace
}  // namespace dtrain::cluster
