// Weights in the layouts oneDNN's brgemm matmuls pick on AVX-512, made by
// dtrain's own copy loops (2-4x oneDNN 2.6's reorders): cpu::gemm_weights
// (matmul.h) keeps its copies of B this way where the primitive asks for one
// of them. The AVX-512 transposes are compiled for it whatever the build's
// baseline and run where cpu_isa().avx512 (nn/cpu/isa.h); the same bytes
// either way. Pure functions: callable from any thread.
#pragma once

#include <cstdint>

namespace dtrain::nn::cpu {

// B [k, n] into oneDNN's BA16a64b (f32) or BA16a64b2a (bf16), the layouts
// its brgemm matmuls pick for a weight on AVX-512: blocks of 64 n by 16 k
// (f32) or 32 k as 16 pairs k, k + 1 innermost (bf16), the n-blocks
// outermost. As 32-bit words (an f32, or a bf16 pair) each n-block is then a
// row-major [words, 64] array, its k-blocks one after another. B is stored
// row by row (b + k * ld), or with trans column by column (b + n * ld: a
// linear layer's weight in its forward), where the copy is a transpose of
// words. oneDNN 2.6's reorders into these layouts took 0.13-0.41 ms per MiB
// here, the transposing ones slowest; these loops 0.055 (rows) and 0.083
// (transpose) for f32. REQUIRES k a multiple of the k-block, n of 64.
constexpr std::int64_t kWeightPackN = 64;

// f32 B into BA16a64b: dst holds k * n floats.
void pack_weight_f32(const float* b, bool trans, std::int64_t k, std::int64_t n, std::int64_t ld, float* dst);
// bf16 B into BA16a64b2a: dst holds k * n elements.
void pack_weight_bf16(const std::uint16_t* b, bool trans, std::int64_t k, std::int64_t n, std::int64_t ld,
                      std::uint16_t* dst);

}  // namespace dtrain::nn::cpu
