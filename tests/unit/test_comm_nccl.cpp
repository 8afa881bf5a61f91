// The nccl backend at world size 1 on the first GPU: every collective and
// dtype against closed-form results, device buffers. Skips, saying why, where
// dtrain was built without CUDA or no GPU is present.
#include <gtest/gtest.h>

#include "comm/connect.h"
#include "comm/memory_store.h"
#include "dtrain/config.h"
#include "support/collective_checks.h"
#if DTRAIN_HAVE_CUDA
#include <cuda_runtime.h>

#include "comm/nccl/backend.h"
#endif

namespace dtrain {
namespace {

#if DTRAIN_HAVE_CUDA
std::unique_ptr<comm::Communicator> nccl_world_of_one() {
  auto store = std::make_shared<comm::MemoryStore>();
  comm::CommunicatorOptions options;
  options.timeout = std::chrono::seconds(60);
  options.store = store;
  return std::make_unique<comm::Communicator>(
      comm::make_nccl_backend(0, 1, store, 0, options.timeout), options);
}
#endif

TEST(CommNccl, WorldOfOneOnDeviceBuffers) {
#if !DTRAIN_HAVE_CUDA
  GTEST_SKIP() << "dtrain was built without CUDA (DTRAIN_WITH_CUDA=OFF or no nvcc)";
#else
  std::string why;
  if (comm::nccl_backend::cuda_device_count(&why) == 0) GTEST_SKIP() << why;
  auto comm = nccl_world_of_one();
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    for (std::size_t count : {std::size_t{1}, std::size_t{1009}, std::size_t{1} << 20}) {
      const std::size_t bytes = count * dtype_size(dtype);
      std::vector<std::uint8_t> host(bytes), back(bytes);
      for (std::size_t i = 0; i < count; ++i) testing::store_value(host.data(), dtype, i, testing::input_value(0, i));
      void* device = nullptr;
      void* gathered = nullptr;
      ASSERT_EQ(cudaMalloc(&device, bytes), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&gathered, bytes), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(device, host.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
      for (comm::ReduceOp op : {comm::ReduceOp::sum, comm::ReduceOp::avg, comm::ReduceOp::max}) {
        comm->allreduce(device, count, dtype, op).wait();
      }
      comm->broadcast(device, count, dtype, 0).wait();
      comm->allgather(device, gathered, count, dtype).wait();
      comm->reduce_scatter(gathered, gathered, count, dtype, comm::ReduceOp::sum).wait();
      comm->barrier().wait();
      ASSERT_EQ(cudaMemcpy(back.data(), gathered, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < count; ++i) {
        wrong += testing::load_value(back.data(), dtype, i) != testing::rounded(testing::input_value(0, i), dtype);
      }
      EXPECT_EQ(wrong, 0u) << dtype_name(dtype) << " x " << count;
      cudaFree(device);
      cudaFree(gathered);
    }
  }
#endif
}

// Runs on every machine: without a GPU the error says so; with GPUs, a
// device index past the visible ones is named.
TEST(CommNccl, WithoutCudaTheErrorSaysWhy) {
#if DTRAIN_HAVE_CUDA
  std::string why;
  const int count = comm::nccl_backend::cuda_device_count(&why);
  try {
    comm::make_nccl_backend(0, 1, std::make_shared<comm::MemoryStore>(), count, std::chrono::seconds(1));
    FAIL() << "nccl backend on a device that does not exist";
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
#else
  try {
    comm::make_nccl_backend(0, 1, std::make_shared<comm::MemoryStore>(), 0, std::chrono::seconds(1));
    FAIL() << "nccl backend without CUDA";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("built without CUDA"), std::string::npos) << e.what();
  }
#endif
}

}  // namespace
}  // namespace dtrain
