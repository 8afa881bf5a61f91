#include "comm/gloo/reduce_scatter.h"

#include <algorithm>
#include <cstring>

#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

namespace dtrain::comm::gloo_backend {
namespace {

// A prefix for gloo's slot space that gloo's own collectives do not use.
constexpr std::uint8_t kSlotPrefix = 0x7d;

// dst = a (op) b, elementwise.
void combine(float* dst, const float* a, const float* b, std::size_t n, bool max) {
  if (max) {
    for (std::size_t i = 0; i < n; ++i) dst[i] = std::max(a[i], b[i]);
  } else {
    for (std::size_t i = 0; i < n; ++i) dst[i] = a[i] + b[i];
  }
}

std::chrono::milliseconds left(std::chrono::steady_clock::time_point deadline) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  return std::max(ms, std::chrono::milliseconds(1));
}

}  // namespace

// Step s sends the partial sum of chunk (r-s-1) to the right neighbour and
// receives the left one's partial of chunk (r-s-2), adding this rank's own
// contribution; after n-1 steps rank r holds the full reduction of chunk r.
void ring_reduce_scatter(::gloo::Context& context, const float* input, float* output,
                         std::size_t count, bool max, std::uint32_t tag,
                         std::chrono::steady_clock::time_point deadline, Staging& staging) {
  const int n = context.size;
  const int r = context.rank;
  const std::size_t bytes = count * sizeof(float);
  if (n == 1) {
    if (output != input) std::memmove(output, input, bytes);
    return;
  }
  float* partial[2] = {staging.floats(1, count), staging.floats(2, count)};
  auto own = context.createUnboundBuffer(const_cast<float*>(input), bytes * static_cast<std::size_t>(n));
  std::unique_ptr<::gloo::transport::UnboundBuffer> bufs[2] = {
      context.createUnboundBuffer(partial[0], bytes), context.createUnboundBuffer(partial[1], bytes)};
  const std::uint64_t slot = ::gloo::Slot::build(kSlotPrefix, tag);
  const int right = (r + 1) % n;
  const int left_rank = (r + n - 1) % n;
  for (int s = 0; s < n - 1; ++s) {
    const std::size_t send_chunk = static_cast<std::size_t>((r - s - 1 + 2 * n) % n);
    const std::size_t recv_chunk = static_cast<std::size_t>((r - s - 2 + 2 * n) % n);
    auto& recv_buf = bufs[s % 2];
    recv_buf->recv(left_rank, slot);
    if (s == 0) {
      own->send(right, slot, send_chunk * bytes, bytes);
    } else {
      bufs[(s - 1) % 2]->send(right, slot);
    }
    recv_buf->waitRecv(left(deadline));
    if (s == 0) {
      own->waitSend(left(deadline));
    } else {
      bufs[(s - 1) % 2]->waitSend(left(deadline));
    }
    float* target = s == n - 2 ? output : partial[s % 2];
    combine(target, partial[s % 2], input + recv_chunk * count, count, max);
  }
}

}  // namespace dtrain::comm::gloo_backend
