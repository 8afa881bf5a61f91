// The gloo backend: CPU collectives over gloo's TCP transport; ranks find
// each other through the run's comm::Store (see store_adapter.h). Nothing
// gloo throws leaves it: gloo's errors become TimeoutError (gloo timed out)
// or CommError, "gloo <operation>: <gloo's text>".
#pragma once

#include <memory>
#include <string>

#include <gloo/rendezvous/context.h>

#include "comm/backend.h"
#include "comm/staging.h"

namespace dtrain::comm::gloo_backend {

class GlooBackend : public Backend {
 public:
  // Connects a full mesh with every other rank; `hostname` is the address
  // this rank listens on (peers connect to it). Bounded by `timeout`.
  GlooBackend(int rank, int world_size, std::shared_ptr<Store> store, Duration timeout,
              const std::string& hostname);

  const char* name() const override { return "gloo"; }
  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  void run(const Op& op) override;

 private:
  void allreduce(const Op& op);
  void reduce_scatter(const Op& op);
  void allgather(const Op& op);
  void broadcast(const Op& op);
  void barrier(const Op& op);
  // allreduce of floats in place through gloo's ring algorithm.
  void allreduce_f32(float* data, std::size_t count, bool max, const Op& op);

  int rank_;
  int world_size_;
  std::shared_ptr<::gloo::rendezvous::Context> context_;
  Staging staging_;
};

}  // namespace dtrain::comm::gloo_backend
