// The units of work of the attention steps (nn/attention_steps.h): a group
// of (batch, head) pairs with the buffers its steps use, and a tile of its
// query rows. Plain types with no dependencies, so CUDA sources include them.
#pragma once

#include <cstdint>

namespace dtrain::nn {

// Query rows row0 .. row0 + rows of each pair in a group, against keys 0 .. keys.
struct AttentionTile {
  std::int64_t row0 = 0, rows = 0, keys = 0;
};

// One group of pairs (pair = b * H + h) and the buffers its steps use.
// Tile buffers hold [pairs, rows, keys] (scores, dp, probs, d_scores) or
// [pairs, rows, hd] (o in forward); the rest hold every row of each pair.
template <class T>
struct AttentionGroup {
  std::int64_t pair0 = 0, pairs = 0;
  T *q, *k, *v;          // [pairs, T, hd]: saved
  float* lse;            // [pairs, T]: saved
  float *scores, *dp;    // f32 S and dP of a tile
  T *probs, *d_scores;   // P and dS of a tile (alias scores, dp when T is float)
  T* o;                  // forward: a tile's O; backward: dO [pairs, T, hd]
  float *dq, *dk, *dv;   // [pairs, T, hd] (backward)
};

// What of AttentionScratch a kernel set has the graph allocate: nothing (the
// CPU), delta alone (the GPU's one-pass kernels), or the whole batch's.
enum class AttentionScratchKind { none, rows, whole_batch };

// The GPU's attention for `pairs` (batch x heads) of seq x head_dim: the
// tiled steps over the whole-batch scratch (cuBLAS products; on an H200 the
// faster at every size measured) while its f32 S and dP, 8 * pairs * seq^2
// bytes, fit in attention_scratch_limit(); beyond, the one-pass kernels
// (nn/cuda/attention.h), which keep no [T, T] tensor, where the head dim is
// at most kOnePassMaxHeadDim. The kernel set runs the one-pass kernels
// exactly when the scratch it is given has no scores.
constexpr std::int64_t kOnePassMaxHeadDim = 128;
// DTRAIN_ATTENTION_SCRATCH_MB (MiB) if set, else 1024 MiB, in bytes; read once.
std::int64_t attention_scratch_limit();
// The limit a DTRAIN_ATTENTION_SCRATCH_MB value `mb` (null or empty: unset) sets, in bytes.
std::int64_t attention_scratch_limit(const char* mb);
AttentionScratchKind gpu_attention_scratch(std::int64_t pairs, std::int64_t seq, std::int64_t head_dim,
                                           std::int64_t limit = attention_scratch_limit());

}  // namespace dtrain::nn
