"""A PyTorch program that fails as torchrun users' programs do, for
dtrain-launch's torchrun contract (tests/integration/test_launch_torchrun.cpp):
its entry point is decorated with torch.distributed.elastic's @record, which
writes the exception that ends it to TORCHELASTIC_ERROR_FILE. Each rank
prints a line with PyTorch's own "[rankN]:" prefix; rank 1 then raises.
"""
import os

from torch.distributed.elastic.multiprocessing.errors import record


@record
def main():
    rank = int(os.environ["RANK"])
    print(f"[rank{rank}]: started, error file {os.environ['TORCHELASTIC_ERROR_FILE']}", flush=True)
    if rank == 1:
        raise ValueError(f"rank {rank} cannot go on: the answer is 42")


if __name__ == "__main__":
    main()
