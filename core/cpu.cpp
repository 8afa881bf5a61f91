#include "core/cpu.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "core/exit_codes.h"
#include "dtrain/config.h"

// This file is compiled for plain x86-64 (core/CMakeLists.txt): it must run on
// the CPUs the rest of the build cannot.

namespace dtrain {

const std::string& cpu_model_name() {
  static const std::string name = [] {
    std::ifstream in("/proc/cpuinfo");
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("model name", 0) != 0) continue;
      const std::size_t colon = line.find(':');
      if (colon == std::string::npos) break;
      const std::size_t first = line.find_first_not_of(" \t", colon + 1);
      return first == std::string::npos ? std::string("unknown CPU") : line.substr(first);
    }
    return std::string("unknown CPU");
  }();
  return name;
}

const char* cpu_build_baseline() { return DTRAIN_CPU_BASELINE; }

std::string cpu_baseline_problem() {
  const std::string baseline = DTRAIN_CPU_BASELINE;
  // Before main(), libgcc's own constructor may not have filled in what
  // __builtin_cpu_supports reads yet. It takes literals. "native": a binary
  // for the machine that built it, which is its builder's to place.
  __builtin_cpu_init();
  if (baseline == "x86-64-v3" && !__builtin_cpu_supports("x86-64-v3")) {
    return "this build of dtrain needs a CPU with AVX2, FMA, F16C and BMI2 (x86-64-v3), and this one (" +
           cpu_model_name() + ") lacks them";
  }
  if (baseline == "x86-64-v4" && !__builtin_cpu_supports("x86-64-v4")) {
    return "this build of dtrain needs a CPU with AVX-512 (x86-64-v4), and this one (" + cpu_model_name() +
           ") lacks it; rebuild with scripts/build.sh -DDTRAIN_CPU_BASELINE=x86-64-v3";
  }
  return {};
}

}  // namespace dtrain

// Runs before every C++ static initialiser (priority 101), in every binary
// that links dtrain_core (its link options name this symbol, so the linker
// always takes this file): nothing compiled for the baseline has run yet.
// Before main() nothing can catch an exception, so this prints and ends the
// process itself, with dtrain's exit code for an error it names.
extern "C" __attribute__((constructor(101))) void dtrain_check_cpu_baseline() {
  const std::string problem = dtrain::cpu_baseline_problem();
  if (problem.empty()) return;
  std::fprintf(stderr, "dtrain: error: %s\n", problem.c_str());
  std::_Exit(dtrain::kExitError);
}
