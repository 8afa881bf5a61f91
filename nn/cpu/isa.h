// Which instruction sets dtrain's CPU kernels use on this machine: the CPU's
// own features, capped by the ISA oneDNN dispatches to. oneDNN's cap
// (ONEDNN_MAX_CPU_ISA=AVX2, say) therefore caps dtrain's own choices too, so
// one variable makes an AVX-512 machine run every path an AVX2-only machine
// runs (scripts/test.sh does, for its capped rerun).
//
// The build's baseline (core/cpu.h) is AVX2 and FMA; code for more is
// compiled per function (GCC target attributes) and called only where
// cpu_isa() says so. Thread-safe: asked once.
#pragma once

#include <string>

namespace dtrain::nn::cpu {

struct CpuIsa {
  bool avx2_fma = false;     // AVX2 and FMA
  bool avx512 = false;       // AVX-512 F, BW, VL, DQ (oneDNN's avx512_core)
  bool avx512_bf16 = false;  // AVX512_BF16: bf16 conversions and dot products
  bool amx = false;          // AMX tiles (bf16, int8)
  // oneDNN's name for the ISA it dispatches to: "avx2", "avx512_core_bf16", ...
  std::string onednn;
};

const CpuIsa& cpu_isa();

// The ISA as the kernels use it (capped or not): "avx2 fma", "avx512",
// "avx512 avx512_bf16 amx"; "below avx2" where neither applies.
std::string cpu_isa_name();

// Which kernels run f32 products: "oneDNN avx512_core_bf16", or "dtrain
// avx2_gemm (linear layers) + oneDNN avx2 (the rest)" (DTRAIN_CPU_GEMM).
std::string gemm_kernel_name();

// One line for benchmark headers and logs: the CPU's model, cpu_isa_name(),
// the build's baseline and gemm_kernel_name().
std::string cpu_summary();

}  // namespace dtrain::nn::cpu
