#include "telemetry/metrics_render.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include <fmt/format.h>

namespace dtrain::telemetry {
namespace {

// Prometheus spells the special values NaN, +Inf and -Inf.
std::string value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  return fmt::format("{}", v);
}

// A label value as the exposition format quotes it.
std::string escape_label(const std::string& text) {
  std::string out;
  for (const char c : text) {
    if (c == '\\' || c == '"') out += '\\';
    out += c == '\n' ? std::string("\\n") : std::string(1, c);
  }
  return out;
}

class Page {
 public:
  // `run_id` labels every sample of the page ("": none).
  explicit Page(const std::string& run_id)
      : run_label_(run_id.empty() ? "" : fmt::format("run_id=\"{}\"", escape_label(run_id))) {}

  void family(const char* name, const char* type, const char* help) {
    out_ += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  }
  void sample(const char* name, const std::string& labels, double v) {
    const std::string all = run_label_.empty() || labels.empty() ? run_label_ + labels : run_label_ + "," + labels;
    out_ += all.empty() ? fmt::format("{} {}\n", name, value(v)) : fmt::format("{}{{{}}} {}\n", name, all, value(v));
  }
  // One family with one sample per rank that has a snapshot.
  void per_rank(const JobMetrics& job, const char* name, const char* type, const char* help,
                const std::function<double(const RankSnapshot&)>& get) {
    family(name, type, help);
    for (const auto& r : job.ranks) {
      if (r) sample(name, fmt::format("rank=\"{}\"", r->rank), get(*r));
    }
  }
  // One family with one sample per rank and collective kind that ran.
  void per_collective(const JobMetrics& job, const char* name, const char* type, const char* help,
                      const std::function<std::optional<double>(const RankSnapshot&, comm::OpKind)>& get) {
    family(name, type, help);
    for (const auto& r : job.ranks) {
      if (!r) continue;
      for (const comm::OpKind kind : comm::kOpKinds) {
        if (const auto v = get(*r, kind)) {
          sample(name, fmt::format("rank=\"{}\",kind=\"{}\"", r->rank, comm::op_kind_name(kind)), *v);
        }
      }
    }
  }
  std::string take() { return std::move(out_); }

 private:
  std::string run_label_;
  std::string out_;
};

void render_job(Page& p, const JobMetrics& job) {
  p.family("dtrain_world_size", "gauge", "Ranks in the current round of the job.");
  p.sample("dtrain_world_size", "", job.world_size);
  p.family("dtrain_round", "gauge", "The current rendezvous round (0 until the first restart).");
  p.sample("dtrain_round", "", job.round);
  p.family("dtrain_restarts_total", "counter", "Restarts of the whole job after failures.");
  p.sample("dtrain_restarts_total", "", job.restarts);
  p.family("dtrain_workers_up", "gauge", "Ranks whose metrics were refreshed within the last few intervals.");
  p.sample("dtrain_workers_up", "", job.workers_up);
  p.family("dtrain_local_workers_running", "gauge", "Worker processes of this node still running.");
  p.sample("dtrain_local_workers_running", "", job.local_workers_running);
}

// The job's training figures, as the lowest reporting rank (rank 0: the loss
// is already the mean over ranks, tokens/s counts every rank) sees them.
void render_training(Page& p, const JobMetrics& job) {
  const RankSnapshot* lead = nullptr;
  for (const auto& r : job.ranks) {
    if (r) {
      lead = &*r;
      break;
    }
  }
  if (lead == nullptr) return;
  p.family("dtrain_step", "gauge", "Optimizer steps done.");
  p.sample("dtrain_step", "", static_cast<double>(lead->step));
  p.family("dtrain_loss", "gauge", "Training loss of the last step (mean over ranks).");
  p.sample("dtrain_loss", "", lead->loss);
  p.family("dtrain_learning_rate", "gauge", "Learning rate of the last step.");
  p.sample("dtrain_learning_rate", "", lead->lr);
  p.family("dtrain_grad_norm", "gauge", "Global gradient norm of the last step, before clipping.");
  p.sample("dtrain_grad_norm", "", lead->grad_norm);
  p.family("dtrain_tokens_total", "counter", "Training tokens of the whole job (every rank's) since the workers started.");
  p.sample("dtrain_tokens_total", "", static_cast<double>(lead->tokens));
  if (lead->eval_loss) {
    p.family("dtrain_eval_loss", "gauge", "Loss on the held-out data at the last evaluation.");
    p.sample("dtrain_eval_loss", "", *lead->eval_loss);
  }
  if (lead->eval_accuracy) {
    p.family("dtrain_eval_accuracy", "gauge", "Classifier accuracy on the held-out data at the last evaluation.");
    p.sample("dtrain_eval_accuracy", "", *lead->eval_accuracy);
  }
  p.family("dtrain_tokens_per_second", "gauge", "Training tokens per second of the whole job.");
  p.sample("dtrain_tokens_per_second", "", lead->tokens_per_s);
  p.family("dtrain_step_seconds", "gauge", "Wall time of the last step.");
  p.sample("dtrain_step_seconds", "", lead->step_seconds);
  p.family("dtrain_model_flops_per_second", "gauge",
           "Model FLOP/s of the job (model FLOPs per token x tokens/s); MFU is this over the peak.");
  p.sample("dtrain_model_flops_per_second", "", lead->flops_per_s);
  if (job.peak_flops_per_worker > 0.0 && job.world_size > 0) {
    p.family("dtrain_mfu", "gauge", "Model FLOPs utilisation: model FLOP/s over the peak of every worker (--peak-flops).");
    p.sample("dtrain_mfu", "", lead->flops_per_s / (job.peak_flops_per_worker * job.world_size));
  }
}

void render_ranks(Page& p, const JobMetrics& job) {
  p.per_rank(job, "dtrain_rank_step", "gauge", "Optimizer steps done by the rank.",
             [](const RankSnapshot& r) { return static_cast<double>(r.step); });
  p.per_rank(job, "dtrain_rank_step_seconds", "gauge", "Wall time of the rank's last step.",
             [](const RankSnapshot& r) { return r.step_seconds; });
  p.per_rank(job, "dtrain_rank_compute_seconds", "gauge",
             "Mean seconds per step the rank computed, without waiting on collectives.",
             [](const RankSnapshot& r) { return r.compute_seconds; });
  const std::vector<int> slow = find_stragglers(job.ranks, job.straggler_factor);
  p.per_rank(job, "dtrain_rank_straggler", "gauge",
             fmt::format("1 when the rank's compute time exceeds {} x the median over ranks.", job.straggler_factor)
                 .c_str(),
             [&](const RankSnapshot& r) { return std::count(slow.begin(), slow.end(), r.rank) > 0 ? 1.0 : 0.0; });
  p.family("dtrain_stragglers", "gauge", "Ranks currently named stragglers.");
  p.sample("dtrain_stragglers", "", static_cast<double>(slow.size()));
  p.per_rank(job, "dtrain_rank_peak_rss_bytes", "gauge", "Peak resident set size of the rank's process.",
             [](const RankSnapshot& r) { return static_cast<double>(r.peak_rss_bytes); });
  p.per_rank(job, "dtrain_data_wait_seconds_total", "counter", "Seconds the training thread waited for batches.",
             [](const RankSnapshot& r) { return r.data_wait_seconds; });
  p.per_rank(job, "dtrain_checkpoint_saves_total", "counter", "Checkpoints this rank saved.",
             [](const RankSnapshot& r) { return static_cast<double>(r.checkpoint_saves); });
  p.per_rank(job, "dtrain_checkpoint_save_seconds", "gauge", "Write time of the rank's last checkpoint save.",
             [](const RankSnapshot& r) { return r.checkpoint_save_seconds; });
  p.per_rank(job, "dtrain_checkpoint_blocked_seconds", "gauge",
             "Seconds the last checkpoint save held up training on the rank.",
             [](const RankSnapshot& r) { return r.checkpoint_blocked_seconds; });
}

void render_collectives(Page& p, const JobMetrics& job) {
  using Get = std::function<std::optional<double>(const RankSnapshot&, comm::OpKind)>;
  const auto ran = [](const RankSnapshot& r, comm::OpKind k) { return r.collective(k).count > 0; };
  p.per_collective(job, "dtrain_collective_operations_total", "counter", "Collectives completed.",
                   Get([&](const RankSnapshot& r, comm::OpKind k) -> std::optional<double> {
                     if (!ran(r, k)) return std::nullopt;
                     return static_cast<double>(r.collective(k).count);
                   }));
  p.per_collective(job, "dtrain_collective_bytes_total", "counter",
                   "Bytes of the collectives (nccl-tests size: the whole buffer).",
                   Get([&](const RankSnapshot& r, comm::OpKind k) -> std::optional<double> {
                     if (!ran(r, k)) return std::nullopt;
                     return static_cast<double>(r.collective(k).bytes);
                   }));
  p.per_collective(job, "dtrain_collective_seconds_total", "counter", "Seconds the comm thread spent in collectives.",
                   Get([&](const RankSnapshot& r, comm::OpKind k) -> std::optional<double> {
                     if (!ran(r, k)) return std::nullopt;
                     return r.collective(k).seconds;
                   }));
  p.per_collective(job, "dtrain_collective_busbw_bytes_per_second", "gauge",
                   "Measured bus bandwidth over the run (bytes / seconds x nccl-tests' bus factor).",
                   Get([&](const RankSnapshot& r, comm::OpKind k) -> std::optional<double> {
                     const CollectiveTotals& c = r.collective(k);
                     const double factor = comm::bus_factor(k, r.world);
                     if (r.world < 2 || c.count == 0 || c.seconds <= 0.0 || factor == 0.0) return std::nullopt;
                     return static_cast<double>(c.bytes) / c.seconds * factor;
                   }));
}

}  // namespace

std::vector<int> find_stragglers(const std::vector<std::optional<RankSnapshot>>& ranks, double factor) {
  std::vector<double> times;
  for (const auto& r : ranks) {
    if (r && r->compute_seconds > 0.0) times.push_back(r->compute_seconds);
  }
  if (times.size() < 2) return {};
  std::sort(times.begin(), times.end());
  const double median = times[(times.size() - 1) / 2];  // the lower middle for an even count
  std::vector<int> out;
  for (const auto& r : ranks) {
    if (r && r->compute_seconds > factor * median) out.push_back(r->rank);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string render_prometheus(const JobMetrics& job) {
  Page page(job.run_id);
  render_job(page, job);
  render_training(page, job);
  render_ranks(page, job);
  render_collectives(page, job);
  return page.take();
}

}  // namespace dtrain::telemetry
