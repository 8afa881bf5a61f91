// The CUDA device (nn/cuda/cuda_device.h) through the plugin, as the trainer
// and dtrain-bench reach it (nn/cuda_device.h; this test links no CUDA):
//   - everywhere: asking for a GPU that is not there (no plugin, no GPU, or
//     an index past the visible ones) is a ConfigError naming `device` and
//     what is missing;
//   - on a GPU (skipped otherwise, with the reason): zero-filled memory and
//     ordered copies, the engine's kernels against the host device (exact,
//     or within 1e-6 relative where sums run in another order or the host
//     fuses multiply-adds), fences (a
//     CUDA event, reused only once dropped; another stream's fence waited
//     for on the GPU, a host fence on the host, bounded by the timeout) and
//     errors that name the device.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/plugin.h"
#include "nn/adamw.h"
#include "nn/cpu/host_device.h"
#include "nn/cuda_device.h"

namespace dtrain::nn {
namespace {

using namespace std::chrono_literals;

TEST(CudaDeviceConfig, AMissingGpuIsAConfigErrorNamingDevice) {
  std::string why;
  const int count = cuda_device_count(&why);
  try {
    make_cuda_device(count, 1s);  // one past the visible ones
    FAIL() << "a device past the visible ones";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.field(), "device");
    const std::string what = e.what();
    if (!plugin_available(kCudaPlugin, nullptr)) {
      EXPECT_NE(what.find(kCudaPlugin), std::string::npos) << what;
    } else if (count == 0) {
      EXPECT_NE(what.find("cuda needs a GPU"), std::string::npos) << what;
    } else {
      EXPECT_NE(what.find(fmt::format("cuda:{} does not exist", count)), std::string::npos) << what;
    }
  }
}

class CudaDevice : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (cuda_device_count(&why) == 0) GTEST_SKIP() << "no GPU for device cuda: " << why;
    gpu_ = make_cuda_device(0, 5s);
  }

  template <class T>
  std::vector<T> download(const DeviceArray<T>& a) {
    std::vector<T> out(a.size());
    gpu_->copy(out.data(), a.data(), a.bytes());
    gpu_->synchronize();
    return out;
  }
  template <class T>
  DeviceArray<T> upload(const std::vector<T>& v) {
    DeviceArray<T> a(*gpu_, v.size());
    gpu_->copy(a.data(), v.data(), a.bytes());
    return a;
  }

  std::unique_ptr<Device> gpu_;
};

std::vector<float> random_floats(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

TEST_F(CudaDevice, MemoryIsZeroedAndCopiesRunInOrder) {
  EXPECT_EQ(gpu_->name(), "cuda:0");
  EXPECT_FALSE(gpu_->host_memory());
  EXPECT_TRUE(gpu_->asynchronous());
  DeviceArray<float> a(*gpu_, 1 << 20), b(*gpu_, 1 << 20);
  EXPECT_EQ(download(a), std::vector<float>(1 << 20, 0.0f));
  HostArray<float> pinned(*gpu_, 1 << 20);
  const std::vector<float> values = random_floats(1 << 20, 1);
  std::copy(values.begin(), values.end(), pinned.data());
  gpu_->copy(a.data(), pinned.data(), a.bytes());  // host -> device -> device -> host, queued in order
  gpu_->copy(b.data(), a.data(), a.bytes());
  gpu_->zero(a.data(), a.bytes() / 2);
  EXPECT_EQ(download(b), values);
  const std::vector<float> half = download(a);
  EXPECT_EQ(half[0], 0.0f);
  EXPECT_EQ(half.back(), values.back());
}

TEST_F(CudaDevice, EngineKernelsMatchTheHostDevice) {
  cpu::HostDevice host;
  const std::size_t n = 100003;
  const std::vector<float> x = random_floats(n, 2), g = random_floats(n, 3), m0 = random_floats(n, 4);
  for (DType half : {DType::bf16, DType::f16}) {
    std::vector<std::uint16_t> h(n);
    std::vector<float> widened(x), gpu_widened(x);
    host.to_half(x.data(), h.data(), half, static_cast<std::int64_t>(n));
    host.to_f32(h.data(), half, widened.data(), static_cast<std::int64_t>(n), true);
    DeviceArray<float> dx = upload(x), dw = upload(x);
    DeviceArray<std::uint16_t> dh(*gpu_, n);
    gpu_->to_half(dx.data(), dh.data(), half, static_cast<std::int64_t>(n));
    gpu_->to_f32(dh.data(), half, dw.data(), static_cast<std::int64_t>(n), true);
    EXPECT_EQ(download(dh), h) << dtype_name(half);
    EXPECT_EQ(download(dw), widened) << dtype_name(half);
  }
  // add, sum of squares and AdamW with a clipping factor.
  std::vector<float> p(x), sum(x), m(m0), v(n, 0.5f);
  double total = 0.25;
  host.add(sum.data(), g.data(), static_cast<std::int64_t>(n));
  host.sum_of_squares(sum.data(), static_cast<std::int64_t>(n), &total);
  const AdamWHyper hyper{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f};
  host.adamw(p.data(), g.data(), m.data(), v.data(), static_cast<std::int64_t>(n), hyper, 0.1f, 7, 0.5f);
  DeviceArray<float> dp = upload(x), dsum = upload(x), dg = upload(g), dm = upload(m0);
  DeviceArray<float> dv = upload(std::vector<float>(n, 0.5f));
  DeviceArray<double> dtotal = upload(std::vector<double>{0.25});
  gpu_->add(dsum.data(), dg.data(), static_cast<std::int64_t>(n));
  gpu_->sum_of_squares(dsum.data(), static_cast<std::int64_t>(n), dtotal.data());
  gpu_->adamw(dp.data(), dg.data(), dm.data(), dv.data(), static_cast<std::int64_t>(n), hyper, 0.1f, 7, 0.5f);
  EXPECT_EQ(download(dsum), sum);
  EXPECT_NEAR(download(dtotal)[0], total, 1e-6 * total);
  // The host compiler may fuse multiply-adds the GPU kernel keeps apart: an ulp or two.
  const std::vector<std::pair<std::vector<float>, std::vector<float>>> updated{
      {download(dp), p}, {download(dm), m}, {download(dv), v}};
  for (const auto& [got, want] : updated) {
    for (std::size_t i = 0; i < n; ++i) ASSERT_NEAR(got[i], want[i], 1e-6f * std::fabs(want[i]) + 1e-7f) << i;
  }
}

// An event returns to the pool when its last fence is dropped, never earlier.
TEST_F(CudaDevice, FencesAreEventsReusedOnlyOnceDropped) {
  FencePtr first = gpu_->fence();
  ASSERT_NE(first, nullptr);
  const void* event = first->cuda_event();
  ASSERT_NE(event, nullptr);
  FencePtr second = gpu_->fence();
  EXPECT_NE(second->cuda_event(), event);  // held: not recorded again
  gpu_->synchronize();
  EXPECT_TRUE(first->wait_until(Fence::Clock::now()));
  first.reset();
  FencePtr third = gpu_->fence();
  EXPECT_EQ(third->cuda_event(), event);
}

// Another stream's fence is waited for on the GPU: a copy queued after the
// wait sees what the other stream wrote before its fence.
TEST_F(CudaDevice, WaitsForAnotherStreamsFenceOnTheGpu) {
  std::unique_ptr<Device> other = make_cuda_device(0, 5s);
  const std::vector<float> values = random_floats(1 << 22, 5);
  DeviceArray<float> src = upload(values), mid(*other, values.size()), out(*gpu_, values.size());
  gpu_->synchronize();
  other->copy(mid.data(), src.data(), src.bytes());
  gpu_->wait(other->fence());
  gpu_->copy(out.data(), mid.data(), mid.bytes());
  EXPECT_EQ(download(out), values);
}

// A host fence (a CPU collective's) is waited for on the host, within the timeout.
TEST_F(CudaDevice, WaitsForAHostFenceOnTheHost) {
  struct Flag final : Fence {
    std::atomic<bool> set{false};
    bool wait_until(Clock::time_point deadline) const override {
      while (!set) {
        if (Clock::now() >= deadline) return false;
        std::this_thread::sleep_for(1ms);
      }
      return true;
    }
  };
  auto flag = std::make_shared<Flag>();
  std::thread setter([&] {
    std::this_thread::sleep_for(50ms);
    flag->set = true;
  });
  gpu_->wait(flag);
  setter.join();
  std::unique_ptr<Device> quick = make_cuda_device(0, 100ms);
  EXPECT_THROW(quick->wait(std::make_shared<Flag>()), TimeoutError);
}

TEST_F(CudaDevice, ErrorsNameTheDeviceAndKeepCudasText) {
  try {
    gpu_->allocate(std::size_t{1} << 52);  // 4 PiB
    FAIL() << "allocated 4 PiB";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("cuda:0"), std::string::npos) << what;
    EXPECT_NE(what.find("cudaMalloc"), std::string::npos) << what;
    EXPECT_NE(what.find("cudaErrorMemoryAllocation"), std::string::npos) << what;
  }
  DeviceArray<float> still_works(*gpu_, 16);  // the error was cleared
  EXPECT_EQ(download(still_works), std::vector<float>(16, 0.0f));
}

}  // namespace
}  // namespace dtrain::nn
