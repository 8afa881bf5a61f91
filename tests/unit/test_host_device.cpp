// The CPU as an nn::Device (nn/cpu/host_device.h) and the fences between a
// device and collectives (core/fence.h, comm::Op::ready, Work::done_fence):
//   - the plain device runs everything inline and hands out no fences;
//   - the queued device runs work in submission order behind the caller, a
//     fence is reached exactly when the work before it ran, and a kernel's
//     failure skips what follows and is rethrown by synchronize();
//   - a collective given a ready fence reads its buffer only once the fence
//     is reached; a queue waiting on a collective's done fence runs after it;
//   - bounded waits: a fence never reached fails the collective with a
//     TimeoutError; a device wait that cannot end is a TimeoutError.
#include <atomic>
#include <chrono>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/error.h"
#include "nn/cpu/host_device.h"
#include "support/thread_ranks.h"

namespace dtrain {
namespace {

using namespace std::chrono_literals;
using nn::cpu::HostDevice;
using nn::cpu::HostDeviceOptions;

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
