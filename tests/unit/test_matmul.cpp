// nn/cpu/matmul against a naive double-precision reference, plus the cache and
// allocation contracts and the oneDNN implementations picked for training shapes.
//
// Tolerance: |c - ref| <= 1e-5 * sqrt(k) * (|alpha| * sum_k |a||b| + |bias| + |c_old|),
// i.e. relative to the magnitude of what was summed (fp32 accumulation of k terms).
#include "nn/cpu/matmul.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <omp.h>
#include <random>
#include <stdexcept>
#include <string>
#include <sys/mman.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include <dnnl.hpp>
#include <gtest/gtest.h>

#include "core/error.h"
#include "nn/cpu/isa.h"
#include "nn/cpu/gemm_avx2.h"

// Counting global operator new/delete: counts only while g_count_allocs is set.
// Out of line, so that GCC does not pair an inlined free() with `new` and warn.
namespace {
std::atomic<bool> g_count_allocs{false};
std::atomic<long> g_allocs{0};
}  // namespace

[[gnu::noinline]] void* operator new(std::size_t size) {
  if (g_count_allocs.load(std::memory_order_relaxed)) g_allocs.fetch_add(1);
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
[[gnu::noinline]] void* operator new[](std::size_t size) { return operator new(size); }
[[gnu::noinline]] void operator delete(void* p) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete[](void* p) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete(void* p, std::size_t) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

namespace dtrain::nn::cpu {
namespace {

struct Operands {
  std::vector<float> a, b, c, bias;
};

std::int64_t rows_a(const Gemm& g) { return g.trans_a ? g.k : g.m; }
std::int64_t cols_a(const Gemm& g) { return g.trans_a ? g.m : g.k; }
std::int64_t rows_b(const Gemm& g) { return g.trans_b ? g.n : g.k; }
std::int64_t cols_b(const Gemm& g) { return g.trans_b ? g.k : g.n; }
std::int64_t ld_a(const Gemm& g) { return g.lda ? g.lda : cols_a(g); }
std::int64_t ld_b(const Gemm& g) { return g.ldb ? g.ldb : cols_b(g); }
std::int64_t ld_c(const Gemm& g) { return g.ldc ? g.ldc : g.n; }
std::int64_t str_a(const Gemm& g) { return g.stride_a ? g.stride_a : rows_a(g) * ld_a(g); }
std::int64_t str_b(const Gemm& g) { return g.stride_b ? g.stride_b : rows_b(g) * ld_b(g); }
std::int64_t str_c(const Gemm& g) { return g.stride_c ? g.stride_c : g.m * ld_c(g); }

// Buffers big enough for g, filled with values in [-1, 1]; padding of C holds a sentinel.
constexpr float kSentinel = 1234.5f;
Operands make_operands(const Gemm& g, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  auto fill = [&](std::int64_t n) {
    std::vector<float> v(static_cast<std::size_t>(n));
    for (float& x : v) x = dist(rng);
    return v;
  };
  Operands o;
  o.a = fill((g.batch - 1) * str_a(g) + rows_a(g) * ld_a(g));
  o.b = fill((g.batch - 1) * str_b(g) + rows_b(g) * ld_b(g));
  o.c.assign(static_cast<std::size_t>((g.batch - 1) * str_c(g) + g.m * ld_c(g)), kSentinel);
  for (std::int64_t i = 0; i < g.batch; ++i)
    for (std::int64_t r = 0; r < g.m; ++r)
      for (std::int64_t j = 0; j < g.n; ++j)
        o.c[static_cast<std::size_t>(i * str_c(g) + r * ld_c(g) + j)] = dist(rng);
  o.bias = fill(g.n);
  return o;
}

// Checks c_new against the double-precision reference computed from o (c_old = o.c).
void expect_matches_reference(const Gemm& g, const Operands& o, const std::vector<float>& c_new,
                              bool with_bias) {
  const double tol = 1e-5 * std::sqrt(static_cast<double>(g.k));
  int bad = 0;
  for (std::int64_t i = 0; i < g.batch; ++i) {
    const float* a = o.a.data() + i * str_a(g);
    const float* b = o.b.data() + i * str_b(g);
    for (std::int64_t r = 0; r < g.m; ++r) {
      for (std::int64_t j = 0; j < g.n; ++j) {
        double sum = 0, mag = 0;
        for (std::int64_t p = 0; p < g.k; ++p) {
          const double x = g.trans_a ? a[p * ld_a(g) + r] : a[r * ld_a(g) + p];
          const double y = g.trans_b ? b[j * ld_b(g) + p] : b[p * ld_b(g) + j];
          sum += x * y;
          mag += std::fabs(x * y);
        }
        double ref = g.alpha * sum;
        mag *= std::fabs(g.alpha);
        if (with_bias) {
          ref += o.bias[static_cast<std::size_t>(j)];
          mag += std::fabs(o.bias[static_cast<std::size_t>(j)]);
        }
        const auto at = static_cast<std::size_t>(i * str_c(g) + r * ld_c(g) + j);
        if (g.accumulate) {
          ref += o.c[at];
          mag += std::fabs(o.c[at]);
        }
        if (std::fabs(c_new[at] - ref) > tol * (mag + 1e-30) && bad++ < 5) {
          ADD_FAILURE() << gemm_string(g) << " bias=" << with_bias << " item " << i << " ("
                        << r << "," << j << "): got " << c_new[at] << ", want " << ref;
        }
      }
    }
  }
  // Elements of C outside the m x n views (padding of ldc / stride_c) are untouched.
  for (std::size_t at = 0; at < c_new.size(); ++at) {
    if (o.c[at] == kSentinel && c_new[at] != kSentinel && bad++ < 5) {
      ADD_FAILURE() << gemm_string(g) << ": padding element " << at << " was written";
    }
  }
  EXPECT_EQ(bad, 0) << gemm_string(g);
}

using Product = void (*)(const Gemm&, const float*, const float*, float*, const float*);

void run_and_check(const Gemm& g, bool with_bias, unsigned seed, Product product = gemm) {
  const Operands o = make_operands(g, seed);
  std::vector<float> c = o.c;
  product(g, o.a.data(), o.b.data(), c.data(), with_bias ? o.bias.data() : nullptr);
  expect_matches_reference(g, o, c, with_bias);
}

// Weight-gradient products whose A (transposed) or B (as stored) has rows a
// multiple of 1 KiB apart (4 KiB, 3 KiB, 1 KiB): where oneDNN's sgemm runs them
// (AVX2 alone), gemm() reads them through padded copies, with the product of
// the same operands stored 16 floats wider, bit for bit; everywhere the
// reference's result. Rows 48 floats apart are read as they are.
TEST(Matmul, OperandsWithRowsAMultipleOfOneKiBApartMatchReferenceAndTheirPaddedCopies) {
  Gemm dy_t{.m = 1024, .n = 48, .k = 256, .trans_a = true, .accumulate = true};  // A = dy^T, dy [256, 1024]
  Gemm x{.m = 48, .n = 1024, .k = 256, .trans_a = true, .accumulate = true};     // B = x [256, 1024]
  Gemm both{.m = 1024, .n = 1024, .k = 256, .trans_a = true};
  Gemm qkv{.m = 768, .n = 256, .k = 256, .trans_a = true, .accumulate = true};   // dy [256, 768], x [256, 256]
  unsigned seed = 50;
  for (const Gemm& g : {dy_t, x, both, qkv}) {
    const bool pads_a = g.m % 256 == 0, pads_b = g.n % 256 == 0;
    const bool sgemm = gemm_impl_info(g, false).rfind("gemm:jit", 0) == 0;
    const std::int64_t copies = sgemm ? 256 * ((pads_a ? g.m + 16 : 0) + (pads_b ? g.n + 16 : 0)) * 4 : 0;
    EXPECT_EQ(gemm_copy_bytes(g), copies) << gemm_string(g);
    const Operands o = make_operands(g, seed++);
    std::vector<float> c = o.c;
    gemm(g, o.a.data(), o.b.data(), c.data());
    expect_matches_reference(g, o, c, false);
    // The same operands stored 16 floats wider, run as they are.
    Gemm wide = g;
    if (pads_a) wide.lda = g.m + 16;
    if (pads_b) wide.ldb = g.n + 16;
    EXPECT_EQ(gemm_copy_bytes(wide), 0) << gemm_string(wide);
    auto widen = [](const std::vector<float>& v, std::int64_t cols, bool pad) {
      if (!pad) return v;
      const std::size_t rows = v.size() / static_cast<std::size_t>(cols);
      const std::size_t ld = static_cast<std::size_t>(cols) + 16;
      std::vector<float> out(rows * ld, 0.0f);
      for (std::size_t r = 0; r < rows; ++r) {
        std::copy_n(v.begin() + static_cast<std::ptrdiff_t>(r * static_cast<std::size_t>(cols)), cols,
                    out.begin() + static_cast<std::ptrdiff_t>(r * ld));
      }
      return out;
    };
    const std::vector<float> wa = widen(o.a, g.m, pads_a), wb = widen(o.b, g.n, pads_b);
    std::vector<float> c_wide = o.c;
    gemm(wide, wa.data(), wb.data(), c_wide.data());
    if (sgemm) {
      EXPECT_EQ(c, c_wide) << gemm_string(g);
    }
  }
}

// The row stride of the d_ff-wide activations (h, a and their gradients),
// which the MLP's weight gradients read down their columns: whatever kernel
// gemm() picks on this CPU (oneDNN's sgemm, its brgemm, dtrain's own), those
// products read such an operand as stored, never through a padded copy, and
// match the reference. fc1's dW = dh^T x reads dh (d_ff wide) as A; fc2's
// dW = dy^T a reads a (d_ff wide) as B; the d_model-wide operands are dense.
// 16-bit types (which widen into dense scratch or run kernels of their own)
// stay dense.
TEST(Matmul, ActivationRowStrideLetsWeightGradientsReadTheirOperandsAsStored) {
  const std::int64_t widths[] = {64, 256, 257, 768, 1024};
  unsigned seed = 60;
  for (std::int64_t d_ff : widths) {
    for (std::int64_t d_model : widths) {
      const std::int64_t stride = activation_row_stride(d_ff, d_model, DType::f32);
      EXPECT_TRUE(stride == d_ff || stride == d_ff + 16) << d_ff;
      const Gemm fc1{.m = d_ff, .n = d_model, .k = 256, .trans_a = true, .accumulate = true, .lda = stride};
      const Gemm fc2{.m = d_model, .n = d_ff, .k = 256, .trans_a = true, .accumulate = true, .ldb = stride};
      EXPECT_EQ(gemm_copies(fc1).a, 0) << gemm_string(fc1) << " on " << gemm_impl_info(fc1, false);
      EXPECT_EQ(gemm_copies(fc2).b, 0) << gemm_string(fc2) << " on " << gemm_impl_info(fc2, false);
      if (d_model != 257) continue;  // the reference is slow: a few products suffice
      for (const Gemm& g : {fc1, fc2}) {
        const Operands o = make_operands(g, seed++);
        std::vector<float> c = o.c;
        gemm(g, o.a.data(), o.b.data(), c.data());
        expect_matches_reference(g, o, c, false);
      }
    }
    EXPECT_EQ(activation_row_stride(d_ff, d_ff, DType::bf16), d_ff);
    EXPECT_EQ(activation_row_stride(d_ff, d_ff, DType::f16), d_ff);
  }
}

// A linear layer's forward (x W^T) with 1024 rows or more and a B of 256
// columns or fewer: where oneDNN's sgemm runs it (AVX2 alone), gemm() reads a
// transposed copy of W, with the product of W stored [K, N + 16] bit for bit,
// bias and accumulation included; everywhere the reference's result. A B of
// 257 columns is read as stored.
TEST(Matmul, ProductsOfANarrowTransposedBMatchReferenceAndTheirTransposedCopies) {
  Gemm narrow{.m = 1024, .n = 256, .k = 320, .trans_b = true, .ldb = 336};  // W: 256 rows of a wider weight
  Gemm head{.m = 1024, .n = 64, .k = 256, .trans_b = true, .accumulate = true};
  Gemm wide{.m = 1024, .n = 257, .k = 64, .trans_b = true};
  unsigned seed = 70;
  for (const Gemm& g : {narrow, head, wide}) {
    for (bool with_bias : {false, true}) {
      if (with_bias && g.accumulate) continue;
      const bool sgemm = gemm_impl_info(g, with_bias).rfind("gemm:jit", 0) == 0;
      const bool copies = sgemm && g.n <= 256;
      EXPECT_EQ(gemm_copy_bytes(g), copies ? g.k * (g.n + 16) * 4 : 0) << gemm_string(g);
      const Operands o = make_operands(g, seed++);
      const float* bias = with_bias ? o.bias.data() : nullptr;
      std::vector<float> c = o.c;
      gemm(g, o.a.data(), o.b.data(), c.data(), bias);
      expect_matches_reference(g, o, c, with_bias);
      if (!copies) continue;
      // B transposed by hand into [k, n + 16], run as stored.
      const std::int64_t ld = g.ldb != 0 ? g.ldb : g.k;
      std::vector<float> bt(static_cast<std::size_t>(g.k * (g.n + 16)), 0.0f);
      for (std::int64_t r = 0; r < g.k; ++r) {
        for (std::int64_t j = 0; j < g.n; ++j) {
          bt[static_cast<std::size_t>(r * (g.n + 16) + j)] = o.b[static_cast<std::size_t>(j * ld + r)];
        }
      }
      Gemm stored = g;
      stored.trans_b = false;
      stored.ldb = g.n + 16;
      EXPECT_EQ(gemm_copy_bytes(stored), 0) << gemm_string(stored);
      std::vector<float> c_stored = o.c;
      gemm(stored, o.a.data(), bt.data(), c_stored.data(), bias);
      EXPECT_EQ(c, c_stored) << gemm_string(g);
    }
  }
}

TEST(Matmul, AllTransposesBiasAccumulateAlphaMatchReference) {
  const std::int64_t shapes[][3] = {{1, 1, 1}, {5, 7, 3}, {33, 17, 64}, {64, 48, 130}};
  unsigned seed = 1;
  for (const auto& s : shapes) {
    for (int flags = 0; flags < 16; ++flags) {
      for (float alpha : {1.0f, 0.125f}) {
        Gemm g;
        g.m = s[0], g.n = s[1], g.k = s[2];
        g.trans_a = flags & 1, g.trans_b = flags & 2, g.accumulate = flags & 4;
        g.alpha = alpha;
        const bool with_bias = flags & 8;
        if (with_bias && alpha != 1.0f) continue;  // unsupported: see next test
        run_and_check(g, with_bias, seed++);
      }
    }
  }
}

TEST(Matmul, AlphaWithBiasIsRejected) {
  Gemm g;
  g.m = g.n = g.k = 4;
  g.alpha = 0.5f;
  std::vector<float> a(16), b(16), c(16), bias(4);
  EXPECT_THROW(gemm(g, a.data(), b.data(), c.data(), bias.data()), Error);
}

TEST(Matmul, LeadingDimensionsMatchReference) {
  unsigned seed = 100;
  for (int flags = 0; flags < 16; ++flags) {
    Gemm g;
    g.m = 19, g.n = 23, g.k = 45;
    g.trans_a = flags & 1, g.trans_b = flags & 2, g.accumulate = flags & 4;
    g.lda = (g.trans_a ? g.m : g.k) + 5;
    g.ldb = (g.trans_b ? g.k : g.n) + 3;
    g.ldc = g.n + 9;
    run_and_check(g, flags & 8, seed++);
  }
}

TEST(Matmul, BatchedWithStridesMatchReference) {
  unsigned seed = 200;
  for (int flags = 0; flags < 16; ++flags) {
    for (bool padded : {false, true}) {
      Gemm g;
      g.m = 16, g.n = 24, g.k = 40, g.batch = 5;
      g.trans_a = flags & 1, g.trans_b = flags & 2, g.accumulate = flags & 4;
      if (padded) {
        g.lda = (g.trans_a ? g.m : g.k) + 8;
        g.ldc = g.n + 4;
        g.stride_a = (g.trans_a ? g.k : g.m) * g.lda + 16;
        g.stride_b = g.k * g.n + 32;
        g.stride_c = g.m * g.ldc + 8;
      }
      const bool with_bias = flags & 8;
      if (!with_bias) g.alpha = 0.125f;
      run_and_check(g, with_bias, seed++);
    }
  }
}

// Attention reads Q, K, V straight out of a fused [T, 3d] QKV row: heads are a
// batch with stride hd, rows have leading dimension 3d.
TEST(Matmul, InterleavedHeadsMatchReference) {
  const std::int64_t t = 32, hd = 16, heads = 4, d = hd * heads;
  Gemm scores;  // S[h] = Q[h] K[h]^T / sqrt(hd)
  scores.m = t, scores.n = t, scores.k = hd, scores.trans_b = true, scores.alpha = 0.25f;
  scores.lda = 3 * d, scores.ldb = 3 * d, scores.batch = heads;
  scores.stride_a = hd, scores.stride_b = hd;
  run_and_check(scores, false, 300);
  Gemm context;  // O[h] = P[h] V[h], written interleaved into [T, d]
  context.m = t, context.n = hd, context.k = t, context.batch = heads;
  context.ldb = 3 * d, context.ldc = d, context.stride_b = hd, context.stride_c = hd;
  run_and_check(context, false, 301);
}

// On a CPU without AVX2 and FMA the own kernel refuses to run, naming the
// product: that is what the tests below check there (true), instead of its
// results.
bool refuses_without_avx2() {
  if (avx2_gemm_supported()) return false;
  const Gemm g{.m = 1, .n = 1, .k = 1};
  float a = 1.0f, b = 1.0f, c = 0.0f;
  EXPECT_THROW(avx2_gemm(g, &a, &b, &c, nullptr), Error);
  return true;
}

// dtrain's own kernel (gemm_avx2.h), called directly on any CPU with AVX2:
// every transpose, bias, accumulation and alpha, at shapes with partial tiles
// (m not a multiple of 6, n of 16), k across its blocks of 256, m across its
// blocks of 96 rows, n across its blocks of 1024 columns and past 256 (A
// packed rather than read as stored), with padded leading dimensions.
TEST(Avx2Gemm, AllTransposesEdgesAndBlocksMatchReference) {
  if (refuses_without_avx2()) return;
  const std::int64_t shapes[][3] = {{1, 1, 1},    {5, 7, 3},     {6, 16, 8},  {7, 17, 257},
                                    {13, 40, 300}, {150, 33, 64}, {12, 300, 20}, {9, 1030, 9}};
  unsigned seed = 400;
  for (const auto& s : shapes) {
    for (int flags = 0; flags < 32; ++flags) {
      Gemm g{.m = s[0], .n = s[1], .k = s[2], .trans_a = (flags & 1) != 0, .trans_b = (flags & 2) != 0,
             .accumulate = (flags & 4) != 0};
      const bool with_bias = flags & 8;
      if (!with_bias) g.alpha = 0.125f;
      if (flags & 16) {
        g.lda = (g.trans_a ? g.m : g.k) + 3;
        g.ldb = (g.trans_b ? g.k : g.n) + 5;
        g.ldc = g.n + 7;
      }
      run_and_check(g, with_bias, seed++, avx2_gemm);
    }
  }
}

TEST(Avx2Gemm, BatchedWithStridesMatchReference) {
  if (refuses_without_avx2()) return;
  unsigned seed = 500;
  for (int flags = 0; flags < 16; ++flags) {
    Gemm g{.m = 14, .n = 20, .k = 40, .trans_a = (flags & 1) != 0, .trans_b = (flags & 2) != 0,
           .accumulate = (flags & 4) != 0, .batch = 3};
    g.lda = (g.trans_a ? g.m : g.k) + 8;
    g.ldc = g.n + 4;
    g.stride_a = (g.trans_a ? g.k : g.m) * g.lda + 16;
    g.stride_b = g.k * g.n + 32;
    g.stride_c = g.m * g.ldc + 8;
    run_and_check(g, flags & 8, seed++, avx2_gemm);
  }
}

// `floats` floats that end where an unreadable page begins: a read past
// them faults.
class EndsAtGuardPage {
 public:
  explicit EndsAtGuardPage(std::size_t floats) {
    const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    data_pages_ = (floats * sizeof(float) + page - 1) / page * page;
    bytes_ = data_pages_ + page;
    void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    base_ = static_cast<char*>(p);
    if (mprotect(base_ + data_pages_, page, PROT_NONE) != 0) throw std::runtime_error("mprotect");
    floats_ = reinterpret_cast<float*>(base_ + data_pages_) - floats;
  }
  ~EndsAtGuardPage() { munmap(base_, bytes_); }
  EndsAtGuardPage(const EndsAtGuardPage&) = delete;
  EndsAtGuardPage& operator=(const EndsAtGuardPage&) = delete;
  float* data() { return floats_; }

 private:
  char* base_ = nullptr;
  float* floats_ = nullptr;
  std::size_t bytes_ = 0, data_pages_ = 0;
};

// The packs read whole vectors where they can and masked ones at the edges:
// with A and B each ending where an unreadable page begins, every transpose
// and edge runs without a fault and gives the reference's results.
TEST(Avx2Gemm, ReadsNothingPastItsOperands) {
  if (refuses_without_avx2()) return;
  unsigned seed = 900;
  for (const auto& s : {std::array<std::int64_t, 3>{7, 13, 9}, {97, 21, 259}, {130, 1029, 20}, {6, 16, 1}}) {
    for (int flags = 0; flags < 4; ++flags) {
      const Gemm g{.m = s[0], .n = s[1], .k = s[2], .trans_a = (flags & 1) != 0, .trans_b = (flags & 2) != 0};
      const Operands o = make_operands(g, seed++);
      EndsAtGuardPage a(o.a.size()), b(o.b.size());
      std::copy(o.a.begin(), o.a.end(), a.data());
      std::copy(o.b.begin(), o.b.end(), b.data());
      std::vector<float> c = o.c;
      avx2_gemm(g, a.data(), b.data(), c.data(), nullptr);
      expect_matches_reference(g, o, c, false);
    }
  }
}

// Each element of C sums the same products in the same order however the
// product is split: over threads, by columns (a head's share of a projection:
// 64 columns read A as stored, the whole 520 pack it; reads_a_as_stored) or
// by rows.
TEST(Avx2Gemm, ResultsDoNotDependOnThreadsOrOnHowTheProductIsSplit) {
  if (refuses_without_avx2()) return;
  for (bool trans_b : {false, true}) {
    const Gemm g{.m = 300, .n = 520, .k = 600, .trans_b = trans_b};
    const Operands o = make_operands(g, 600);
    std::vector<float> one(o.c.size()), two(o.c.size());
    const int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    avx2_gemm(g, o.a.data(), o.b.data(), one.data(), o.bias.data());
    omp_set_num_threads(2);
    avx2_gemm(g, o.a.data(), o.b.data(), two.data(), o.bias.data());
    omp_set_num_threads(threads);
    EXPECT_EQ(one, two) << gemm_string(g);
    // Columns [64, 128): B's columns (or rows, transposed) from the 64th, C's too.
    Gemm cols = g;
    cols.n = 64;
    cols.ldb = trans_b ? g.k : g.n;
    cols.ldc = g.n;
    std::vector<float> part(o.c.size(), 0.0f);
    avx2_gemm(cols, o.a.data(), o.b.data() + (trans_b ? 64 * g.k : 64), part.data() + 64, o.bias.data() + 64);
    // Rows [150, 300).
    Gemm rows = g;
    rows.m = 150;
    avx2_gemm(rows, o.a.data() + 150 * g.k, o.b.data(), part.data() + 150 * g.n, o.bias.data());
    int bad = 0;
    for (std::int64_t i = 0; i < g.m; ++i) {
      for (std::int64_t j = 0; j < g.n; ++j) {
        if ((j < 64 || j >= 128) && i < 150) continue;
        const auto at = static_cast<std::size_t>(i * g.n + j);
        if (part[at] != one[at] && bad++ < 5) ADD_FAILURE() << "(" << i << ", " << j << ") trans_b " << trans_b;
      }
    }
  }
}

// gemm() runs single f32 products with m and k of 128 or more through the own
// kernel where it is preferred (AVX2 without AVX-512), bit for bit its
// result; the rest (attention's tiles of 64 rows, batches), and every product
// elsewhere, through oneDNN.
TEST(Avx2Gemm, GemmRunsItExactlyWherePreferred) {
  unsigned seed = 700;
  for (const Gemm& g : {Gemm{.m = 128, .n = 16, .k = 128}, Gemm{.m = 300, .n = 70, .k = 200, .trans_b = true},
                        Gemm{.m = 64, .n = 1024, .k = 256, .trans_b = true},
                        Gemm{.m = 256, .n = 48, .k = 64, .trans_a = true, .accumulate = true},
                        Gemm{.m = 128, .n = 64, .k = 128, .batch = 2}, Gemm{.m = 127, .n = 64, .k = 129}}) {
    const bool own = avx2_gemm_preferred() && g.batch == 1 && g.m >= 128 && g.k >= 128;
    EXPECT_EQ(gemm_impl_info(g, false) == "dtrain:avx2_gemm", own) << gemm_string(g);
    Gemm wide = g;
    wide.a_type = wide.b_type = wide.c_type = DType::bf16;
    if (gemm_widens(wide)) {
      EXPECT_EQ(gemm_impl_info(wide, false) == "dtrain:avx2_gemm", own) << gemm_string(g);
    }
    run_and_check(g, !g.accumulate, seed++);
    if (!own) continue;
    const Operands o = make_operands(g, seed++);
    std::vector<float> c = o.c, c_own = o.c;
    gemm(g, o.a.data(), o.b.data(), c.data());
    avx2_gemm(g, o.a.data(), o.b.data(), c_own.data(), nullptr);
    EXPECT_EQ(c, c_own) << gemm_string(g);
  }
}

// DTRAIN_CPU_GEMM: unset or "auto" leaves the choice to the CPU (as oneDNN's
// ISA cap sees it), "avx2" forces the own kernel on wherever it can run,
// "onednn" turns it off; anything else is an error naming the variable.
TEST(Avx2Gemm, EnvironmentChoosesOrRulesOutTheKernel) {
  const bool cpu = avx2_gemm_supported() && !cpu_isa().avx512;
  EXPECT_EQ(avx2_gemm_preferred(nullptr), cpu);
  EXPECT_EQ(avx2_gemm_preferred("auto"), cpu);
  EXPECT_FALSE(avx2_gemm_preferred("onednn"));
  if (avx2_gemm_supported()) {
    EXPECT_TRUE(avx2_gemm_preferred("avx2"));
  } else {
    EXPECT_THROW(avx2_gemm_preferred("avx2"), Error);
  }
  try {
    avx2_gemm_preferred("mkl");
    ADD_FAILURE() << "DTRAIN_CPU_GEMM=mkl was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("DTRAIN_CPU_GEMM=mkl"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("onednn"), std::string::npos) << e.what();
  }
}

TEST(Matmul, RejectsMalformedShapes) {
  std::vector<float> buf(64);
  Gemm g;
  g.m = 4, g.n = 4, g.k = 0;
  EXPECT_THROW(gemm(g, buf.data(), buf.data(), buf.data()), Error);
  g.k = 4, g.alpha = std::nanf("");
  EXPECT_THROW(gemm(g, buf.data(), buf.data(), buf.data()), Error);
  g.alpha = 1.0f;
  g.k = 4, g.lda = 2;
  try {
    gemm(g, buf.data(), buf.data(), buf.data());
    ADD_FAILURE() << "lda < k accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("m=4 n=4 k=4"), std::string::npos) << e.what();
  }
}

TEST(Matmul, CacheReusesEntryForSameShape) {
  Gemm g;
  g.m = 7, g.n = 9, g.k = 11;
  std::vector<float> a(77), b(99), c(63);
  gemm(g, a.data(), b.data(), c.data());
  const std::size_t after_first = gemm_cache_size();
  gemm(g, a.data(), b.data(), c.data());
  EXPECT_EQ(gemm_cache_size(), after_first);
  std::vector<float> a2(77), b2(99), c2(63), bias(9);
  gemm(g, a2.data(), b2.data(), c2.data());  // other pointers: same entry
  EXPECT_EQ(gemm_cache_size(), after_first);
  gemm(g, a.data(), b.data(), c.data(), bias.data());  // bias: a new entry
  EXPECT_EQ(gemm_cache_size(), after_first + 1);
  g.accumulate = true;
  gemm(g, a.data(), b.data(), c.data());
  EXPECT_EQ(gemm_cache_size(), after_first + 2);
}

// Allocations made by one oneDNN execute of an equivalent primitive, called
// directly through the C API: the floor that gemm() cannot go below.
long onednn_execute_allocations(const Gemm& g, std::vector<float>& a, std::vector<float>& b,
                                std::vector<float>& c, std::vector<float>& bias) {
  using dt = dnnl::memory::data_type;
  using tag = dnnl::memory::format_tag;
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream s(eng);
  dnnl::memory::desc ad({g.m, g.k}, dt::f32, tag::ab), bd({g.k, g.n}, dt::f32, tag::ab),
      cd({g.m, g.n}, dt::f32, tag::ab), biasd({1, g.n}, dt::f32, tag::ab);
  dnnl::matmul prim(dnnl::matmul::primitive_desc(dnnl::matmul::desc(ad, bd, biasd, cd), eng));
  dnnl::memory am(ad, eng, a.data()), bm(bd, eng, b.data()), cm(cd, eng, c.data()),
      biasm(biasd, eng, bias.data());
  const dnnl_exec_arg_t args[] = {{DNNL_ARG_SRC, am.get()},
                                  {DNNL_ARG_WEIGHTS, bm.get()},
                                  {DNNL_ARG_DST, cm.get()},
                                  {DNNL_ARG_BIAS, biasm.get()}};
  dnnl_primitive_execute(prim.get(), s.get(), 4, args);  // warm-up
  g_allocs = 0;
  g_count_allocs = true;
  dnnl_primitive_execute(prim.get(), s.get(), 4, args);
  s.wait();
  g_count_allocs = false;
  return g_allocs.load();
}

TEST(Matmul, CachedCallAddsNoAllocationToOneDnnExecute) {
  Gemm g;
  g.m = 64, g.n = 96, g.k = 128;
  std::vector<float> a(64 * 128, 0.5f), b(128 * 96, 0.25f), c(64 * 96), bias(96, 1.0f);
  const long floor = onednn_execute_allocations(g, a, b, c, bias);

  gemm(g, a.data(), b.data(), c.data(), bias.data());  // creates the entry
  std::vector<float> a2 = a, b2 = b, c2 = c, bias2 = bias;
  g_allocs = 0;
  g_count_allocs = true;
  gemm(g, a2.data(), b2.data(), c2.data(), bias2.data());
  g_count_allocs = false;
  const long cached = g_allocs.load();
  EXPECT_LE(cached, floor) << "gemm() allocates beyond oneDNN's own execute";
  EXPECT_FLOAT_EQ(c2[0], 128 * 0.5f * 0.25f + 1.0f);

  // The counter works: a shape not seen before allocates (primitive creation).
  g.n = 95;
  g_allocs = 0;
  g_count_allocs = true;
  gemm(g, a.data(), b.data(), c.data(), bias.data());
  g_count_allocs = false;
  EXPECT_GT(g_allocs.load(), floor);
  std::printf("allocations: oneDNN execute %ld, cached gemm() %ld, first call %ld\n", floor,
              cached, g_allocs.load());
}

TEST(Matmul, ThreadsHaveIndependentCaches) {
  Gemm g;
  g.m = 8, g.n = 8, g.k = 8;
  std::vector<float> a(64, 1.0f), b(64, 2.0f), c(64);
  gemm(g, a.data(), b.data(), c.data());
  std::vector<float> c_other(64);
  std::size_t other_size = 0;
  std::thread([&] {
    gemm(g, a.data(), b.data(), c_other.data());
    other_size = gemm_cache_size();
  }).join();
  EXPECT_EQ(other_size, 1u);
  EXPECT_EQ(c_other, c);
}

// The shapes of dtrain's training loop (Linear forward/backward at M = 2048
// rows; attention with batch = B*H) must run on oneDNN's JIT kernels, never on
// its reference ("ref") implementation.
struct NamedGemm {
  std::string name;
  Gemm g;
  bool bias = false;
};

std::vector<NamedGemm> training_shapes() {
  std::vector<NamedGemm> out;
  const std::int64_t rows = 2048;
  const std::int64_t linears[][2] = {{256, 768}, {256, 256}, {256, 1024}, {1024, 256},
                                     {512, 1536}, {512, 512}, {512, 2048}, {2048, 512}};
  for (const auto& l : linears) {
    const std::int64_t in = l[0], outf = l[1];
    Gemm fwd;  // Y[rows,out] = X[rows,in] W[out,in]^T + b
    fwd.m = rows, fwd.n = outf, fwd.k = in, fwd.trans_b = true;
    out.push_back({fmt::format("fwd  {}x{}x{} (Y=XW^T+b)", rows, outf, in), fwd, true});
    Gemm dx;  // dX[rows,in] = dY[rows,out] W[out,in]
    dx.m = rows, dx.n = in, dx.k = outf;
    out.push_back({fmt::format("dX   {}x{}x{} (dY W)", rows, in, outf), dx, false});
    Gemm dw;  // dW[out,in] += dY^T X
    dw.m = outf, dw.n = in, dw.k = rows, dw.trans_a = true, dw.accumulate = true;
    out.push_back({fmt::format("dW   {}x{}x{} (dY^T X, acc)", outf, in, rows), dw, false});
  }
  for (const std::int64_t d : {256, 512}) {  // one head's share (hd = 64) of the qkv and output projections
    Gemm head;  // Q_h[rows,64] = X[rows,d] W_h[64,d]^T + b_h (attention_project)
    head.m = rows, head.n = 64, head.k = d, head.trans_b = true;
    out.push_back({fmt::format("fwd  {}x64x{} (a head's q, k or v)", rows, d), head, true});
    Gemm d_o;  // dO_h[rows,64] = dY[rows,d] W[:, h]  (attention_output_grad)
    d_o.m = rows, d_o.n = 64, d_o.k = d, d_o.ldb = d;
    out.push_back({fmt::format("dX   {}x64x{} (a head's dO)", rows, d), d_o, false});
  }
  const std::int64_t attn[][2] = {{64, 128}, {256, 64}};  // {B*H, T}, hd = 64
  for (const auto& at : attn) {
    const std::int64_t bh = at[0], t = at[1], hd = 64;
    auto batched = [&](std::int64_t m, std::int64_t n, std::int64_t k, bool ta, bool tb) {
      Gemm g;
      g.m = m, g.n = n, g.k = k, g.trans_a = ta, g.trans_b = tb, g.batch = bh;
      return g;
    };
    Gemm s = batched(t, t, hd, false, true);
    s.alpha = 0.125f;
    const std::string tag = fmt::format("attn BH={} T={}", bh, t);
    out.push_back({tag + " S=QK^T", s, false});
    out.push_back({tag + " O=PV", batched(t, hd, t, false, false), false});
    out.push_back({tag + " dP=dO V^T", batched(t, t, hd, false, true), false});
    out.push_back({tag + " dV=P^T dO", batched(t, hd, t, true, false), false});
    out.push_back({tag + " dQ=dS K", batched(t, hd, t, false, false), false});
    out.push_back({tag + " dK=dS^T Q", batched(t, hd, t, true, false), false});
  }
  return out;
}

TEST(Matmul, TrainingShapesUseJitKernels) {
  for (const NamedGemm& s : training_shapes()) {
    const std::string impl = gemm_impl_info(s.g, s.bias);
    EXPECT_EQ(impl.find("ref"), std::string::npos) << s.name << ": " << impl;
    std::printf("%-36s %s\n", s.name.c_str(), impl.c_str());
  }
}

// Run with --gtest_also_run_disabled_tests (and OMP_NUM_THREADS=1) for the
// GFLOP/s table of the training shapes; best of several timed repetitions.
TEST(Matmul, DISABLED_ReportTrainingShapeGflops) {
  std::printf("peak 2048^3: %.1f GFLOP/s\n", measure_gemm_peak_gflops(2048, 2.0));
  for (const NamedGemm& s : training_shapes()) {
    const Gemm& g = s.g;
    const std::int64_t ra = g.trans_a ? g.k : g.m, ca = g.trans_a ? g.m : g.k;
    const std::int64_t rb = g.trans_b ? g.n : g.k, cb = g.trans_b ? g.k : g.n;
    std::vector<float> a(static_cast<std::size_t>(g.batch * ra * ca), 0.5f);
    std::vector<float> b(static_cast<std::size_t>(g.batch * rb * cb), 0.25f);
    std::vector<float> c(static_cast<std::size_t>(g.batch * g.m * g.n)), bias(g.n);
    const float* bp = s.bias ? bias.data() : nullptr;
    gemm(g, a.data(), b.data(), c.data(), bp);
    double best = 1e300;
    const auto start = std::chrono::steady_clock::now();
    for (int rep = 0; rep < 5 || std::chrono::steady_clock::now() - start < std::chrono::seconds(1);
         ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      gemm(g, a.data(), b.data(), c.data(), bp);
      best = std::min(best,
                      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    const double flops = 2.0 * static_cast<double>(g.batch * g.m * g.n * g.k);
    std::printf("%-36s %7.1f GFLOP/s  %8.1f us  %s\n", s.name.c_str(), flops / best / 1e9,
                best * 1e6, gemm_impl_info(g, s.bias).c_str());
  }
}

}  // namespace
}  // namespace dtrain::nn::cpu
