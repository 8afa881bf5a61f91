// Which CUDA device a rank uses. The CUDA runtime numbers only the devices in
// CUDA_VISIBLE_DEVICES (0, 1, ... in that list's order), and Slurm narrows
// that list for a step (--gpus, --gres) and sometimes for each task
// (--gpus-per-task with --gpu-bind, --ntasks-per-gpu), while SLURM_STEP_GPUS
// (SLURM_JOB_GPUS in a batch step) keeps listing every GPU of the node's
// allocation. Pure and thread-safe.
#pragma once

#include <string>

namespace dtrain::cluster {

struct GpuView {
  int visible_count = 0;             // devices the CUDA runtime reports to this process
  std::string cuda_visible_devices;  // CUDA_VISIBLE_DEVICES ("" when unset)
  std::string slurm_gpus;            // SLURM_STEP_GPUS, else SLURM_JOB_GPUS ("" when unset)
};

// The device ordinal for `local_rank` of `local_world_size` ranks on a node:
// - every rank sees at least local_world_size devices (the node's devices,
//   shared): device local_rank, one each;
// - each rank sees fewer devices than there are ranks on the node, because
//   they are its own (CUDA_VISIBLE_DEVICES lists fewer devices than Slurm
//   allocated on the node, or is set without Slurm's list, as a launcher
//   does per rank): device 0, the first of its own;
// - otherwise ranks would share a device, which NCCL refuses: dtrain::Error
//   naming the counts and the variables, and what to request instead.
// No visible device is a dtrain::Error as well.
int device_for_local_rank(int local_rank, int local_world_size, const GpuView& view);

// Entries of a comma-separated device list ("0,1,3" -> 3, "" -> 0).
int count_devices(const std::string& list);

}  // namespace dtrain::cluster
