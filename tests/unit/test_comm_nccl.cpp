// The nccl backend (in the CUDA plugin, loaded as the worker loads it) at
// world size 1 on the first GPU: every collective and dtype against
// closed-form results on device buffers (nn/cuda_device.h, so this test
// links no CUDA), and the fences between a device and the collectives: the
// collective waits for its ready fence on the GPU, the device for its done
// fence. Skips, saying why, where the plugin or a GPU is missing. Runs
// everywhere: without a GPU, or for a device past the visible ones, the
// error says why.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/connect.h"
#include "comm/memory_store.h"
#include "core/error.h"
#include "core/plugin.h"
#include "nn/cuda_device.h"
#include "support/collective_checks.h"

namespace dtrain {
namespace {

using namespace std::chrono_literals;

std::unique_ptr<comm::Communicator> nccl_world_of_one() {
  auto store = std::make_shared<comm::MemoryStore>();
  comm::CommunicatorOptions options;
  options.timeout = 60s;
  options.store = store;
  return std::make_unique<comm::Communicator>(comm::make_nccl_backend(0, 1, store, 0, options.timeout), options);
}

class CommNccl : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (cuda_device_count(&why) == 0) GTEST_SKIP() << "no GPU for nccl: " << why;
    gpu_ = nn::make_cuda_device(0, 60s);
    comm_ = nccl_world_of_one();
  }
  std::unique_ptr<nn::Device> gpu_;
  std::unique_ptr<comm::Communicator> comm_;
};

TEST_F(CommNccl, WorldOfOneOnDeviceBuffers) {
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    for (std::size_t count : {std::size_t{1}, std::size_t{1009}, std::size_t{1} << 20}) {
      const std::size_t bytes = count * dtype_size(dtype);
      std::vector<std::uint8_t> host(bytes), back(bytes);
      for (std::size_t i = 0; i < count; ++i) testing::store_value(host.data(), dtype, i, testing::input_value(0, i));
      nn::DeviceArray<std::uint8_t> data(*gpu_, bytes), gathered(*gpu_, bytes);
      gpu_->copy(data.data(), host.data(), bytes);
      gpu_->synchronize();
      for (comm::ReduceOp op : {comm::ReduceOp::sum, comm::ReduceOp::avg, comm::ReduceOp::max}) {
        comm_->allreduce(data.data(), count, dtype, op).wait();
      }
      comm_->broadcast(data.data(), count, dtype, 0).wait();
      comm_->allgather(data.data(), gathered.data(), count, dtype).wait();
      comm_->reduce_scatter(gathered.data(), gathered.data(), count, dtype, comm::ReduceOp::sum).wait();
      comm_->barrier().wait();
      gpu_->copy(back.data(), gathered.data(), bytes);
      gpu_->synchronize();
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < count; ++i) {
        wrong += testing::load_value(back.data(), dtype, i) != testing::rounded(testing::input_value(0, i), dtype);
      }
      EXPECT_EQ(wrong, 0u) << dtype_name(dtype) << " x " << count;
    }
  }
}

// Queued without a host wait: the device's copy in, the collective after its
// ready fence, the device's copy out after the collective's done fence.
TEST_F(CommNccl, CollectivesAndTheDeviceWaitForEachOthersFences) {
  const std::size_t count = std::size_t{1} << 24;
  std::vector<float> host(count);
  for (std::size_t i = 0; i < count; ++i) host[i] = static_cast<float>(i % 1000);
  nn::HostArray<float> in(*gpu_, count), out(*gpu_, count);
  std::copy(host.begin(), host.end(), in.data());
  nn::DeviceArray<float> data(*gpu_, count), gathered(*gpu_, count);
  gpu_->copy(data.data(), in.data(), in.bytes());
  comm::Work work = comm_->allgather(data.data(), gathered.data(), count, DType::f32, gpu_->fence());
  FencePtr done = work.done_fence();
  ASSERT_NE(done, nullptr);
  EXPECT_NE(done->cuda_event(), nullptr);  // the device waits for it on the GPU
  gpu_->wait(done);
  gpu_->copy(out.data(), gathered.data(), gathered.bytes());
  gpu_->synchronize();
  work.wait();
  EXPECT_TRUE(std::equal(host.begin(), host.end(), out.data()));
}

// Runs on every machine: without the plugin or a GPU the error says so; with
// GPUs, a device index past the visible ones is named.
TEST(CommNcclErrors, WithoutAGpuTheErrorSaysWhy) {
  std::string why;
  const int count = cuda_device_count(&why);
  try {
    comm::make_nccl_backend(0, 1, std::make_shared<comm::MemoryStore>(), count, 1s);
    FAIL() << "nccl backend on a device that does not exist";
  } catch (const ConfigError& e) {  // no plugin
    EXPECT_FALSE(plugin_available(kCudaPlugin, nullptr)) << e.what();
    EXPECT_EQ(e.field(), "parallel.backend");
    EXPECT_NE(std::string(e.what()).find(kCudaPlugin), std::string::npos) << e.what();
  } catch (const CommError& e) {
    const std::string what = e.what();
    if (count == 0) {
      EXPECT_NE(what.find("needs a CUDA device"), std::string::npos) << what;
    } else {
      EXPECT_NE(what.find(fmt::format("CUDA device {}, but {} device(s) are visible", count, count)),
                std::string::npos)
          << what;
    }
  }
}

}  // namespace
}  // namespace dtrain
