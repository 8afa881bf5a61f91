#include "cluster/devices.h"

#include <fmt/format.h>

#include "core/error.h"

namespace dtrain::cluster {
namespace {

std::string describe(const GpuView& view) {
  return fmt::format("CUDA_VISIBLE_DEVICES='{}', SLURM_STEP_GPUS/SLURM_JOB_GPUS='{}'",
                     view.cuda_visible_devices, view.slurm_gpus);
}

}  // namespace

int count_devices(const std::string& list) {
  int count = 0;
  bool in_entry = false;
  for (const char c : list) {
    if (c == ',') {
      in_entry = false;
    } else if (c != ' ' && !in_entry) {
      in_entry = true;
      ++count;
    }
  }
  return count;
}

int device_for_local_rank(int local_rank, int local_world_size, const GpuView& view) {
  DTRAIN_CHECK(local_rank >= 0 && local_rank < local_world_size, "local rank {} of {}", local_rank,
               local_world_size);
  if (view.visible_count < 1) {
    throw Error(fmt::format("local rank {} sees no CUDA device ({}); request GPUs for the step "
                            "(srun --gpus-per-node=N or --gres=gpu:N) or use device=cpu",
                            local_rank, describe(view)));
  }
  if (view.visible_count >= local_world_size) return local_rank;
  const int allocated = count_devices(view.slurm_gpus);
  const bool own_devices = !view.cuda_visible_devices.empty() && (allocated == 0 || allocated > view.visible_count);
  if (own_devices) return 0;
  throw Error(fmt::format(
      "{} ranks run on this node but only {} CUDA device(s) are visible to each ({}), so ranks would "
      "share a device, which NCCL refuses; run at most {} task(s) per node, or give each task its own "
      "GPU (srun --gpus-per-task=1, or --ntasks-per-gpu=1)",
      local_world_size, view.visible_count, describe(view), view.visible_count));
}

}  // namespace dtrain::cluster
