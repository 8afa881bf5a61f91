// A rank of a multi-process collective test. Reads who it is from the
// environment (dtrain-launch variables set by the test, or mpirun), connects
// the chosen backend and then, by mode:
//   default      runs every closed-form case of tests/support/collective_checks.h
//   --hang-rank R  rank R never joins the first collective (the others must time out)
//   --loop       every rank loops over large allreduces (the test stops one)
//   --die-rank R --die-after-ms T  as --loop, and rank R kills itself with
//                SIGKILL after T ms
// Prints `wrong_total: N`; exits 0 when every check passed, 1 on wrong
// results, 2 on a dtrain::Error (printed with its type).
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <iostream>
#include <thread>

#include <CLI/CLI.hpp>

#include "cluster/environment.h"
#include "comm/connect.h"
#include "core/error.h"
#include "core/process.h"
#include "support/collective_checks.h"

namespace {

struct Options {
  std::string backend = "gloo";
  int timeout_ms = 20000;
  bool large = false;
  int hang_rank = -1;
  int die_rank = -1;
  int die_after_ms = 300;
  bool loop = false;
};

const char* error_kind(const std::exception& e) {
  if (dynamic_cast<const dtrain::TimeoutError*>(&e) != nullptr) return "TimeoutError";
  if (dynamic_cast<const dtrain::CommError*>(&e) != nullptr) return "CommError";
  return "Error";
}

int run(const Options& o, dtrain::comm::OpenedStore& opened) {
  using namespace dtrain;
  const cluster::Environment env = cluster::detect_environment(cluster::process_environment());
  const comm::Duration timeout(o.timeout_ms);
  opened = comm::open_store(env, timeout);
  comm::ConnectOptions copts;
  copts.backend = o.backend;
  copts.timeout = timeout;
  copts.store = opened.store;
  auto comm = comm::connect(env, copts);
  std::size_t wrong = 0;
  if (o.hang_rank >= 0) {
    if (comm->rank() == o.hang_rank) {
      std::this_thread::sleep_for(3 * timeout);  // never arrives; killed by the test or mpirun
      return 0;
    }
    std::vector<float> data(1024, 1.0f);
    comm->allreduce(data.data(), data.size(), DType::f32, comm::ReduceOp::sum).wait();
  } else if (o.loop || o.die_rank >= 0) {
    if (comm->rank() == o.die_rank) {
      std::thread([ms = o.die_after_ms] {
        std::this_thread::sleep_for(std::chrono::milliseconds(ms));
        ::kill(::getpid(), SIGKILL);
      }).detach();
    }
    std::vector<float> data(std::size_t{4} << 20, 1.0f);
    for (int i = 0; i < 100000; ++i) {
      comm->allreduce(data.data(), data.size(), DType::f32, comm::ReduceOp::max).wait();
    }
  } else {
    for (const auto& c : testing::collective_cases(comm->world_size(), o.large)) {
      const std::size_t w = testing::run_collective_case(*comm, c);
      if (w != 0) std::cerr << "rank " << comm->rank() << ": " << w << " wrong in " << c.describe() << "\n";
      wrong += w;
    }
    // Everyone agrees on the total.
    float total = static_cast<float>(wrong);
    comm->allreduce(&total, 1, DType::f32, comm::ReduceOp::sum).wait();
    wrong = static_cast<std::size_t>(total);
  }
  if (comm->rank() == 0) std::cout << "wrong_total: " << wrong << std::endl;
  return wrong == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  dtrain::configure_malloc_for_training();
  CLI::App app{"comm_conformance"};
  Options o;
  app.add_option("--backend", o.backend);
  app.add_option("--timeout-ms", o.timeout_ms);
  app.add_flag("--large", o.large);
  app.add_option("--hang-rank", o.hang_rank);
  app.add_option("--die-rank", o.die_rank);
  app.add_option("--die-after-ms", o.die_after_ms);
  app.add_flag("--loop", o.loop);
  CLI11_PARSE(app, argc, argv);
  dtrain::comm::OpenedStore opened;
  try {
    return run(o, opened);
  } catch (const dtrain::Error& e) {
    std::cerr << "comm_conformance: " << error_kind(e) << ": " << e.what() << std::endl;
    // The store lives in this process: keep it up while the other ranks
    // finish diagnosing the same failure.
    if (opened.server) std::this_thread::sleep_for(std::chrono::milliseconds(2500));
    // A broken communicator may hold a thread inside a library call: leave now.
    std::_Exit(2);
  }
}
