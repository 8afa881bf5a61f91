"""A PyTorch program as torchrun would start it, for dtrain-launch's
torchrun contract (tests/integration/test_launch_torchrun.cpp): it joins
PyTorch's own process group through init_method="env://" (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT), all-reduces rank + 1 over gloo and prints one line
with what it saw. With --hold-first-round, the ranks of the first round
(TORCHELASTIC_RESTART_COUNT=0) then wait, so that the test can kill one.
"""
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist


def main():
    restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    value = torch.tensor([float(rank + 1)])
    dist.all_reduce(value)
    print(f"rank {rank} of {world} local_rank {os.environ['LOCAL_RANK']} restart {restart} "
          f"run {os.environ['TORCHELASTIC_RUN_ID']} omp {os.environ.get('OMP_NUM_THREADS', '-')} "
          f"allreduce {value.item():g}", flush=True)
    if "--hold-first-round" in sys.argv[1:] and restart == 0:
        time.sleep(300)  # the test kills a rank long before; the launcher then kills this one
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
