#!/bin/bash
# dtrain under Open MPI's mpirun (docs/cluster.md): each dtrain-worker reads
# its rank, world size and local rank from mpirun; parallel.backend=auto
# takes mpi on CPUs and nccl on GPUs (NCCL's id then travels over MPI).
#
#   examples/mpirun.sh 4                                  # 4 ranks on this machine
#   HOSTS=node1:8,node2:8 examples/mpirun.sh 16 --set device=cuda
#   CONFIG=my.json OUT_DIR=runs/exp2 examples/mpirun.sh 2 --set parallel.zero_stage=2
#
# Arguments after the rank count go to every dtrain-worker (--set a.b=v ...).
set -euo pipefail

NP=${1:-2}
shift $(( $# > 0 ? 1 : 0 ))
CONFIG=${CONFIG:-examples/configs/fortunes-lm.json}
OUT_DIR=${OUT_DIR:-runs/mpirun-$(date +%Y%m%d-%H%M%S)}
BIN_DIR=${BIN_DIR:-build/bin}

mpirun_args=(-np "$NP" --bind-to none)  # a rank runs an OpenMP team: do not pin it to one core
for var in OMP_NUM_THREADS DTRAIN_STORE DTRAIN_TOKEN; do
  if [[ -n "${!var:-}" ]]; then mpirun_args+=(-x "$var"); fi  # to the ranks on other hosts too
done
if [[ -n "${HOSTS:-}" ]]; then
  mpirun_args+=(--host "$HOSTS")
else
  mpirun_args+=(--oversubscribe)  # one machine: allow more ranks than cores
fi
if [[ $(id -u) == 0 ]]; then
  # mpirun refuses to run as root (containers) unless told twice.
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
# Optional: DTRAIN_STORE=host:port (a free port on the first host) lets the
# ranks name the one that fails to reach a collective; rank 0 hosts it.

exec mpirun "${mpirun_args[@]}" "$BIN_DIR/dtrain-worker" --config "$CONFIG" \
  --set "train.out_dir=$OUT_DIR" "$@"
