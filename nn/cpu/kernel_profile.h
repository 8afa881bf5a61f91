// nn::cpu::KernelProfile: where a step's time goes on the CPU, kernel by
// kernel (dtrain-bench train --profile). Every kernel the host runs opens a
// KernelTimer of its kind: HostDevice::run for the kernel set's layers and
// the device's copies, waits and engine kernels, and inside them each GEMM,
// bias gradient and attention pass. A timer adds its time, less the
// time of the timers opened inside it, to its kind's slot, so nested work
// counts once, in its own kind.
//
// Work: each timer also adds what it did: FLOPs for a GEMM (2*m*n*k*batch),
// bytes for the rest, counting every operand read once and every result
// written once (a read-modify-write both ways): the least traffic the kernel
// can have, so bytes / time is a lower bound of the bandwidth it reached.
//
// Cost: a timer on a thread with no profile is one thread-local load and a
// branch (no clock read); with one, two clock reads. Slots are fixed: timing
// allocates nothing.
//
// Threading: a profile is set per thread (set_thread_profile; HostDevice::
// set_profile sets it on the thread that runs the device's work) and only
// that thread writes it; read it once that thread's work is done. Work in an
// OpenMP region counts toward the timer of the thread that opened it; timers
// opened by the region's other threads record nothing, so a region that
// wants its parts seen tallies them per thread and credits the sum
// (KernelTimer::credit; attention's tile products do).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <string_view>

namespace dtrain::nn::cpu {

enum class KernelKind : int {
  gemm,                    // cpu::gemm: every matmul (work: FLOPs)
  bias_grad,               // a linear's bias gradient (the rows of dy summed)
  layernorm_forward,
  layernorm_backward,
  gelu_forward,
  gelu_backward,
  rmsnorm_forward,
  rmsnorm_backward,
  swiglu_forward,
  swiglu_backward,
  rotary_forward,          // the heads between the QKV projection and attention: rotation, grouped heads
  rotary_backward,
  attention_forward,       // attention's tile loop less its products: gathers, softmax, writes
  attention_backward,      // the same in backward: gathers, P from lse, softmax's backward, writes
  attention_decode,        // decode's attention over the key/value cache (work not counted)
  embedding_forward,       // tokens, or patches outside their GEMM; positions
  embedding_backward,
  mean_pool_forward,
  mean_pool_backward,
  cross_entropy_forward,
  cross_entropy_backward,
  dropout,
  residual,
  convert,                 // f32 <-> bf16/f16: activations to storage, the engine's copies
  add,                     // the engine's dst += src
  sum_of_squares,          // the gradient norm's
  adamw,
  copy,
  zero,
  comm_wait,               // the device waiting for a collective (Device::wait; work not counted)
};
inline constexpr int kKernelKinds = static_cast<int>(KernelKind::comm_wait) + 1;

inline constexpr std::array<std::string_view, kKernelKinds> kKernelKindNames = {
    "gemm", "bias_grad", "layernorm_forward", "layernorm_backward", "gelu_forward", "gelu_backward",
    "rmsnorm_forward", "rmsnorm_backward", "swiglu_forward", "swiglu_backward", "rotary_forward",
    "rotary_backward", "attention_forward", "attention_backward", "attention_decode", "embedding_forward",
    "embedding_backward", "mean_pool_forward", "mean_pool_backward", "cross_entropy_forward",
    "cross_entropy_backward", "dropout", "residual", "convert", "add", "sum_of_squares", "adamw", "copy",
    "zero", "comm_wait"};

inline std::string_view kernel_kind_name(KernelKind kind) { return kKernelKindNames[static_cast<int>(kind)]; }

// One kind's totals: time outside nested timers, calls, and FLOPs or bytes.
struct KernelTotals {
  double seconds = 0.0;
  std::int64_t calls = 0;
  double work = 0.0;
};

class KernelTimer;

class KernelProfile {
 public:
  const KernelTotals& operator[](KernelKind kind) const { return totals_[static_cast<int>(kind)]; }
  // Clears every slot. REQUIRES: no timer of this profile is open.
  void reset() { totals_ = {}; }

 private:
  friend class KernelTimer;
  std::array<KernelTotals, kKernelKinds> totals_{};
  KernelTimer* innermost_ = nullptr;  // the open timer that nested ones report to
};

// Sets the profile the calling thread's timers add to (null: none); returns
// the previous one. The profile must outlive its use on the thread.
KernelProfile* set_thread_profile(KernelProfile* profile);

namespace detail {
extern constinit thread_local KernelProfile* thread_profile;
}

// Times the enclosing scope as one `kind` kernel doing `work` (FLOPs for a
// GEMM, bytes otherwise) into the calling thread's profile, if it has one.
class KernelTimer {
 public:
  KernelTimer(KernelKind kind, double work) : profile_(detail::thread_profile) {
    if (profile_ != nullptr) start(kind, work);
  }
  ~KernelTimer() {
    if (profile_ != nullptr) stop();
  }
  KernelTimer(const KernelTimer&) = delete;
  KernelTimer& operator=(const KernelTimer&) = delete;

  // Adds work the threads of an OpenMP region did (their calls and work,
  // and their time summed over threads divided by the team size: the wall
  // time it stands for) to the calling thread's profile, if any, as nested
  // in its innermost open timer.
  static void credit(KernelKind kind, double seconds, std::int64_t calls, double work);

 private:
  using Clock = std::chrono::steady_clock;
  void start(KernelKind kind, double work);
  void stop();

  KernelProfile* profile_;
  KernelKind kind_ = KernelKind::gemm;
  double work_ = 0.0;
  Clock::time_point start_;
  Clock::duration nested_{};  // time of the timers opened inside this one
  KernelTimer* outer_ = nullptr;
};

}  // namespace dtrain::nn::cpu
