#include "nn/cpu/kernel_profile.h"

namespace dtrain::nn::cpu {

namespace detail {
constinit thread_local KernelProfile* thread_profile = nullptr;
}

KernelProfile* set_thread_profile(KernelProfile* profile) {
  KernelProfile* previous = detail::thread_profile;
  detail::thread_profile = profile;
  return previous;
}

void KernelTimer::start(KernelKind kind, double work) {
  kind_ = kind;
  work_ = work;
  outer_ = profile_->innermost_;
  profile_->innermost_ = this;
  start_ = Clock::now();
}

void KernelTimer::stop() {
  const Clock::duration elapsed = Clock::now() - start_;
  KernelTotals& t = profile_->totals_[static_cast<int>(kind_)];
  t.seconds += std::chrono::duration<double>(elapsed - nested_).count();
  t.calls += 1;
  t.work += work_;
  if (outer_ != nullptr) outer_->nested_ += elapsed;
  profile_->innermost_ = outer_;
}

void KernelTimer::credit(KernelKind kind, double seconds, std::int64_t calls, double work) {
  KernelProfile* profile = detail::thread_profile;
  if (profile == nullptr) return;
  KernelTotals& t = profile->totals_[static_cast<int>(kind)];
  t.seconds += seconds;
  t.calls += calls;
  t.work += work;
  if (profile->innermost_ != nullptr) {
    profile->innermost_->nested_ += std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  }
}

}  // namespace dtrain::nn::cpu
