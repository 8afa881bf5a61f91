// A real Slurm cluster on this machine, for tests: munged, slurmctld and one
// slurmd per fake node (n1, n2, ...: all at 127.0.0.1, each on its own port),
// every file under a fresh temporary directory, every port picked free.
// stop() (also run by the destructor) cancels the cluster's jobs and ends
// only its own daemons, by the pids in their pid files.
//
// The constructor sets SLURM_CONF in this process's environment, so that
// every Slurm command the test runs (run(), or any child) uses this cluster.
// Needs root and the slurm-wlm and munge packages; without them the cluster
// is unavailable and missing() says what is missing. When a daemon does not come up,
// failure() holds the reason and the tails of the daemons' logs, and the
// directory is kept for a closer look.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "support/processes.h"
#include "support/run_command.h"

namespace dtrain::testing {

class SlurmCluster {
 public:
  explicit SlurmCluster(int nodes = 2) : nodes_(nodes) {
    missing_ = missing_prerequisite();
    if (!missing_.empty()) return;
    claim_job_ids();
    // A port picked free can be taken by another process before a daemon
    // binds it ("Address already in use"): a start that fails stops what it
    // started and tries again in a fresh directory on new ports; the last
    // attempt's failure, with its logs, is the one reported.
    for (int attempt = 1; attempt <= kStartAttempts; ++attempt) {
      if (attempt > 1) {
        stop();
        std::error_code ec;
        std::filesystem::remove_all(dir_, ec);
        stopped_ = false;
      }
      make_dir();
      // Every client command this process starts talks to this cluster, never
      // to an enclosing job's.
      ::setenv("SLURM_CONF", (dir_ / "slurm.conf").c_str(), 1);
      for (const char* var : {"SLURM_JOB_ID", "SLURM_JOBID", "SLURM_STEP_ID", "SLURM_STEPID", "SLURM_PROCID",
                              "SLURM_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NTASKS"}) {
        ::unsetenv(var);
      }
      write_munge_key();
      write_config();
      failure_ = start_daemons();
      if (failure_.empty()) return;
    }
  }
  ~SlurmCluster() {
    stop();
    if (lock_fd_ >= 0) ::close(lock_fd_);
    if (failure_.empty() && !dir_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(dir_, ec);
    }
  }
  SlurmCluster(const SlurmCluster&) = delete;
  SlurmCluster& operator=(const SlurmCluster&) = delete;

  bool up() const { return missing_.empty() && failure_.empty(); }
  const std::string& missing() const { return missing_; }
  const std::string& failure() const { return failure_; }
  const std::filesystem::path& dir() const { return dir_; }
  int nodes() const { return nodes_; }

  // Runs `command` (a shell command line) with SLURM_CONF pointing at this
  // cluster, killed after `limit`.
  CommandResult run(const std::string& command, std::chrono::seconds limit) const {
    return run_command(fmt::format("timeout -s KILL {} bash -c {}", limit.count(), shell_quote(command)));
  }

  // 'text' for a shell, whatever it holds.
  static std::string shell_quote(const std::string& text) {
    std::string out = "'";
    for (const char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return out + "'";
  }

  // Cancels every job, waits for the queue to drain, then stops the daemons
  // (SIGTERM, SIGKILL after a grace period). Idempotent.
  void stop() {
    if (stopped_ || dir_.empty()) return;
    stopped_ = true;
    if (failure_.empty()) {
      run("scancel --user=root", std::chrono::seconds(10));
      wait_until([&] { return run("squeue -h", std::chrono::seconds(10)).output.empty(); }, std::chrono::seconds(20));
    }
    for (int n = 1; n <= nodes_; ++n) stop_daemon(dir_ / fmt::format("slurmd-n{}.pid", n), "slurmd");
    stop_daemon(dir_ / "slurmctld.pid", "slurmctld");
    stop_daemon(dir_ / "munged.pid", "munged");
  }

  // The last `lines` lines of each daemon log, for failure messages.
  std::string log_tails(int lines = 15) const {
    std::string out;
    for (const auto& entry : std::filesystem::directory_iterator(dir_ / "log")) {
      out += "---- " + entry.path().filename().string() + "\n";
      out += run_command(fmt::format("tail -n {} {}", lines, entry.path().string())).output;
    }
    return out;
  }

  // Polls `done` every 100 ms until it holds or `limit` passes.
  template <typename F>
  static bool wait_until(F done, std::chrono::milliseconds limit) {
    const auto until = std::chrono::steady_clock::now() + limit;
    for (;;) {
      if (done()) return true;
      if (std::chrono::steady_clock::now() > until) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }

 private:
  static constexpr int kStartAttempts = 3;

  static std::string missing_prerequisite() {
    if (::geteuid() != 0) return "the Slurm cluster tests run as root (slurmd runs jobs as any user)";
    for (const char* tool : {"munged", "slurmctld", "slurmd", "srun", "sbatch", "sinfo", "scontrol"}) {
      if (run_command(fmt::format("command -v {} >/dev/null", tool)).exit_code != 0) {
        return fmt::format("{} is not installed (packages slurm-wlm and munge; scripts/setup.sh installs them)", tool);
      }
    }
    return "";
  }

  void make_dir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "dtrain-slurm-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    dir_ = pattern;
    for (const char* sub : {"state", "log", "munge", "spool", "tmp"}) std::filesystem::create_directories(dir_ / sub);
    for (int n = 1; n <= nodes_; ++n) std::filesystem::create_directories(dir_ / "tmp" / fmt::format("n{}", n));
  }

  // Job ids of test clusters running at the same time must differ (mod 1000),
  // or the store ports srun-started workers derive from them collide, as two
  // real jobs with one id would. Each cluster holds a lock on one of 50 blocks
  // of 20 ids for its lifetime (the lock goes with the process).
  void claim_job_ids() {
    for (int block = 0; block < 50; ++block) {
      const auto path = std::filesystem::temp_directory_path() / fmt::format("dtrain-slurm-jobs-{}.lock", block);
      const int fd = ::open(path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
      if (fd >= 0 && ::flock(fd, LOCK_EX | LOCK_NB) == 0) {
        lock_fd_ = fd;
        first_job_id_ = 1 + 20 * block;
        return;
      }
      if (fd >= 0) ::close(fd);
    }
  }

  // munged wants a private key of at least 32 bytes; random bytes will do.
  void write_munge_key() const {
    const auto key = dir_ / "munge" / "key";
    std::ofstream out(key, std::ios::binary);
    std::random_device entropy;
    for (int i = 0; i < 1024 / 4; ++i) {
      const unsigned v = entropy();
      out.write(reinterpret_cast<const char*>(&v), sizeof v);
    }
    out.close();
    std::filesystem::permissions(key, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  }

  void write_config() {
    const std::string d = dir_.string();
    char name[256] = {};
    ::gethostname(name, sizeof name - 1);
    const std::string host = std::string(name).substr(0, std::string(name).find('.'));
    std::ofstream c(dir_ / "slurm.conf");
    c << "ClusterName=dtraintest\nFirstJobId=" << first_job_id_ << "\nSlurmctldHost=" << host << "\nSlurmctldPort=" << free_port()
      << "\nSlurmUser=root\nSlurmdUser=root\nAuthType=auth/munge\nCredType=cred/munge\n"
      // cred_expire also delays a requeued job's restart (120 s by default).
      << "AuthInfo=socket=" << d << "/munge/sock,cred_expire=5\n"
      << "StateSaveLocation=" << d << "/state\nSlurmdSpoolDir=" << d << "/spool/d-%n\n"
      << "SlurmctldPidFile=" << d << "/slurmctld.pid\nSlurmdPidFile=" << d << "/slurmd-%n.pid\n"
      << "SlurmctldLogFile=" << d << "/log/slurmctld.log\nSlurmdLogFile=" << d << "/log/slurmd-%n.log\n"
      << "TmpFS=" << d << "/tmp/%n\n"
      << "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nJobAcctGatherType=jobacct_gather/none\n"
      << "AccountingStorageType=accounting_storage/none\nSelectType=select/cons_tres\n"
      << "SelectTypeParameters=CR_Core\nMpiDefault=none\nReturnToService=2\nKillWait=5\n"
      // Start pending and requeued jobs within a second, not at the next 30-60 s pass.
      << "SchedulerParameters=bf_interval=1,sched_interval=1\nSlurmdParameters=config_overrides\n";
    for (int n = 1; n <= nodes_; ++n) {
      c << "NodeName=n" << n << " NodeHostname=" << host << " NodeAddr=127.0.0.1 Port=" << free_port()
        << " CPUs=2 RealMemory=1000\n";
    }
    c << "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n";
  }

  // "" when every node is idle; otherwise what went wrong.
  std::string start_daemons() {
    const std::string d = dir_.string();
    const std::string quiet = " </dev/null >>" + d + "/log/daemons.out 2>&1";
    if (run_command("munged --force --key-file=" + d + "/munge/key --socket=" + d + "/munge/sock --pid-file=" +
                    d + "/munged.pid --log-file=" + d + "/log/munged.log --seed-file=" + d + "/munge/seed" + quiet)
            .exit_code != 0) {
      return "munged did not start:\n" + log_tails();
    }
    if (run(std::string("slurmctld -i") + quiet, std::chrono::seconds(30)).exit_code != 0) {
      return "slurmctld did not start:\n" + log_tails();
    }
    for (int n = 1; n <= nodes_; ++n) {
      if (run(fmt::format("slurmd -N n{}", n) + quiet, std::chrono::seconds(30)).exit_code != 0) {
        return fmt::format("slurmd for n{} did not start:\n", n) + log_tails();
      }
    }
    const std::string idle = std::string("idle\n");
    std::string last;
    const bool ready = wait_until(
        [&] {
          last = run("sinfo -h -N -o %T | sort -u", std::chrono::seconds(10)).output;
          return last == idle;
        },
        std::chrono::seconds(30));
    if (!ready) return "the nodes did not become idle within 30 s (sinfo: " + last + "):\n" + log_tails();
    // A slurmd whose port was taken in the meantime logs it and goes on
    // without listening; the node can still look idle, and its tasks then
    // reach whatever holds the port (seen: another cluster's slurmd, which
    // refused the credential as replayed). Such a start failed too.
    for (int n = 1; n <= nodes_; ++n) {
      std::ifstream log(dir_ / "log" / fmt::format("slurmd-n{}.log", n));
      const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
      if (text.find("Unable to bind listen port") != std::string::npos) {
        return fmt::format("slurmd for n{} could not bind its port:\n", n) + log_tails();
      }
    }
    return "";
  }

  static bool alive(pid_t pid) { return ::kill(pid, 0) == 0; }

  // Ends the daemon whose pid `pid_file` holds, if that process still runs
  // and is still `name` (not some later process that reuses the pid).
  static void stop_daemon(const std::filesystem::path& pid_file, const std::string& name) {
    std::ifstream in(pid_file);
    long pid = 0;
    if (!(in >> pid) || pid <= 1) return;
    const auto p = static_cast<pid_t>(pid);
    std::string comm;
    std::getline(std::ifstream("/proc/" + std::to_string(p) + "/comm"), comm);
    if (comm != name || !alive(p)) return;
    ::kill(p, SIGTERM);
    if (!wait_until([&] { return !alive(p) || zombie(p); }, std::chrono::seconds(10))) ::kill(p, SIGKILL);
  }

  // A daemon reparented to this test process lingers as a zombie until reaped.
  static bool zombie(pid_t pid) {
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    std::getline(stat, line);
    const auto close = line.rfind(')');
    return close != std::string::npos && close + 2 < line.size() && line[close + 2] == 'Z';
  }

  int nodes_;
  std::filesystem::path dir_;
  std::string missing_;
  std::string failure_;
  bool stopped_ = false;
  int lock_fd_ = -1;
  int first_job_id_ = 1;
};

}  // namespace dtrain::testing
