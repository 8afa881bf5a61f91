#include "nn/cpu/weight_pack.h"

#include <cstring>

// GCC 12 reports its own unpack intrinsics' undefined pass-through operand.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include "nn/cpu/isa.h"

namespace dtrain::nn::cpu {
namespace {

// AVX-512 code, compiled for it whatever the build's baseline and called only
// where cpu_isa().avx512 (the layouts are AVX-512 brgemm's alone).
#define DTRAIN_AVX512 __attribute__((target("avx512f")))

// Rows r[0..16) of 16 words each become the columns.
DTRAIN_AVX512 inline void transpose16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int i = 0; i < 16; i += 8) {
    for (int j = 0; j < 4; ++j) {
      t[i + j] = _mm512_shuffle_i32x4(r[i + j], r[i + j + 4], 0x88);
      t[i + j + 4] = _mm512_shuffle_i32x4(r[i + j], r[i + j + 4], 0xdd);
    }
  }
  for (int j = 0; j < 8; ++j) {
    r[j] = _mm512_shuffle_i32x4(t[j], t[j + 8], 0x88);
    r[j + 8] = _mm512_shuffle_i32x4(t[j], t[j + 8], 0xdd);
  }
}

// Words [0, whole) of 16 columns, 16 at a time: whole is a multiple of 16.
DTRAIN_AVX512 void transpose_columns16(const std::uint32_t* src, std::int64_t ld, std::int64_t whole,
                                       std::uint32_t* dst) {
  for (std::int64_t w0 = 0; w0 < whole; w0 += 16) {
    __m512i r[16];
    for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(src + i * ld + w0);
    transpose16(r);
    for (int i = 0; i < 16; ++i) _mm512_storeu_si512(dst + (w0 + i) * kWeightPackN, r[i]);
  }
}

// dst[n-block][w][j] = src[(n-block * 64 + j) * ld + w] for w < words.
void pack_transposed_words(const std::uint32_t* src, std::int64_t ld, std::int64_t words, std::int64_t n,
                           std::uint32_t* dst) {
  const std::int64_t whole = cpu_isa().avx512 ? words / 16 * 16 : 0;
  for (std::int64_t n0 = 0; n0 < n; n0 += kWeightPackN, dst += words * kWeightPackN) {
    for (std::int64_t j0 = 0; j0 < kWeightPackN; j0 += 16) {
      if (whole > 0) transpose_columns16(src + (n0 + j0) * ld, ld, whole, dst + j0);
      for (std::int64_t j = j0; j < j0 + 16; ++j) {
        const std::uint32_t* column = src + (n0 + j) * ld;
        for (std::int64_t w = whole; w < words; ++w) dst[w * kWeightPackN + j] = column[w];
      }
    }
  }
}

}  // namespace

void pack_weight_f32(const float* b, bool trans, std::int64_t k, std::int64_t n, std::int64_t ld, float* dst) {
  if (trans) {
    pack_transposed_words(reinterpret_cast<const std::uint32_t*>(b), ld, k, n, reinterpret_cast<std::uint32_t*>(dst));
    return;
  }
  for (std::int64_t n0 = 0; n0 < n; n0 += kWeightPackN) {
    for (std::int64_t kk = 0; kk < k; ++kk, dst += kWeightPackN) {
      std::memcpy(dst, b + kk * ld + n0, kWeightPackN * sizeof(float));
    }
  }
}

void pack_weight_bf16(const std::uint16_t* b, bool trans, std::int64_t k, std::int64_t n, std::int64_t ld,
               std::uint16_t* dst) {
  auto* out = reinterpret_cast<std::uint32_t*>(dst);
  if (trans) {
    pack_transposed_words(reinterpret_cast<const std::uint32_t*>(b), ld / 2, k / 2, n, out);
    return;
  }
  for (std::int64_t n0 = 0; n0 < n; n0 += kWeightPackN) {
    for (std::int64_t kk = 0; kk < k; kk += 2, out += kWeightPackN) {
      const std::uint16_t* even = b + kk * ld + n0;
      const std::uint16_t* odd = even + ld;
      for (std::int64_t j = 0; j < kWeightPackN; ++j) out[j] = std::uint32_t{even[j]} | std::uint32_t{odd[j]} << 16;
    }
  }
}

}  // namespace dtrain::nn::cpu
