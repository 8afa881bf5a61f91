#include "worker/memory_plan.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "nn/cpu/matmul.h"
#include "nn/linear.h"
#include "nn/transformer.h"
#include "worker/precision.h"
#include "worker/trainer.h"

namespace dtrain::worker {
namespace {

double mib(std::int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

// A field of /proc/self/status or /proc/meminfo in bytes ("VmRSS:  1234 kB"); 0 when absent.
std::int64_t proc_kb_field(const char* file, const std::string& name) {
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(name + ":", 0) != 0) continue;
    std::istringstream fields(line.substr(name.size() + 1));
    std::int64_t kb = 0;
    fields >> kb;
    return kb * 1024;
  }
  return 0;
}

// One loader's batches: its ring of prefetch + 1, each of `rows` samples.
std::int64_t loader_bytes(const config::Config& c, std::int64_t seq_len, int prefetch) {
  const std::int64_t rows = c.train().micro_batch_size();
  const bool patches = c.model().input() == "patches";
  const std::int64_t patch = static_cast<std::int64_t>(c.model().patch_size()) * c.model().patch_size();
  const std::int64_t inputs = rows * seq_len * (patches ? patch * 4 : 4);
  const std::int64_t targets = (c.model().kind() == "lm" ? rows * seq_len : rows) * 4;
  return (prefetch + 1) * (inputs + targets);
}

// Runs a linear layer's three products (forward, input and weight gradients)
// once, in operands of type t, on zeros of at most [512, 1024]: oneDNN then
// holds the kernels and the buffers it keeps between calls that the layer's
// products will use, and the resident set shows them.
void warm_up_linear_products(std::int64_t rows, std::int64_t in, std::int64_t out, DType t) {
  rows = std::clamp<std::int64_t>(rows, 1, 512);
  in = std::clamp<std::int64_t>(in, 1, 1024);
  out = std::clamp<std::int64_t>(out, 1, 1024);
  const auto most = static_cast<std::size_t>(std::max({rows * in, rows * out, in * out}));
  std::vector<float> a(most), b(most), c(most);  // zeros, in any type
  for (const nn::cpu::Gemm& g : {nn::typed(nn::linear_forward_gemm(rows, in, out, false), t, t),
                                 nn::typed(nn::linear_input_grad_gemm(rows, in, out, false), t, t),
                                 nn::typed(nn::linear_weight_grad_gemm(rows, in, out), t, DType::f32)}) {
    nn::cpu::gemm(g, static_cast<const void*>(a.data()), b.data(), c.data());
  }
}

}  // namespace

std::int64_t MemoryPlan::host_total() const { return resident_bytes + host_to_allocate(); }

std::int64_t MemoryPlan::host_to_allocate() const {
  const std::int64_t device =
      state.model_state_bytes() + state.working_bytes + activation_bytes + weight_copy_bytes + matmul_copy_bytes;
  return loader_bytes + (on_device ? 0 : device);
}

MemoryPlan plan_memory(const config::Config& c, int world, std::int64_t seq_len) {
  const nn::ModelConfig model = model_config(c);
  const nn::ParameterLayout layout = nn::declare_parameters(model);
  sharding::EngineOptions eo;
  eo.stage = c.parallel().zero_stage();
  eo.max_live_mb = c.parallel().zero3_max_live_mb();
  eo.tied_embeddings = model.tie_embeddings;
  eo.compute = compute_dtype(c);
  eo.reduce = reduce_dtype(c);
  MemoryPlan plan;
  plan.state = sharding::Engine::plan_memory(layout, world, eo);
  plan.on_device = c.device() == "cuda";
  plan.activation_bytes = nn::planned_activation_bytes(
      model, layout, c.train().micro_batch_size(), seq_len,
      plan.on_device ? nn::gpu_attention_scratch(c.train().micro_batch_size() * model.n_heads, seq_len,
                                                 model.d_model / std::max(model.n_heads, std::int64_t{1}))
                     : nn::AttentionScratchKind::none,
      plan.on_device ? 0 : -1);
  plan.loader_bytes = loader_bytes(c, seq_len, c.data().prefetch()) + loader_bytes(c, seq_len, 0);
  // Resident now: the process, its data and, on the host, oneDNN's kernels
  // and the buffers it keeps between calls (its sgemm's, on AVX2: 10 MiB at
  // lm-small's products), which the largest linear layer's products bring in.
  if (!plan.on_device) {
    warm_up_linear_products(c.train().micro_batch_size() * seq_len, model.d_model,
                            std::max(model.fc1_width(), model.d_model), eo.compute);
  }
  plan.resident_bytes = proc_kb_field("/proc/self/status", "VmRSS");
  // On the host, every linear's forward and input-gradient products keep a
  // copy of its weight in the compute precision, where the CPU's kernels
  // want one (nn::cpu::copies_weights). Stage 3 multiplies by its gather
  // slots, which hold layer after layer at the same places: copies for as
  // many layers as there are slots, and the head.
  if (!plan.on_device && nn::cpu::copies_weights(eo.compute)) {
    std::int64_t copied = model.matmul_params();
    const std::int64_t slots = plan.state.gather_slots;
    if (eo.stage == 3 && model.n_layers > slots) {
      const std::int64_t per_layer = (copied - model.outputs() * model.d_model) / model.n_layers;
      copied -= (model.n_layers - slots) * per_layer;
    }
    plan.weight_copy_bytes = 2 * copied * static_cast<std::int64_t>(dtype_size(eo.compute));
  }
  // The linear products' operand copies (AVX2: dtrain's own kernel's packed
  // blocks, or oneDNN's sgemm's padded or transposed copies): one scratch per
  // thread, as large as the largest. The d_ff-wide
  // activations' rows are as the graph lays them out (row_stride: nn/graph.h).
  if (!plan.on_device) {
    const std::int64_t n = c.train().micro_batch_size() * seq_len, d = model.d_model, ff = model.d_ff;
    const std::int64_t h = model.fc1_width();
    const std::int64_t hs = nn::cpu::activation_row_stride(h, d, eo.compute);
    const std::int64_t as = nn::cpu::activation_row_stride(ff, d, eo.compute);
    for (const auto& [in, out, rows] : {std::tuple{d, model.qkv_width(), nn::LinearRows{}},
                                        std::tuple{d, d, nn::LinearRows{}}, std::tuple{d, h, nn::LinearRows{.out = hs}},
                                        std::tuple{ff, d, nn::LinearRows{.in = as}}}) {
      for (const nn::cpu::Gemm& g : {nn::linear_forward_gemm(n, in, out, false, rows),
                                     nn::linear_input_grad_gemm(n, in, out, false, rows),
                                     nn::linear_weight_grad_gemm(n, in, out, rows)}) {
        const std::int64_t bytes = nn::cpu::gemm_scratch_bytes(nn::typed(g, eo.compute, DType::f32));
        plan.matmul_copy_bytes = std::max(plan.matmul_copy_bytes, bytes);
      }
    }
  }
  return plan;
}

std::int64_t available_memory_bytes() {
  const std::int64_t available = proc_kb_field("/proc/meminfo", "MemAvailable");
  const char* limit = std::getenv("DTRAIN_MEMORY_LIMIT_MB");
  if (limit == nullptr || *limit == '\0') return available;
  char* end = nullptr;
  const long long mb = std::strtoll(limit, &end, 10);
  if (*end != '\0' || mb <= 0) {
    throw ConfigError("DTRAIN_MEMORY_LIMIT_MB", fmt::format("must be a positive number of MiB, got \"{}\"", limit));
  }
  const std::int64_t bytes = static_cast<std::int64_t>(mb) << 20;
  return available > 0 ? std::min(available, bytes) : bytes;
}

std::string describe(const MemoryPlan& p, const config::Config& c, int world) {
  const char* where = p.on_device ? "GPU" : "host";
  std::string out = fmt::format("memory per rank ({} rank(s), ZeRO stage {}, micro-batch {}):\n", world,
                                c.parallel().zero_stage(), c.train().micro_batch_size());
  out += fmt::format("  parameters       {:>10.1f} MiB ({})\n", mib(p.state.param_bytes), where);
  out += fmt::format("  gradients        {:>10.1f} MiB ({})\n", mib(p.state.grad_bytes), where);
  out += fmt::format("  optimizer state  {:>10.1f} MiB ({})\n", mib(p.state.optimizer_bytes), where);
  out += fmt::format("  working buffers  {:>10.1f} MiB ({})\n", mib(p.state.working_bytes), where);
  out += fmt::format("  activations      {:>10.1f} MiB ({})\n", mib(p.activation_bytes), where);
  if (p.weight_copy_bytes > 0) {
    out += fmt::format("  weight layouts   {:>10.1f} MiB (host, oneDNN's copies)\n", mib(p.weight_copy_bytes));
  }
  if (p.matmul_copy_bytes > 0) {
    out += fmt::format("  matmul copies    {:>10.1f} MiB (host, packed or padded operands, per thread)\n",
                       mib(p.matmul_copy_bytes));
  }
  out += fmt::format("  data loaders     {:>10.1f} MiB (host)\n", mib(p.loader_bytes));
  out += fmt::format("  process and data {:>10.1f} MiB (host, resident now, matmul kernels included)\n",
                     mib(p.resident_bytes));
  out += fmt::format("  host total       {:>10.1f} MiB\n", mib(p.host_total()));
  return out;
}

namespace {

// The first change of model.recompute and parallel.zero_stage (recompute
// first: it costs compute, not communication) under which the plan fits,
// said as the settings to make and what the activations and the total become.
std::string fitting_change(const MemoryPlan& p, std::int64_t available, int ranks_on_node, const config::Config& c,
                           const Replan& replan) {
  const int stage = c.parallel().zero_stage();
  const std::string recompute = c.model().recompute();
  const std::pair<int, const char*> tries[] = {{stage, "selective"}, {stage, "full"}, {3, recompute.c_str()},
                                              {3, "selective"}, {3, "full"}};
  for (const auto& [try_stage, mode] : tries) {
    if (try_stage == stage && mode == recompute) continue;
    config::Config changed = c;
    changed.mutable_parallel()->set_zero_stage(try_stage);
    changed.mutable_model()->set_recompute(mode);
    const MemoryPlan q = replan(changed);
    if (q.host_to_allocate() * ranks_on_node > available) continue;
    std::string settings;
    if (mode != recompute) settings = fmt::format("model.recompute=\"{}\"", mode);
    if (try_stage != stage) {
      settings += fmt::format("{}parallel.zero_stage={}", settings.empty() ? "" : " and ", try_stage);
    }
    return fmt::format("; it fits with {} (activations {:.0f} MiB instead of {:.0f}, model state {:.0f} MiB, "
                       "{:.0f} MiB per rank in all)",
                       settings, mib(q.activation_bytes), mib(p.activation_bytes),
                       mib(q.state.model_state_bytes() + q.state.working_bytes), mib(q.host_to_allocate()));
  }
  return "";
}

}  // namespace

void check_fits(const MemoryPlan& p, std::int64_t available, int ranks_on_node, const config::Config& c,
                const Replan& replan) {
  const std::int64_t needed = p.host_to_allocate() * ranks_on_node;
  if (available <= 0 || needed <= available) return;
  const std::string change = replan ? fitting_change(p, available, ranks_on_node, c, replan) : "";
  throw Error(fmt::format(
      "this run needs about {:.0f} MiB more host memory per rank ({:.0f} MiB of model state at ZeRO stage {}, "
      "{:.0f} MiB of activations, {:.0f} MiB of data batches), {:.0f} MiB for the {} rank(s) on this node, but "
      "{:.0f} MiB are available{}",
      mib(p.host_to_allocate()), mib(p.state.model_state_bytes() + p.state.working_bytes),
      c.parallel().zero_stage(), mib(p.activation_bytes), mib(p.loader_bytes), mib(needed), ranks_on_node,
      mib(available),
      !change.empty() ? change
                      : "; raise parallel.zero_stage (3 shards parameters, gradients and moments over the ranks), "
                        "set model.recompute (\"selective\" or \"full\": activations computed again in backward), "
                        "use more ranks, or lower train.micro_batch_size (activations grow with it)"));
}

}  // namespace dtrain::worker
