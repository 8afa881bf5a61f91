#include "nn/cpu/gemm_avx2.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include <fmt/format.h>

#include "core/aligned_buffer.h"
#include "core/cpu.h"
#include "core/error.h"
#include "nn/cpu/isa.h"

// This file is compiled for AVX2 and FMA alone whatever the build's -march
// (nn/CMakeLists.txt): built for AVX-512, GCC 12 keeps the tile loop's A-row
// pointers in vector registers and moves them back in the hot loop. Called
// only where the CPU has AVX2 and FMA (avx2_gemm_supported).

namespace dtrain::nn::cpu {
namespace {

constexpr std::int64_t kMR = 6;    // rows of the register tile
constexpr std::int64_t kNR = 16;   // columns of the register tile: two ymm
constexpr std::int64_t kKC = 256;  // k per packed block: a B panel (16 KiB) stays in L1
constexpr std::int64_t kMC = 96;   // rows of A per packed block (96 KiB): in L2
constexpr std::int64_t kNC = 1024; // columns of B per packed block (1 MiB)

// Whether block_product reads A (not transposed) as stored rather than
// packed, for n columns and depth k: up to 128 columns always; up to 256 when
// k fits one block. Measured one thread, in one process, interleaved (the
// results are the same bits either way): packed, a head's projection and dO
// (n = 64) ran 0.91-0.98x at k = 512 (12% slower at k = 256), n = 128 0.97x
// at k = 512, lm-small's proj (n = 256, k = 256) 0.99-1.00x; but fc2's
// forward and fc1's input gradient (n = 256, k = 1024) 1.02-1.06x and qkv's
// input gradient (k = 768) 1.01-1.04x.
constexpr bool reads_a_as_stored(std::int64_t n, std::int64_t k) { return n <= 128 || (n <= 256 && k <= kKC); }

std::int64_t round_up(std::int64_t x, std::int64_t to) { return (x + to - 1) / to * to; }

// op(A)[i, k] and op(B)[k, j] of one item.
struct View {
  const float* p;
  std::int64_t ld;
  bool trans;
};

// This thread's pack buffers, grown to the largest blocks seen. Each has 8
// floats of slack: the transposing packs store 8 floats where 6 are kept.
struct Scratch {
  AlignedBuffer<float> a, b;
};

float* grown(AlignedBuffer<float>& buf, std::int64_t floats) {
  const auto size = static_cast<std::size_t>(floats + 8);
  if (buf.size() < size) buf = AlignedBuffer<float>(size);
  return buf.data();
}

Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

// Transposes the 8 x 8 block in r[0..7] (rows) into r[0..7] (columns).
inline void transpose8(__m256 r[8]) {
  const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
  const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
  const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
  const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  const __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE);
  const __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE);
  const __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE);
  const __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  r[0] = _mm256_permute2f128_ps(s0, s4, 0x20);
  r[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
  r[2] = _mm256_permute2f128_ps(s2, s6, 0x20);
  r[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
  r[4] = _mm256_permute2f128_ps(s0, s4, 0x31);
  r[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
  r[6] = _mm256_permute2f128_ps(s2, s6, 0x31);
  r[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}

// Packs `width` (<= 8 or 16) logical rows x kc of a matrix whose rows run
// along k (row r at src[r * ld + k]) into dst as [kc][panel] with panel
// floats per k; rows past `width` are zero. 8 rows at a time through
// transpose8; the stores of a panel of 6 write 8 floats, the next k's store
// (or the next panel, or the slack) takes the 2 extra.
void pack_rows_along_k(const float* src, std::int64_t ld, std::int64_t width, std::int64_t kc,
                       std::int64_t panel, float* dst) {
  for (std::int64_t h = 0; h < panel; h += 8) {
    const float* rows[8];
    static const float zeros[8] = {};
    const std::int64_t live = std::clamp<std::int64_t>(width - h, 0, 8);
    std::int64_t k = 0;
    for (; k + 8 <= kc; k += 8) {
      __m256 r[8];
      for (std::int64_t i = 0; i < 8; ++i) {
        r[i] = i < live ? _mm256_loadu_ps(src + (h + i) * ld + k) : _mm256_setzero_ps();
      }
      transpose8(r);
      for (std::int64_t i = 0; i < 8; ++i) _mm256_storeu_ps(dst + (k + i) * panel + h, r[i]);
    }
    for (std::int64_t i = 0; i < 8; ++i) rows[i] = i < live ? src + (h + i) * ld : zeros;
    for (; k < kc; ++k) {
      for (std::int64_t i = 0; i < std::min<std::int64_t>(8, panel - h); ++i) {
        dst[k * panel + h + i] = i < live ? rows[i][k] : 0.0f;
      }
    }
  }
}

// Packs `width` logical columns x kc of a matrix stored along the columns
// (column c of row k at src[k * ld + c]) into panels of kPanel columns,
// [kc][kPanel] each and kc * kPanel floats apart; columns past `width` are
// zero. Row by row, each row read once and in order and spread over the
// panels; the short rows of an A block (at most kMC floats) are asked for
// kRowsAhead rows ahead, as the prefetchers see only a few lines of each
// before the jump to the next. Panel by panel down the rows (64 bytes or
// fewer a row, ld apart), the packs of a transposed A and a plain B took
// 3.1-3.5% of an lm-small step, 2.0-2.1% this way (perf samples, one
// thread). A panel of 6 is stored 8 floats at a time: the next k's store
// takes the 2 extra, and the last k's store writes 6.
constexpr std::int64_t kRowsAhead = 16;
template <std::int64_t kPanel>
void pack_along_rows(const float* src, std::int64_t ld, std::int64_t width, std::int64_t kc,
                     float* dst) {
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const auto first = [&](std::int64_t count) {  // lanes [0, count)
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(count)), lanes);
  };
  const std::int64_t panels = (width + kPanel - 1) / kPanel;
  const __m256i last_store = first(std::min<std::int64_t>(kPanel, 8));
  for (std::int64_t k = 0; k < kc; ++k) {
    const float* row = src + k * ld;
    const bool last_k = k + 1 == kc;
    if (kPanel == kMR && k + kRowsAhead < kc) {
      const char* ahead = reinterpret_cast<const char*>(row + kRowsAhead * ld);
      for (std::int64_t at = 0; at < width * 4; at += 64) _mm_prefetch(ahead + at, _MM_HINT_T0);
    }
    for (std::int64_t q = 0; q < panels; ++q) {
      float* out = dst + q * kc * kPanel + k * kPanel;
      for (std::int64_t h = 0; h < kPanel; h += 8) {
        const std::int64_t live = width - q * kPanel - h;
        const float* from = row + q * kPanel + h;
        const __m256 v = live >= 8 ? _mm256_loadu_ps(from)
                                   : (live > 0 ? _mm256_maskload_ps(from, first(live)) : _mm256_setzero_ps());
        if (kPanel - h >= 8 || !last_k) {
          _mm256_storeu_ps(out + h, v);
        } else {
          _mm256_maskstore_ps(out + h, last_store, v);
        }
      }
    }
  }
}

// op(A) rows [i0, i0 + mc), k [p0, p0 + kc) -> panels of kMR rows, [kc][kMR] each.
void pack_a(const View& a, std::int64_t i0, std::int64_t mc, std::int64_t p0, std::int64_t kc,
            float* dst) {
  if (a.trans) {
    pack_along_rows<kMR>(a.p + p0 * a.ld + i0, a.ld, mc, kc, dst);
    return;
  }
  for (std::int64_t i = 0; i < mc; i += kMR, dst += kc * kMR) {
    pack_rows_along_k(a.p + (i0 + i) * a.ld + p0, a.ld, std::min(kMR, mc - i), kc, kMR, dst);
  }
}

// op(B) k [p0, p0 + kc), columns [j0, j0 + nc) -> panels of kNR columns, [kc][kNR] each.
void pack_b(const View& b, std::int64_t p0, std::int64_t kc, std::int64_t j0, std::int64_t nc,
            float* dst) {
  if (!b.trans) {
    pack_along_rows<kNR>(b.p + p0 * b.ld + j0, b.ld, nc, kc, dst);
    return;
  }
  for (std::int64_t j = 0; j < nc; j += kNR, dst += kc * kNR) {
    pack_rows_along_k(b.p + (j0 + j) * b.ld + p0, b.ld, std::min(kNR, nc - j), kc, kNR, dst);
  }
}

// How a tile's sums land in C: c = alpha * sum (+ bias on the first k block)
// (+ C, when accumulating or after the first k block).
struct Epilogue {
  float alpha;
  const float* bias;  // at the tile's first column, or null
  bool add_c;
};

// The 6 x 16 tile C[0..6, 0..16) at ldc from a packed panel b [kc][16] and
// six rows of A: row r's k-th element at a[r][k * kStep] (kStep = kMR: a
// packed panel, a[r] = panel + r; kStep = 1: A as stored, one row each).
template <std::int64_t kStep>
void tile(std::int64_t kc, const float* const a[kMR], const float* b, float* c, std::int64_t ldc,
          const Epilogue& e) {
  __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
  __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
  for (std::int64_t i = 0; i < kMR; ++i) {
    _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc + kNR - 1), _MM_HINT_T0);
  }
  const float *a0 = a[0], *a1 = a[1], *a2 = a[2], *a3 = a[3], *a4 = a[4], *a5 = a[5];
#pragma GCC unroll 4
  for (std::int64_t k = 0; k < kc; ++k, b += kNR) {
    const std::int64_t at = k * kStep;
    const __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8);
    __m256 x = _mm256_broadcast_ss(a0 + at);
    c00 = _mm256_fmadd_ps(x, b0, c00), c01 = _mm256_fmadd_ps(x, b1, c01);
    x = _mm256_broadcast_ss(a1 + at);
    c10 = _mm256_fmadd_ps(x, b0, c10), c11 = _mm256_fmadd_ps(x, b1, c11);
    x = _mm256_broadcast_ss(a2 + at);
    c20 = _mm256_fmadd_ps(x, b0, c20), c21 = _mm256_fmadd_ps(x, b1, c21);
    x = _mm256_broadcast_ss(a3 + at);
    c30 = _mm256_fmadd_ps(x, b0, c30), c31 = _mm256_fmadd_ps(x, b1, c31);
    x = _mm256_broadcast_ss(a4 + at);
    c40 = _mm256_fmadd_ps(x, b0, c40), c41 = _mm256_fmadd_ps(x, b1, c41);
    x = _mm256_broadcast_ss(a5 + at);
    c50 = _mm256_fmadd_ps(x, b0, c50), c51 = _mm256_fmadd_ps(x, b1, c51);
  }
  const __m256 sums[kMR][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51}};
  const __m256 alpha = _mm256_set1_ps(e.alpha);
  const bool scale = e.alpha != 1.0f;
  for (std::int64_t i = 0; i < kMR; ++i) {
    float* row = c + i * ldc;
    for (std::int64_t h = 0; h < 2; ++h) {
      __m256 v = scale ? _mm256_mul_ps(sums[i][h], alpha) : sums[i][h];
      if (e.bias != nullptr) v = _mm256_add_ps(v, _mm256_loadu_ps(e.bias + 8 * h));
      if (e.add_c) v = _mm256_add_ps(v, _mm256_loadu_ps(row + 8 * h));
      _mm256_storeu_ps(row + 8 * h, v);
    }
  }
}

// A tile of rows x cols (at most 6 x 16) through a full tile in registers.
template <std::int64_t kStep>
void edge_tile(std::int64_t kc, const float* const a[kMR], const float* b, float* c, std::int64_t ldc,
               std::int64_t rows, std::int64_t cols, Epilogue e) {
  alignas(32) float t[kMR * kNR] = {};
  alignas(32) float bias[kNR] = {};
  if (e.bias != nullptr) {
    std::memcpy(bias, e.bias, static_cast<std::size_t>(cols) * sizeof(float));
    e.bias = bias;
  }
  const auto bytes = static_cast<std::size_t>(cols) * sizeof(float);
  for (std::int64_t i = 0; i < rows; ++i) std::memcpy(t + i * kNR, c + i * ldc, bytes);
  tile<kStep>(kc, a, b, t, kNR, e);
  for (std::int64_t i = 0; i < rows; ++i) std::memcpy(c + i * ldc, t + i * kNR, bytes);
}

// The tiles of C rows [i0, i0 + mc) x columns [j0, j0 + nc) for one block of k
// (packed B panels pb), A as a[r] gives it (see tile).
template <std::int64_t kStep, class RowsOfA>
void tiles(std::int64_t mc, std::int64_t nc, std::int64_t kc, RowsOfA rows_of_a, const float* pb,
           float* c, std::int64_t ldc, const float* bias, float alpha, bool add_c) {
  for (std::int64_t jr = 0; jr < nc; jr += kNR) {
    const std::int64_t cols = std::min(kNR, nc - jr);
    const Epilogue e{alpha, bias != nullptr ? bias + jr : nullptr, add_c};
    for (std::int64_t ir = 0; ir < mc; ir += kMR) {
      const std::int64_t rows = std::min(kMR, mc - ir);
      const float* a[kMR];
      rows_of_a(ir, rows, a);
      float* out = c + ir * ldc + jr;
      if (rows == kMR && cols == kNR) {
        tile<kStep>(kc, a, pb + jr * kc, out, ldc, e);
      } else {
        edge_tile<kStep>(kc, a, pb + jr * kc, out, ldc, rows, cols, e);
      }
    }
  }
}

// C rows [i0, i1) x columns [j0, j1) of one item, k in blocks of kKC. A as
// stored (not transposed) feeds the tiles directly when B is narrow
// (reads_a_as_stored): packing it would cost more than its reuse over so few
// columns saves.
void block_product(const Gemm& g, const View& a, const View& b, float* c, std::int64_t ldc,
                   const float* bias, std::int64_t i0, std::int64_t i1, std::int64_t j0,
                   std::int64_t j1) {
  Scratch& s = scratch();
  const bool direct = !a.trans && reads_a_as_stored(g.n, g.k);
  for (std::int64_t jc = j0; jc < j1; jc += kNC) {
    const std::int64_t nc = std::min(kNC, j1 - jc);
    for (std::int64_t pc = 0; pc < g.k; pc += kKC) {
      const std::int64_t kc = std::min(kKC, g.k - pc);
      float* pb = grown(s.b, kc * round_up(nc, kNR));
      pack_b(b, pc, kc, jc, nc, pb);
      const float* block_bias = pc == 0 && bias != nullptr ? bias + jc : nullptr;
      const bool add_c = g.accumulate || pc > 0;
      for (std::int64_t ic = i0; ic < i1; ic += kMC) {
        const std::int64_t mc = std::min(kMC, i1 - ic);
        float* out = c + ic * ldc + jc;
        if (direct) {
          // Rows past the tile's last repeat it: read, never stored.
          const auto rows_of_a = [&](std::int64_t ir, std::int64_t rows, const float* r[kMR]) {
            for (std::int64_t i = 0; i < kMR; ++i) r[i] = a.p + (ic + ir + std::min(i, rows - 1)) * a.ld + pc;
          };
          tiles<1>(mc, nc, kc, rows_of_a, pb, out, ldc, block_bias, g.alpha, add_c);
          continue;
        }
        float* pa = grown(s.a, kc * round_up(mc, kMR));
        pack_a(a, ic, mc, pc, kc, pa);
        const auto rows_of_a = [&](std::int64_t ir, std::int64_t, const float* r[kMR]) {
          for (std::int64_t i = 0; i < kMR; ++i) r[i] = pa + ir * kc + i;
        };
        tiles<kMR>(mc, nc, kc, rows_of_a, pb, out, ldc, block_bias, g.alpha, add_c);
      }
    }
  }
}

}  // namespace

bool avx2_gemm_supported() { return cpu_isa().avx2_fma; }

bool avx2_gemm_preferred(const char* choice) {
  const std::string_view c = choice != nullptr ? choice : "";
  if (c == "onednn") return false;
  if (c == "avx2") {
    if (!avx2_gemm_supported()) {
      throw Error(fmt::format("DTRAIN_CPU_GEMM=avx2: this CPU ({}) has no AVX2 and FMA, or oneDNN is capped below "
                              "them (ONEDNN_MAX_CPU_ISA); unset the variable or use onednn",
                              cpu_model_name()));
    }
    return true;
  }
  if (!c.empty() && c != "auto") {
    throw Error(fmt::format("DTRAIN_CPU_GEMM={}: use auto (the default: dtrain's AVX2 kernel where the CPU, or "
                            "oneDNN's ISA cap, has AVX2 without AVX-512), avx2 (the AVX2 kernel on any CPU with "
                            "AVX2 and FMA) or onednn (oneDNN's matmul for every product)",
                            c));
  }
  return avx2_gemm_supported() && !cpu_isa().avx512;
}

bool avx2_gemm_preferred() {
  static const bool preferred = avx2_gemm_preferred(std::getenv("DTRAIN_CPU_GEMM"));
  return preferred;
}

void avx2_gemm(const Gemm& g, const float* a, const float* b, float* c, const float* bias) {
  DTRAIN_CHECK(avx2_gemm_supported(), "avx2_gemm {} on a CPU without AVX2 and FMA", gemm_string(g));
  const Stored sa = stored_a(g), sb = stored_b(g), sc = stored_c(g);

  // Threads split C into bands of whole tiles, along whichever side has more
  // of them; one band each. Never along k: the sums do not depend on the split.
  const std::int64_t row_tiles = (g.m + kMR - 1) / kMR, col_tiles = (g.n + kNR - 1) / kNR;
  const bool by_rows = row_tiles >= col_tiles;
  const std::int64_t tiles = by_rows ? row_tiles : col_tiles;
  // At least 4 MFLOP each (2^22): a thread's team costs more than less saves.
  const std::int64_t flops = 2 * g.m * g.n * g.k;
  const std::int64_t team = omp_in_parallel() ? 1 : omp_get_max_threads();
  const int threads = static_cast<int>(std::min<std::int64_t>({team, tiles, std::max<std::int64_t>(1, flops >> 22)}));
  for (std::int64_t item = 0; item < g.batch; ++item) {
    const View va{a + item * sa.stride, sa.ld, g.trans_a};
    const View vb{b + item * sb.stride, sb.ld, g.trans_b};
    float* ci = c + item * sc.stride;
#pragma omp parallel for num_threads(threads) schedule(static, 1) if (threads > 1)
    for (int t = 0; t < threads; ++t) {
      const std::int64_t first = tiles * t / threads, last = tiles * (t + 1) / threads;
      if (by_rows) {
        block_product(g, va, vb, ci, sc.ld, bias, first * kMR, std::min(g.m, last * kMR), 0, g.n);
      } else {
        block_product(g, va, vb, ci, sc.ld, bias, 0, g.m, first * kNR, std::min(g.n, last * kNR));
      }
    }
  }
}

std::int64_t avx2_gemm_scratch_bytes(const Gemm& g) {
  const std::int64_t kc = std::min(kKC, g.k);
  const std::int64_t floats = kc * round_up(std::min(kMC, g.m), kMR) + kc * round_up(std::min(kNC, g.n), kNR) + 16;
  return floats * static_cast<std::int64_t>(sizeof(float));
}

}  // namespace dtrain::nn::cpu
