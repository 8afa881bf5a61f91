// `dtrain-bench train --profile`: the timed steps' kernel times
// (nn/cpu/kernel_profile.h) as a table, per step: ms, share of the step,
// calls, and GFLOP/s (GEMMs) or GB/s (the rest), then what no kernel timed,
// and the ceiling the other kernels leave: the MFU the step would have with
// every GEMM at the GEMM peak and the rest as measured.
#pragma once

#include <ostream>

#include "nn/cpu/kernel_profile.h"

namespace dtrain::tools {

struct ProfileReport {
  int steps = 0;               // timed steps the profile covers
  double step_seconds = 0.0;   // their wall time, summed
  double gemm_peak_gflops = 0.0;
  double model_flops = 0.0;    // per step, of the tokens this profile's steps train (0: no ceiling)
};

// Prints an aligned table (kinds that ran, longest first), then one
// `profile: <kind> ms_per_step=.. share=.. calls=.. gflops=..|gbps=..` line
// per kind in a fixed order, `profile: other ...` (step time less every
// kernel's) and, given the model's FLOPs and the peak, `profile: ceiling
// step_ms=.. mfu=..` (every GEMM's FLOPs at the peak plus the rest of the
// step as measured; mfu = model_flops / (gemm FLOPs + peak x the rest)) for
// scripts.
void print_profile(const nn::cpu::KernelProfile& profile, const ProfileReport& report, std::ostream& out);

}  // namespace dtrain::tools
