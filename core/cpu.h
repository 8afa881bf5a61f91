// What CPU this process runs on, and the instruction-set baseline the build
// assumes (cmake: DTRAIN_CPU_BASELINE, x86-64-v3 unless DTRAIN_CPU_NATIVE).
//
// Every binary linking dtrain_core checks the baseline before any other code
// runs (a constructor in core/cpu.cpp, which is itself compiled for plain
// x86-64): a CPU without it gets one line naming what is missing and how to
// rebuild, instead of an illegal-instruction crash somewhere later.
// Thread-safe: answers are computed once.
#pragma once

#include <string>

namespace dtrain {

// The processor's model name as the kernel reports it ("AMD EPYC 7B13"), or
// "unknown CPU" where /proc/cpuinfo has none.
const std::string& cpu_model_name();

// The -march the project's code was compiled for ("x86-64-v3", "native").
const char* cpu_build_baseline();

// Empty when this CPU runs code built for cpu_build_baseline(); else what is
// missing and what to do.
std::string cpu_baseline_problem();

}  // namespace dtrain
