#include "comm/gloo/backend.h"

#include <signal.h>

#include <cstring>
#include <exception>
#include <string_view>

#include <fmt/format.h>
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/transport/tcp/device.h>

#include "comm/gloo/reduce_scatter.h"
#include "comm/gloo/store_adapter.h"
#include "core/error.h"
#include "core/syscall.h"

namespace dtrain::comm::gloo_backend {
namespace {

using ReduceFn = void (*)(void*, const void*, const void*, std::size_t);

std::chrono::milliseconds time_left(const Op& op) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
      op.deadline - std::chrono::steady_clock::now());
  return std::max(ms, std::chrono::milliseconds(1));
}

// gloo tags are 32 bits; operations run one at a time, so wrapping is harmless.
std::uint32_t tag_of(const Op& op) { return static_cast<std::uint32_t>(op.seq); }

// Runs `f`, a call into gloo doing `operation` ("allreduce"), and turns what
// gloo throws into dtrain's errors, keeping gloo's text: "gloo allreduce:
// <text>", a TimeoutError when gloo timed out, a CommError otherwise (any
// std::exception, so that none leaves the backend untyped). dtrain's own
// errors (the store under the rendezvous, ring_reduce_scatter) pass as they are.
template <typename F>
void translate_errors(std::string_view operation, F&& f) {
  const auto text = [operation](const std::exception& e) { return fmt::format("gloo {}: {}", operation, e.what()); };
  try {
    f();
  } catch (const Error&) {
    throw;
  } catch (const ::gloo::IoException& e) {
    if (std::string_view(e.what()).find("Timed out") != std::string_view::npos) throw TimeoutError(text(e));
    throw CommError(text(e));
  } catch (const ::gloo::Exception& e) {
    throw CommError(text(e));
  } catch (const ::gloo::EnforceNotMet& e) {
    throw CommError(text(e));
  } catch (const std::exception& e) {
    throw CommError(text(e));
  }
}

// gloo writes to its sockets with writev, which raises SIGPIPE when a peer
// has died; by default that kills this process without a word, before gloo
// can report the broken pair. Ignoring it (as Python does for PyTorch) turns
// it into EPIPE, which gloo reports and translate_errors makes a CommError.
// A handler the program installed itself is left alone.
void ignore_sigpipe_unless_handled() {
  struct sigaction current {};
  DTRAIN_SYSCALL(::sigaction(SIGPIPE, nullptr, &current));
  if (current.sa_handler != SIG_DFL) return;
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  DTRAIN_SYSCALL(::sigaction(SIGPIPE, &ignore, nullptr));
}

}  // namespace

GlooBackend::GlooBackend(int rank, int world_size, std::shared_ptr<Store> store, Duration timeout,
                         const std::string& hostname)
    : rank_(rank), world_size_(world_size) {
  ignore_sigpipe_unless_handled();
  ::gloo::transport::tcp::attr attr(hostname.c_str());
  std::shared_ptr<::gloo::transport::Device> device;
  translate_errors(fmt::format("device on {}", hostname),
                   [&] { device = ::gloo::transport::tcp::CreateDevice(attr); });
  context_ = std::make_shared<::gloo::rendezvous::Context>(rank, world_size);
  context_->setTimeout(timeout);
  StoreAdapter adapter(std::move(store), timeout);
  try {
    translate_errors("connect", [&] { context_->connectFullMesh(adapter, device); });
  } catch (const Error& e) {
    throw CommError(fmt::format(
        "rank {}: gloo could not connect to the other {} rank(s) within {} ms: {}. Check that every "
        "rank started and that {} is reachable from the others",
        rank, world_size - 1, timeout.count(), e.what(), hostname));
  }
}

void GlooBackend::run(const Op& op) {
  translate_errors(op_kind_name(op.kind), [&] {
    switch (op.kind) {
      case OpKind::allreduce: return allreduce(op);
      case OpKind::reduce_scatter: return reduce_scatter(op);
      case OpKind::allgather: return allgather(op);
      case OpKind::broadcast: return broadcast(op);
      case OpKind::barrier: return barrier(op);
    }
  });
}

void GlooBackend::allreduce_f32(float* data, std::size_t count, bool max, const Op& op) {
  if (world_size_ == 1) return;
  ::gloo::AllreduceOptions opts(context_);
  opts.setOutput(data, count);
  opts.setReduceFunction(max ? static_cast<ReduceFn>(&::gloo::max<float>)
                             : static_cast<ReduceFn>(&::gloo::sum<float>));
  opts.setTag(tag_of(op));
  opts.setTimeout(time_left(op));
  ::gloo::allreduce(opts);
}

void GlooBackend::allreduce(const Op& op) {
  if (op.count == 0) return;
  const bool max = op.reduce == ReduceOp::max;
  const float scale = op.reduce == ReduceOp::avg ? 1.0f / static_cast<float>(world_size_) : 1.0f;
  if (op.dtype == DType::f32) {
    auto* data = static_cast<float*>(op.output);
    allreduce_f32(data, op.count, max, op);
    if (scale != 1.0f) scale_f32(data, scale, op.count);
    return;
  }
  float* wide = staging_.floats(0, op.count);
  widen(op.output, op.dtype, wide, op.count);
  allreduce_f32(wide, op.count, max, op);
  narrow(wide, scale, op.dtype, op.output, op.count);
}

void GlooBackend::reduce_scatter(const Op& op) {
  if (op.count == 0) return;
  const bool max = op.reduce == ReduceOp::max;
  const float scale = op.reduce == ReduceOp::avg ? 1.0f / static_cast<float>(world_size_) : 1.0f;
  const std::size_t total = op.count * static_cast<std::size_t>(world_size_);
  if (op.dtype == DType::f32) {
    auto* out = static_cast<float*>(op.output);
    ring_reduce_scatter(*context_, static_cast<const float*>(op.input), out, op.count, max,
                        tag_of(op), op.deadline, staging_);
    if (scale != 1.0f) scale_f32(out, scale, op.count);
    return;
  }
  float* wide = staging_.floats(0, total);
  widen(op.input, op.dtype, wide, total);
  float* own = wide + static_cast<std::size_t>(rank_) * op.count;  // in place in the staging copy
  ring_reduce_scatter(*context_, wide, own, op.count, max, tag_of(op), op.deadline, staging_);
  narrow(own, scale, op.dtype, op.output, op.count);
}

void GlooBackend::allgather(const Op& op) {
  if (op.count == 0) return;
  const std::size_t bytes = op.bytes();
  auto* out = static_cast<std::uint8_t*>(op.output);
  std::uint8_t* own = out + static_cast<std::size_t>(rank_) * bytes;
  if (op.input != own) std::memcpy(own, op.input, bytes);
  if (world_size_ == 1) return;
  ::gloo::AllgatherOptions opts(context_);
  opts.setOutput(out, bytes * static_cast<std::size_t>(world_size_));  // own slice already in place
  opts.setTag(tag_of(op));
  opts.setTimeout(time_left(op));
  ::gloo::allgather(opts);
}

void GlooBackend::broadcast(const Op& op) {
  if (op.count == 0 || world_size_ == 1) return;
  ::gloo::BroadcastOptions opts(context_);
  opts.setOutput(static_cast<std::uint8_t*>(op.output), op.bytes());
  opts.setRoot(op.root);
  opts.setTag(tag_of(op));
  opts.setTimeout(time_left(op));
  ::gloo::broadcast(opts);
}

void GlooBackend::barrier(const Op& op) {
  if (world_size_ == 1) return;
  ::gloo::BarrierOptions opts(context_);
  opts.setTag(tag_of(op));
  opts.setTimeout(time_left(op));
  ::gloo::barrier(opts);
}

}  // namespace dtrain::comm::gloo_backend
