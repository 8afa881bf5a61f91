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

}  // namespace dtrain::nn::cpu
