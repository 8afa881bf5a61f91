#include "tools/bench_profile.h"

#include <algorithm>
#include <string>
#include <vector>

#include <fmt/format.h>

namespace dtrain::tools {
namespace {

using nn::cpu::KernelKind;
using nn::cpu::KernelTotals;

struct Row {
  KernelKind kind = KernelKind::gemm;
  double ms = 0.0;        // per step
  double share = 0.0;     // of the step
  double calls = 0.0;     // per step
  double rate = 0.0;      // GFLOP/s (gemm) or GB/s; 0 when the kind counts no work
};

std::vector<Row> rows_of(const nn::cpu::KernelProfile& profile, const ProfileReport& r) {
  std::vector<Row> rows;
  for (int k = 0; k < nn::cpu::kKernelKinds; ++k) {
    const auto kind = static_cast<KernelKind>(k);
    const KernelTotals& t = profile[kind];
    if (t.calls == 0) continue;
    Row row;
    row.kind = kind;
    row.ms = 1e3 * t.seconds / r.steps;
    row.share = r.step_seconds > 0.0 ? t.seconds / r.step_seconds : 0.0;
    row.calls = static_cast<double>(t.calls) / r.steps;
    row.rate = t.seconds > 0.0 ? t.work / t.seconds / 1e9 : 0.0;
    rows.push_back(row);
  }
  return rows;
}

bool counts_flops(KernelKind kind) { return kind == KernelKind::gemm; }

std::string rate_columns(const Row& row) {
  if (row.rate <= 0.0) return fmt::format("{:>10} {:>10}", "-", "-");
  return counts_flops(row.kind) ? fmt::format("{:>10.1f} {:>10}", row.rate, "-")
                                : fmt::format("{:>10} {:>10.2f}", "-", row.rate);
}

std::string rate_fields(const Row& row, double peak) {
  if (row.rate <= 0.0) return "";
  if (!counts_flops(row.kind)) return fmt::format(" gbps={:.3f}", row.rate);
  std::string s = fmt::format(" gflops={:.2f}", row.rate);
  if (peak > 0.0) s += fmt::format(" of_peak={:.3f}", row.rate / peak);
  return s;
}

}  // namespace

void print_profile(const nn::cpu::KernelProfile& profile, const ProfileReport& r, std::ostream& out) {
  std::vector<Row> rows = rows_of(profile, r);
  double kernel_ms = 0.0;
  for (const Row& row : rows) kernel_ms += row.ms;
  const double step_ms = 1e3 * r.step_seconds / r.steps;
  const double other_ms = step_ms - kernel_ms;
  const double other_share = step_ms > 0.0 ? other_ms / step_ms : 0.0;

  out << fmt::format("kernel profile: {} timed steps, per step; GFLOP/s counts 2*m*n*k*batch (GEMM peak {:.1f}), "
                     "GB/s every operand read once and every result written once\n",
                     r.steps, r.gemm_peak_gflops);
  std::vector<Row> by_time = rows;
  std::stable_sort(by_time.begin(), by_time.end(), [](const Row& a, const Row& b) { return a.ms > b.ms; });
  out << fmt::format("{:<24} {:>10} {:>7} {:>8} {:>10} {:>10}\n", "kernel", "ms/step", "share", "calls",
                     "GFLOP/s", "GB/s");
  for (const Row& row : by_time) {
    out << fmt::format("{:<24} {:>10.3f} {:>7.3f} {:>8g} {}\n", nn::cpu::kernel_kind_name(row.kind), row.ms,
                       row.share, row.calls, rate_columns(row));
  }
  out << fmt::format("{:<24} {:>10.3f} {:>7.3f}\n", "other (not in a kernel)", other_ms, other_share);
  out << fmt::format("{:<24} {:>10.3f} {:>7.3f}\n", "step", step_ms, step_ms > 0.0 ? 1.0 : 0.0);
  for (const Row& row : rows) {
    out << fmt::format("profile: {} ms_per_step={:.4f} share={:.4f} calls={:g}{}\n",
                       nn::cpu::kernel_kind_name(row.kind), row.ms, row.share, row.calls,
                       rate_fields(row, r.gemm_peak_gflops));
  }
  out << fmt::format("profile: other ms_per_step={:.4f} share={:.4f}\n", other_ms, other_share);
  if (r.model_flops > 0.0 && r.gemm_peak_gflops > 0.0) {
    const KernelTotals& gemm = profile[KernelKind::gemm];
    const double gemm_ms = 1e3 * gemm.seconds / r.steps, gemm_flops = gemm.work / r.steps;
    const double ceiling_ms = 1e3 * gemm_flops / (r.gemm_peak_gflops * 1e9) + (step_ms - gemm_ms);
    const double mfu = 1e3 * r.model_flops / ceiling_ms / (r.gemm_peak_gflops * 1e9);
    out << fmt::format("{:<24} {:>10.3f} {:>7} (every GEMM at the peak, the rest as measured: MFU {:.3f})\n",
                       "step at the GEMM peak", ceiling_ms, "", mfu);
    out << fmt::format("profile: ceiling step_ms={:.4f} mfu={:.4f}\n", ceiling_ms, mfu);
  }
}

}  // namespace dtrain::tools
