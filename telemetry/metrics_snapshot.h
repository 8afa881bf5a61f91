// The metrics snapshot a worker publishes for dtrain-launch's /metrics
// (docs/observability.md): one line of "key=value" fields at
// "<run id>/round<R>/metrics/<rank>" in the run's store, written by the
// worker's heartbeat thread at most once per heartbeat interval:
//
//   v=1 pub=N rank=K world=W step=S loss=L lr=X tokens_per_s=T step_s=D
//   compute_s=C flops_per_s=F data_wait_s=A ckpt_saves=N ckpt_save_s=B
//   ckpt_blocked_s=Z grad_norm=G tokens=M peak_rss=R [eval_loss=E]
//   [eval_accuracy=Q] allreduce=count,bytes,seconds reduce_scatter=...
//   allgather=... broadcast=... barrier=...
//
//   pub          grows with every publication (freshness)
//   step_s       wall time of the last step
//   compute_s    mean time per step this rank spent computing (forward and
//                backward, without waiting on collectives) since its last
//                publication: what names a straggler, since in synchronous
//                data parallelism every rank's wall step time is the same
//   data_wait_s  total seconds the training thread waited for batches
//   grad_norm    the last step's global gradient norm (before clipping)
//   tokens       the job's tokens (every rank's) over the steps this process ran
//   peak_rss     this rank's peak resident set size, bytes
//   eval_loss, eval_accuracy  the last evaluation's (absent before the first;
//                accuracy only for a classifier)
//   <kind>=...   the communicator's totals per collective kind, one field
//                per comm::kOpKinds named by comm::op_kind_name
//                (comm/op_stats.h: nccl-tests' bytes)
//
// Fields are order-free (telemetry/text_fields.h); unknown fields are
// skipped, so either side may add some. This header is shared by the
// launcher (reads) and the worker (writes, and serves its own /metrics
// without a launcher).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "comm/op_stats.h"

namespace dtrain::telemetry {

struct CollectiveTotals {
  std::uint64_t count = 0;
  std::uint64_t bytes = 0;
  double seconds = 0.0;
};

struct RankSnapshot {
  std::int64_t publication = 0;
  int rank = 0;
  int world = 1;
  std::int64_t step = 0;
  double loss = 0.0;
  double lr = 0.0;
  double tokens_per_s = 0.0;   // the whole job's tokens per second (every rank's tokens)
  double step_seconds = 0.0;
  double compute_seconds = 0.0;
  double flops_per_s = 0.0;    // model FLOP/s of the job (FLOPs per token x tokens/s); 0 unknown
  double data_wait_seconds = 0.0;
  std::int64_t checkpoint_saves = 0;
  double checkpoint_save_seconds = 0.0;     // the last save's write time on this rank
  double checkpoint_blocked_seconds = 0.0;  // the last save's time the training thread waited
  double grad_norm = 0.0;
  std::int64_t tokens = 0;       // the job's tokens over this process's steps
  std::int64_t peak_rss_bytes = 0;
  std::optional<double> eval_loss;
  std::optional<double> eval_accuracy;
  std::array<CollectiveTotals, comm::kOpKinds.size()> collectives{};  // index: comm::OpKind

  CollectiveTotals& collective(comm::OpKind kind) { return collectives[static_cast<std::size_t>(kind)]; }
  const CollectiveTotals& collective(comm::OpKind kind) const {
    return collectives[static_cast<std::size_t>(kind)];
  }
};

std::string encode_snapshot(const RankSnapshot& s);
// nullopt when `text` is not a snapshot (no v=1 field or a malformed value).
std::optional<RankSnapshot> parse_snapshot(std::string_view text);

}  // namespace dtrain::telemetry
