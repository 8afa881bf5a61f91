// The Open MPI backend: collectives on MPI_COMM_WORLD, for jobs started by
// mpirun or by srun --mpi=pmix. Blocking MPI calls run on the comm thread
// (MPI_THREAD_SERIALIZED): measured here, Open MPI's blocking allreduce is
// about twice as fast as polling its non-blocking one. MPI calls cannot
// time out, so the communicator's watchdog enforces the deadline.
//
// Open MPI's blocking calls poll until the peers arrive. On the comm thread
// that poll competes with the training thread (and, with a rank per core,
// with the other ranks) for the core, so dtrain asks Open MPI to yield the
// core whenever a poll finds nothing (mpi_yield_when_idle). lm-small, 2 ranks
// on 2 cores, yield over no yield in interleaved pairs: ZeRO-3 median +2.6%
// (11 of 13 pairs faster), stage 0 median +2.4% (7 of 10).
// A value already in the environment wins (OMPI_MCA_mpi_yield_when_idle=0,
// or mpirun --mca mpi_yield_when_idle 0, which puts it there).
#pragma once

#include <mpi.h>

#include "comm/backend.h"
#include "comm/staging.h"

namespace dtrain::comm::mpi_backend {

// Sets OMPI_MCA_mpi_yield_when_idle=1 unless the variable is already set;
// returns whether it set it. Has an effect only before MPI_Init.
bool default_yield_when_idle();

class MpiBackend : public Backend {
 public:
  // Initialises MPI if nobody has (MPI_THREAD_SERIALIZED) and finalises it
  // in the destructor when it did.
  MpiBackend();
  ~MpiBackend() override;

  const char* name() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  void run(const Op& op) override;
  bool enforces_deadline() const override { return false; }

 private:
  void allreduce(const Op& op);
  void reduce_scatter(const Op& op);
  void allgather(const Op& op);
  void broadcast(const Op& op);

  int rank_ = 0;
  int world_size_ = 1;
  bool initialised_here_ = false;
  Staging staging_;
};

}  // namespace dtrain::comm::mpi_backend
