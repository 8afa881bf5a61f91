#include "nn/cpu/isa.h"

#include <initializer_list>
#include <utility>

#include <dnnl.hpp>
#include <fmt/format.h>

#include "core/cpu.h"
#include "nn/cpu/gemm_avx2.h"

namespace dtrain::nn::cpu {
namespace {

// oneDNN's ISA values are bit sets, each level holding the bits of those below.
bool onednn_has(dnnl::cpu_isa effective, dnnl::cpu_isa level) {
  const auto bits = static_cast<unsigned>(level);
  return (static_cast<unsigned>(effective) & bits) == bits;
}

std::string onednn_name(dnnl::cpu_isa effective) {
  using isa = dnnl::cpu_isa;
  for (const auto& [level, name] : std::initializer_list<std::pair<isa, const char*>>{
           {isa::avx512_core_amx, "avx512_core_amx"},
           {isa::avx512_core_bf16, "avx512_core_bf16"},
           {isa::avx512_core_vnni, "avx512_core_vnni"},
           {isa::avx512_core, "avx512_core"},
           {isa::avx2_vnni, "avx2_vnni"},
           {isa::avx2, "avx2"},
           {isa::avx, "avx"},
           {isa::sse41, "sse41"}}) {
    if (onednn_has(effective, level)) return name;
  }
  return "none";
}

}  // namespace

const CpuIsa& cpu_isa() {
  static const CpuIsa isa = [] {
    using level = dnnl::cpu_isa;
    const level effective = dnnl::get_effective_cpu_isa();
    CpuIsa i;
    i.avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                 onednn_has(effective, level::avx2);
    i.avx512 = i.avx2_fma && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
               onednn_has(effective, level::avx512_core);
    i.avx512_bf16 =
        i.avx512 && __builtin_cpu_supports("avx512bf16") && onednn_has(effective, level::avx512_core_bf16);
    i.amx = i.avx512_bf16 && __builtin_cpu_supports("amx-tile") && __builtin_cpu_supports("amx-bf16") &&
            onednn_has(effective, level::avx512_core_amx);
    i.onednn = onednn_name(effective);
    return i;
  }();
  return isa;
}

std::string cpu_isa_name() {
  const CpuIsa& i = cpu_isa();
  std::string isa = i.avx512 ? "avx512" : i.avx2_fma ? "avx2 fma" : "below avx2";
  if (i.avx512_bf16) isa += " avx512_bf16";
  if (i.amx) isa += " amx";
  return isa;
}

std::string gemm_kernel_name() {
  const std::string& onednn = cpu_isa().onednn;
  return avx2_gemm_preferred() ? fmt::format("dtrain avx2_gemm (linear layers) + oneDNN {} (the rest)", onednn)
                               : fmt::format("oneDNN {}", onednn);
}

std::string cpu_summary() {
  return fmt::format("{}; isa {}; build {}; gemm {}", cpu_model_name(), cpu_isa_name(), cpu_build_baseline(),
                     gemm_kernel_name());
}

}  // namespace dtrain::nn::cpu
