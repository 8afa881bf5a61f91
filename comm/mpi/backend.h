// The Open MPI backend: collectives on MPI_COMM_WORLD, for jobs started by
// mpirun or by srun --mpi=pmix. Blocking MPI calls run on the comm thread
// (MPI_THREAD_SERIALIZED): measured here, Open MPI's blocking allreduce is
// about twice as fast as polling its non-blocking one. MPI calls cannot
// time out, so the communicator's watchdog enforces the deadline.
#pragma once

#include <mpi.h>

#include "comm/backend.h"
#include "comm/staging.h"

namespace dtrain::comm::mpi_backend {

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
