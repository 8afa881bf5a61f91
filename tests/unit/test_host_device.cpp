// The CPU as an nn::Device (nn/cpu/host_device.h) and the fences between a
// device and collectives (core/fence.h, comm::Op::ready, Work::done_fence):
//   - the plain device runs everything inline and hands out no fences;
//   - the queued device runs work in submission order behind the caller, a
//     fence is reached exactly when the work before it ran, and a kernel's
//     failure skips what follows and is rethrown by synchronize();
//   - a collective given a ready fence reads its buffer only once the fence
//     is reached; a queue waiting on a collective's done fence runs after it;
//   - bounded waits: a fence never reached fails the collective with a
//     TimeoutError; a device wait that cannot end is a TimeoutError;
//   - profiling (nn/cpu/kernel_profile.h): kernels are counted where they
//     run, nested ones once, in their own kind.
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/error.h"
#include "nn/cpu/host_device.h"
#include "nn/cpu/host_kernels.h"
#include "nn/cpu/kernel_profile.h"
#include "support/thread_ranks.h"

namespace dtrain {
namespace {

using namespace std::chrono_literals;
using nn::cpu::HostDevice;
using nn::cpu::HostDeviceOptions;
using nn::cpu::KernelKind;
using nn::cpu::KernelTimer;

// A fence that is reached when the test says so.
class ManualFence final : public Fence {
 public:
  bool wait_until(Clock::time_point deadline) const override {
    while (!reached_.load()) {
      if (Clock::now() > deadline) return false;
      std::this_thread::sleep_for(1ms);
    }
    return true;
  }
  void reach() { reached_.store(true); }

 private:
  std::atomic<bool> reached_{false};
};

TEST(HostDevice, PlainRunsInlineWithoutFences) {
  HostDevice dev;
  EXPECT_FALSE(dev.asynchronous());
  EXPECT_TRUE(dev.host_memory());
  nn::DeviceArray<float> a(dev, 4), b(dev, 4);
  EXPECT_EQ(a.data()[0], 0.0f);  // zero-filled
  for (int i = 0; i < 4; ++i) b.data()[i] = static_cast<float>(i + 1);
  dev.copy(a.data(), b.data(), b.bytes());
  EXPECT_EQ(a.data()[3], 4.0f);  // already done
  EXPECT_EQ(dev.fence(), nullptr);
  dev.add(a.data(), b.data(), 4);
  EXPECT_EQ(a.data()[2], 6.0f);
}

TEST(HostDevice, QueuedRunsInOrderBehindTheCallerAndFencesMarkPositions) {
  HostDevice dev(HostDeviceOptions{.queued = true, .delay = 1ms, .timeout = 10s});
  EXPECT_TRUE(dev.asynchronous());
  nn::DeviceArray<float> x(dev, 1), one(dev, 1);
  one.data()[0] = 1.0f;
  auto gate = std::make_shared<ManualFence>();
  dev.wait(gate);  // holds the queue until the test opens it
  for (int i = 0; i < 20; ++i) dev.add(x.data(), one.data(), 1);
  const FencePtr halfway = dev.fence();
  for (int i = 0; i < 20; ++i) dev.add(x.data(), one.data(), 1);
  ASSERT_NE(halfway, nullptr);
  EXPECT_FALSE(halfway->wait_until(Fence::Clock::now() + 20ms));
  EXPECT_EQ(x.data()[0], 0.0f) << "queued work ran before what it was queued behind";
  gate->reach();
  ASSERT_TRUE(halfway->wait_until(Fence::Clock::now() + 10s));
  EXPECT_GE(x.data()[0], 20.0f);
  dev.synchronize();
  EXPECT_EQ(x.data()[0], 40.0f);  // in order, none lost
}

TEST(HostDevice, AFailedKernelSkipsTheRestAndIsRethrown) {
  HostDevice dev(HostDeviceOptions{.queued = true, .timeout = 10s});
  nn::DeviceArray<float> x(dev, 1), one(dev, 1);
  one.data()[0] = 1.0f;
  dev.run([] { throw DataError("kernel failed here"); });
  dev.add(x.data(), one.data(), 1);
  EXPECT_THAT([&] { dev.synchronize(); }, ::testing::ThrowsMessage<DataError>(::testing::HasSubstr("kernel failed")));
  EXPECT_EQ(x.data()[0], 0.0f) << "work after a failure ran on inputs that are not what they should be";
}

TEST(HostDevice, AWaitThatCannotEndIsATimeoutError) {
  HostDevice dev(HostDeviceOptions{.queued = true, .timeout = 100ms});
  auto never = std::make_shared<ManualFence>();
  dev.wait(never);  // not reached before synchronize() gives up
  EXPECT_THROW(dev.synchronize(), TimeoutError);
  never->reach();  // lets the queue thread end
}

// The queue thread times what it runs; the caller's thread stays unprofiled,
// and only the work between set_profile(&p) and set_profile(nullptr) counts.
TEST(HostDevice, AQueuedDeviceTimesItsKernelsOnItsQueueThread) {
  HostDevice dev(HostDeviceOptions{.queued = true, .delay = 1ms});
  std::vector<float> a(64, 1.0f), b(64, 2.0f);
  nn::cpu::KernelProfile profile;
  dev.add(a.data(), b.data(), 64);
  dev.set_profile(&profile);
  dev.add(a.data(), b.data(), 64);
  dev.add(a.data(), b.data(), 64);
  dev.copy(b.data(), a.data(), 64 * sizeof(float));
  // A linear's backward: the dx and dW products and the bias gradient.
  nn::cpu::HostKernels<nn::cpu::F32Format> kernels(dev);
  std::vector<float> dy(4 * 3, 1.0f), x(4 * 2, 1.0f), w(3 * 2, 1.0f), dx(4 * 2), dw(3 * 2), db(3);
  kernels.linear_backward(dy.data(), dy.data(), x.data(), w.data(), dx.data(), dw.data(), db.data(), 4, 2, 3);
  { const KernelTimer on_the_caller(KernelKind::gemm, 1.0); }
  dev.set_profile(nullptr);
  dev.add(a.data(), b.data(), 64);
  dev.synchronize();
  EXPECT_EQ(profile[KernelKind::add].calls, 2);
  EXPECT_EQ(profile[KernelKind::add].work, 2 * 12.0 * 64) << "x and y read, x written: 12 bytes an element";
  EXPECT_EQ(profile[KernelKind::copy].calls, 1);
  EXPECT_EQ(profile[KernelKind::gemm].calls, 2) << "the caller's own timer is not the device's";
  EXPECT_EQ(profile[KernelKind::gemm].work, 2 * (2.0 * 4 * 2 * 3)) << "2*m*n*k each";
  EXPECT_EQ(profile[KernelKind::bias_grad].calls, 1);
  EXPECT_FLOAT_EQ(db[0], 4.0f) << "the timed kernels still ran";
}

// A timer inside another counts its time in its own kind and not again in
// the outer one's, so kinds never add up to more than the wall time.
TEST(KernelProfile, NestedTimersCountOnceInTheirOwnKind) {
  nn::cpu::KernelProfile profile;
  const auto start = std::chrono::steady_clock::now();
  nn::cpu::set_thread_profile(&profile);
  {
    const KernelTimer outer(KernelKind::embedding_forward, 100.0);
    const KernelTimer inner(KernelKind::gemm, 7.0);
    std::this_thread::sleep_for(5ms);
  }
  nn::cpu::set_thread_profile(nullptr);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  { const KernelTimer unprofiled(KernelKind::gemm, 1.0); }
  EXPECT_EQ(profile[KernelKind::embedding_forward].calls, 1);
  EXPECT_EQ(profile[KernelKind::embedding_forward].work, 100.0);
  EXPECT_EQ(profile[KernelKind::gemm].calls, 1);
  EXPECT_EQ(profile[KernelKind::gemm].work, 7.0);
  EXPECT_LE(profile[KernelKind::embedding_forward].seconds + profile[KernelKind::gemm].seconds, wall)
      << "the inner timer's sleep counted twice";
  profile.reset();
  EXPECT_EQ(profile[KernelKind::gemm].calls, 0);
}

TEST(DeviceFences, ACollectiveReadsItsInputOnlyOnceItsReadyFenceIsReached) {
  testing::run_gloo_ranks(2, 5s, [](comm::Communicator& comm) {
    float value = 0.0f;
    auto ready = std::make_shared<ManualFence>();
    comm::Work work = comm.allreduce(&value, 1, DType::f32, comm::ReduceOp::sum, ready);
    std::this_thread::sleep_for(50ms);
    EXPECT_FALSE(work.completed());
    value = static_cast<float>(comm.rank() + 1);  // produced after the collective was queued
    ready->reach();
    work.wait();
    EXPECT_EQ(value, 3.0f);
  });
}

TEST(DeviceFences, AFenceNeverReachedFailsTheCollectiveWithATimeout) {
  EXPECT_THROW(testing::run_gloo_ranks(1, 200ms,
                                       [](comm::Communicator& comm) {
                                         float value = 1.0f;
                                         comm.allreduce(&value, 1, DType::f32, comm::ReduceOp::sum,
                                                        std::make_shared<ManualFence>())
                                             .wait();
                                       }),
               TimeoutError);
}

TEST(DeviceFences, AQueueWaitingOnACollectiveRunsAfterIt) {
  testing::run_gloo_ranks(2, 5s, [](comm::Communicator& comm) {
    HostDevice dev(HostDeviceOptions{.queued = true, .timeout = 5s});
    nn::DeviceArray<float> value(dev, 1), seen(dev, 1);
    value.data()[0] = static_cast<float>(comm.rank() + 1);
    auto hold = std::make_shared<ManualFence>();
    comm::Work work = comm.allreduce(value.data(), 1, DType::f32, comm::ReduceOp::sum, hold);
    dev.wait(work.done_fence());
    dev.copy(seen.data(), value.data(), sizeof(float));
    std::this_thread::sleep_for(50ms);
    hold->reach();  // only now can the collective, then the copy, run
    dev.synchronize();
    EXPECT_EQ(seen.data()[0], 3.0f);
  });
}

}  // namespace
}  // namespace dtrain
