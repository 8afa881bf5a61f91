// dtrain-launch: starts, supervises and restarts the workers of a dtrain job
// on this node (docs/launcher.md). Exit codes: 0 every worker finished; 1 the
// job failed (summary printed); 2 the launcher could not do its job (usage,
// store, rendezvous); 128+N stopped on signal N.
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "cluster/environment.h"
#include "core/error.h"
#include "launcher/agent.h"
#include "launcher/options.h"

int main(int argc, char** argv) {
  namespace launcher = dtrain::launcher;
  try {
    launcher::install_launcher_signals();
    std::string help;
    launcher::LaunchOptions options = launcher::parse_command_line(std::vector<std::string>(argv, argv + argc), &help);
    if (!help.empty()) {
      std::cout << help;
      return 0;
    }
    const dtrain::cluster::EnvMap env = dtrain::cluster::process_environment();
    launcher::resolve_options(options, env);
    launcher::Console console;
    launcher::Agent agent(std::move(options), env, console);
    return agent.run();
  } catch (const dtrain::Error& e) {
    std::cerr << "dtrain-launch: error: " << e.what() << std::endl;
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "dtrain-launch: unexpected error: " << e.what() << std::endl;
    return 3;
  }
}
