// dtrain-launch: starts, supervises and restarts the workers of a job on this
// node (docs/launcher.md). Exit codes (core/exit_codes.h): 0 every worker
// finished; 1 the job failed (summary printed); 2 the launcher could not do
// its job (usage, store, rendezvous); 128+N stopped on signal N.
#include <iostream>
#include <string>
#include <vector>

#include "cluster/environment.h"
#include "core/command_line.h"
#include "core/exit_codes.h"
#include "launcher/agent.h"
#include "launcher/options.h"

int main(int argc, char** argv) {
  namespace launcher = dtrain::launcher;
  return dtrain::run_main("dtrain-launch", [&] {
    launcher::install_launcher_signals();
    std::string message;  // --help, --version
    launcher::LaunchOptions options =
        launcher::parse_command_line(std::vector<std::string>(argv, argv + argc), &message);
    if (!message.empty()) {
      std::cout << message;
      return dtrain::kExitOk;
    }
    const dtrain::cluster::EnvMap env = dtrain::cluster::process_environment();
    launcher::resolve_options(options, env, launcher::detect_node_resources(env));
    launcher::Console console;
    launcher::Agent agent(std::move(options), env, console);
    return agent.run();
  });
}
