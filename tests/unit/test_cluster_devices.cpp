// Local rank -> CUDA device, under a node-wide view of the GPUs and under
// Slurm's per-task binding.
#include "cluster/devices.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/error.h"

namespace dtrain::cluster {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

std::string error_of(int local_rank, int local_world, const GpuView& view) {
  try {
    device_for_local_rank(local_rank, local_world, view);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

TEST(Devices, CountsListEntries) {
  EXPECT_EQ(count_devices(""), 0);
  EXPECT_EQ(count_devices("0"), 1);
  EXPECT_EQ(count_devices("0,1,3"), 3);
  EXPECT_EQ(count_devices("GPU-8d1c,GPU-77aa"), 2);
  EXPECT_EQ(count_devices("0,,1,"), 2);
}

TEST(Devices, NodeWideViewGivesEachLocalRankItsOwnDevice) {
  // No variables (all devices), CUDA_VISIBLE_DEVICES set by hand, or narrowed
  // by Slurm to the step's GPUs: ordinals are local ranks.
  for (const GpuView& view : {GpuView{4, "", ""}, GpuView{4, "4,5,6,7", ""}, GpuView{4, "0,1,2,3", "2,3,6,7"}}) {
    for (int r = 0; r < 4; ++r) EXPECT_EQ(device_for_local_rank(r, 4, view), r);
  }
  EXPECT_EQ(device_for_local_rank(1, 2, GpuView{8, "", ""}), 1);  // more devices than ranks
}

TEST(Devices, SlurmBindingGivesEachTaskItsOwnDevices) {
  // srun --gpus-per-task=1 --gpu-bind=single:1: each task sees one GPU of the
  // four the step holds on the node.
  for (int r = 0; r < 4; ++r) EXPECT_EQ(device_for_local_rank(r, 4, GpuView{1, std::to_string(r), "0,1,2,3"}), 0);
  // Two GPUs per task, four tasks on the node.
  EXPECT_EQ(device_for_local_rank(3, 4, GpuView{2, "6,7", "0,1,2,3,4,5,6,7"}), 0);
  // A launcher that gives every worker its own CUDA_VISIBLE_DEVICES, no Slurm.
  EXPECT_EQ(device_for_local_rank(5, 8, GpuView{1, "5", ""}), 0);
}

TEST(Devices, SharingADeviceIsRefusedWithWhatToRequest) {
  EXPECT_THAT(error_of(2, 4, GpuView{2, "", ""}),
              AllOf(HasSubstr("4 ranks run on this node but only 2 CUDA device(s)"), HasSubstr("--gpus-per-task=1")));
  // Slurm gave the step two GPUs on this node and every task sees both.
  EXPECT_THAT(error_of(0, 4, GpuView{2, "0,1", "0,1"}),
              AllOf(HasSubstr("CUDA_VISIBLE_DEVICES='0,1'"), HasSubstr("SLURM_STEP_GPUS/SLURM_JOB_GPUS='0,1'")));
}

TEST(Devices, NoVisibleDeviceSaysSo) {
  EXPECT_THAT(error_of(0, 1, GpuView{0, "", ""}), AllOf(HasSubstr("sees no CUDA device"), HasSubstr("device=cpu")));
}

}  // namespace
}  // namespace dtrain::cluster
