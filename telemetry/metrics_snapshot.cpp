#include "telemetry/metrics_snapshot.h"

#include <fmt/format.h>

#include "telemetry/text_fields.h"

namespace dtrain::telemetry {
namespace {

// "count,bytes,seconds"
bool parse_collective(std::string_view text, CollectiveTotals& out) {
  const auto a = text.find(',');
  const auto b = a == std::string_view::npos ? a : text.find(',', a + 1);
  if (b == std::string_view::npos) return false;
  return parse_number(text.substr(0, a), out.count) && parse_number(text.substr(a + 1, b - a - 1), out.bytes) &&
         parse_number(text.substr(b + 1), out.seconds);
}

// One field into `s`; false when its value is malformed. Unknown keys pass.
bool parse_field(std::string_view key, std::string_view value, RankSnapshot& s, bool& versioned) {
  if (key == "v") return versioned = value == "1";
  if (key == "pub") return parse_number(value, s.publication);
  if (key == "rank") return parse_number(value, s.rank);
  if (key == "world") return parse_number(value, s.world);
  if (key == "step") return parse_number(value, s.step);
  if (key == "loss") return parse_number(value, s.loss);
  if (key == "lr") return parse_number(value, s.lr);
  if (key == "tokens_per_s") return parse_number(value, s.tokens_per_s);
  if (key == "step_s") return parse_number(value, s.step_seconds);
  if (key == "compute_s") return parse_number(value, s.compute_seconds);
  if (key == "flops_per_s") return parse_number(value, s.flops_per_s);
  if (key == "data_wait_s") return parse_number(value, s.data_wait_seconds);
  if (key == "ckpt_saves") return parse_number(value, s.checkpoint_saves);
  if (key == "ckpt_save_s") return parse_number(value, s.checkpoint_save_seconds);
  if (key == "ckpt_blocked_s") return parse_number(value, s.checkpoint_blocked_seconds);
  if (key == "grad_norm") return parse_number(value, s.grad_norm);
  if (key == "tokens") return parse_number(value, s.tokens);
  if (key == "peak_rss") return parse_number(value, s.peak_rss_bytes);
  if (key == "eval_loss") return parse_number(value, s.eval_loss.emplace());
  if (key == "eval_accuracy") return parse_number(value, s.eval_accuracy.emplace());
  for (const comm::OpKind kind : comm::kOpKinds) {
    if (key == comm::op_kind_name(kind)) return parse_collective(value, s.collective(kind));
  }
  return true;
}

}  // namespace

std::string encode_snapshot(const RankSnapshot& s) {
  std::string out = fmt::format(
      "v=1 pub={} rank={} world={} step={} loss={} lr={} tokens_per_s={} step_s={} compute_s={} flops_per_s={} "
      "data_wait_s={} ckpt_saves={} ckpt_save_s={} ckpt_blocked_s={} grad_norm={} tokens={} peak_rss={}",
      s.publication, s.rank, s.world, s.step, s.loss, s.lr, s.tokens_per_s, s.step_seconds, s.compute_seconds,
      s.flops_per_s, s.data_wait_seconds, s.checkpoint_saves, s.checkpoint_save_seconds,
      s.checkpoint_blocked_seconds, s.grad_norm, s.tokens, s.peak_rss_bytes);
  if (s.eval_loss) out += fmt::format(" eval_loss={}", *s.eval_loss);
  if (s.eval_accuracy) out += fmt::format(" eval_accuracy={}", *s.eval_accuracy);
  for (const comm::OpKind kind : comm::kOpKinds) {
    const CollectiveTotals& c = s.collective(kind);
    out += fmt::format(" {}={},{},{}", comm::op_kind_name(kind), c.count, c.bytes, c.seconds);
  }
  return out;
}

std::optional<RankSnapshot> parse_snapshot(std::string_view text) {
  RankSnapshot s;
  bool versioned = false;
  const bool parsed = for_each_field(text, [&](std::string_view key, std::string_view value) {
    return parse_field(key, value, s, versioned);
  });
  if (!parsed || !versioned) return std::nullopt;
  return s;
}

}  // namespace dtrain::telemetry
