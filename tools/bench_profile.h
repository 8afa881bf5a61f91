// `dtrain-bench train --profile`: the timed steps' kernel times
// (nn/cpu/kernel_profile.h) as a table, per step: ms, share of the step,
// calls, and GFLOP/s (GEMMs) or GB/s (the rest), then what no kernel timed.
#pragma once

#include <ostream>

#include "nn/cpu/kernel_profile.h"

namespace dtrain::tools {

struct ProfileReport {
  int steps = 0;               // timed steps the profile covers
  double step_seconds = 0.0;   // their wall time, summed
  double gemm_peak_gflops = 0.0;
};

// Prints an aligned table (kinds that ran, longest first), then one
// `profile: <kind> ms_per_step=.. share=.. calls=.. gflops=..|gbps=..` line
// per kind in a fixed order and `profile: other ...` (step time less every
// kernel's) for scripts.
void print_profile(const nn::cpu::KernelProfile& profile, const ProfileReport& report, std::ostream& out);

}  // namespace dtrain::tools
