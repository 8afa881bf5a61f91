// cpu::gemm_weights: B read through a copy in the layout oneDNN prefers.
//   - the linear layer's forward (x W^T, with bias and accumulation) and input
//     gradient (dy W) equal gemm() on W as stored: bit for bit in f32, within
//     1e-5 of the products' magnitude in bf16 (another summation order);
//   - the copy is kept while the version stays (new contents under an old
//     version are not seen: the cache is really used) and made again for a
//     new version (a missing invalidation fails here);
//   - calls that only reorder or only multiply touch no fresh memory.
#include "nn/cpu/matmul.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "core/process.h"
#include "nn/cpu/convert.h"
#include "nn/linear.h"
#include "nn/parameters.h"

namespace dtrain::nn::cpu {
namespace {

std::vector<float> random_values(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

std::vector<std::uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<std::uint16_t> out(v.size());
  f32_to_half(v.data(), DType::bf16, out.data(), static_cast<std::int64_t>(v.size()));
  return out;
}

// The products of a linear layer with n rows, in -> out.
struct LinearCase {
  std::int64_t n, in, out;
};

std::vector<Gemm> linear_products(const LinearCase& c, DType operands) {
  const DType output = operands == DType::f32 ? DType::f32 : operands;
  return {typed(linear_forward_gemm(c.n, c.in, c.out, false), operands, output),
          typed(linear_forward_gemm(c.n, c.in, c.out, true), operands, DType::f32),
          typed(linear_input_grad_gemm(c.n, c.in, c.out, false), operands, DType::f32),
          typed(linear_input_grad_gemm(c.n, c.in, c.out, false), operands, output)};
}

// C as stored by g (f32 or bf16) widened to f32.
std::vector<float> widen(const Gemm& g, const std::vector<float>& c32, const std::vector<std::uint16_t>& c16) {
  if (g.c_type == DType::f32) return c32;
  std::vector<float> out(c16.size());
  half_to_f32(c16.data(), g.c_type, out.data(), static_cast<std::int64_t>(c16.size()));
  return out;
}

// Runs g once through gemm() and once through gemm_weights() on the same
// operands; returns {stored layout, preferred layout}.
std::pair<std::vector<float>, std::vector<float>> both_layouts(const Gemm& g, bool bias, std::uint64_t version,
                                                               unsigned seed) {
  const std::int64_t b_rows = g.trans_b ? g.n : g.k, b_ld = g.ldb != 0 ? g.ldb : (g.trans_b ? g.k : g.n);
  const auto a = random_values(static_cast<std::size_t>(g.m * g.k), seed);
  const auto b = random_values(static_cast<std::size_t>(b_rows * b_ld), seed + 1);
  const auto c0 = random_values(static_cast<std::size_t>(g.m * g.n), seed + 2);
  const auto bias_values = random_values(static_cast<std::size_t>(g.n), seed + 3);
  const bool half = g.a_type != DType::f32;
  const auto a16 = to_bf16(a), b16 = to_bf16(b);
  const void* pa = half ? static_cast<const void*>(a16.data()) : a.data();
  const void* pb = half ? static_cast<const void*>(b16.data()) : b.data();
  const float* pbias = bias ? bias_values.data() : nullptr;
  std::vector<float> plain32 = c0, packed32 = c0;
  std::vector<std::uint16_t> plain16 = to_bf16(c0), packed16 = to_bf16(c0);
  const bool c16 = g.c_type != DType::f32;
  gemm(g, pa, pb, c16 ? static_cast<void*>(plain16.data()) : plain32.data(), pbias);
  gemm_weights(g, pa, pb, version, c16 ? static_cast<void*>(packed16.data()) : packed32.data(), pbias);
  return {widen(g, plain32, plain16), widen(g, packed32, packed16)};
}

TEST(MatmulWeights, LinearProductsEqualTheStoredLayout) {
  unsigned seed = 1;
  for (const LinearCase c :
       {LinearCase{64, 48, 80}, LinearCase{32, 48, 128}, LinearCase{128, 256, 768}, LinearCase{96, 1024, 256}}) {
    for (DType operands : {DType::f32, DType::bf16}) {
      for (const Gemm& g : linear_products(c, operands)) {
        for (bool bias : {false, true}) {
          if (bias && g.n != c.out) continue;  // only the forward product has a bias
          // Where brgemm runs on AVX-512 and the shape is whole blocks (64 n by 16 k
          // in f32, 32 k in bf16), dtrain's copy loops make the copy (a transposing
          // one for the forward, whose B is W^T); elsewhere oneDNN's reorder (k = 48
          // in bf16: its last block is padded). bf16 on a CPU without bf16 kernels
          // runs widened, and oneDNN's sgemm (gemm:jit) and dtrain's own kernel
          // (AVX2 alone) read B as stored: no copy.
          const std::string impl = gemm_impl_info(g, bias);
          const bool blocks = g.k % (operands == DType::f32 ? 16 : 32) == 0 && g.n % 64 == 0 &&
                              impl.rfind("brg:avx512_core", 0) == 0;
          if (gemm_widens(g)) {
            EXPECT_EQ(operands, DType::bf16) << gemm_string(g);
            EXPECT_EQ(gemm_weights_pack_info(g, bias), "none: widened as stored") << gemm_string(g);
          } else if (impl.rfind("gemm:jit", 0) == 0 || impl == "dtrain:avx2_gemm") {
            EXPECT_EQ(gemm_weights_pack_info(g, bias), "none: plain layout") << gemm_string(g);
          } else if (blocks) {
            EXPECT_EQ(gemm_weights_pack_info(g, bias),
                      operands == DType::f32 ? "copy BA16a64b" : "copy BA16a64b2a")
                << gemm_string(g);
          } else {
            EXPECT_EQ(gemm_weights_pack_info(g, bias), "reorder") << gemm_string(g);
          }
          // A fresh version each time: each call's weights are new.
          const auto [plain, packed] = both_layouts(g, bias, next_weights_version(), seed++);
          if (operands == DType::f32) {
            EXPECT_EQ(plain, packed) << gemm_string(g) << " bias=" << bias;
            continue;
          }
          // bf16 inputs in [-1, 1]: a product sums k terms of at most 1.
          const double tol = 1e-5 * static_cast<double>(g.k) + (g.c_type == DType::f32 ? 0.0 : 1.0 / 64);
          double worst = 0;
          for (std::size_t i = 0; i < plain.size(); ++i) {
            worst = std::max(worst, std::fabs(double{plain[i]} - packed[i]));
          }
          EXPECT_LE(worst, tol) << gemm_string(g) << " bias=" << bias;
        }
      }
    }
  }
}

// One head's columns of a weight (attention_output_grad: dy times W's 64
// columns of the head, ldb = W's width) are copied by the same loops, which
// read B's rows at ldb.
TEST(MatmulWeights, ColumnsOfAWiderWeightEqualTheStoredLayout) {
  unsigned seed = 100;
  for (DType operands : {DType::f32, DType::bf16}) {
    for (DType output : {DType::f32, operands}) {
      Gemm g = typed(linear_input_grad_gemm(96, 64, 256, false), operands, output);
      const Gemm dense = g;
      g.ldb = 320;
      if (gemm_impl_info(dense, false).rfind("brg:avx512_core", 0) == 0) {
        EXPECT_EQ(gemm_weights_pack_info(g, false), gemm_weights_pack_info(dense, false)) << gemm_string(g);
        EXPECT_NE(gemm_weights_pack_info(g, false), "reorder") << gemm_string(g);
      }
      const auto [plain, packed] = both_layouts(g, false, next_weights_version(), seed++);
      if (operands == DType::f32 && output == DType::f32) {
        EXPECT_EQ(plain, packed) << gemm_string(g);
        continue;
      }
      const double tol = 1e-5 * static_cast<double>(g.k) + (g.c_type == DType::f32 ? 0.0 : 1.0 / 64);
      double worst = 0;
      for (std::size_t i = 0; i < plain.size(); ++i) worst = std::max(worst, std::fabs(double{plain[i]} - packed[i]));
      EXPECT_LE(worst, tol) << gemm_string(g);
    }
  }
}

TEST(MatmulWeights, ANewVersionReordersTheChangedWeights) {
  const Gemm g = linear_forward_gemm(32, 64, 96, false);
  const auto x = random_values(32 * 64, 7);
  auto w = random_values(96 * 64, 8);
  std::vector<float> want(32 * 96), got(32 * 96);

  const std::uint64_t v1 = next_weights_version();
  gemm(g, x.data(), w.data(), want.data());
  gemm_weights(g, x.data(), w.data(), v1, got.data());
  EXPECT_EQ(got, want);

  const std::vector<float> old_result = want;
  const auto new_contents = random_values(96 * 64, 9);
  std::copy(new_contents.begin(), new_contents.end(), w.begin());  // same address
  gemm_weights(g, x.data(), w.data(), v1, got.data());
  if (gemm_weights_pack_info(g, false).rfind("none", 0) == 0) {
    std::vector<float> as_stored(32 * 96);
    gemm(g, x.data(), w.data(), as_stored.data());
    EXPECT_EQ(got, as_stored) << "without a copy, B is read as stored";
  } else {
    EXPECT_EQ(got, old_result) << "the copy made for v1 is what v1 means";
  }

  const std::uint64_t v2 = next_weights_version();
  EXPECT_NE(v2, v1);
  gemm(g, x.data(), w.data(), want.data());
  gemm_weights(g, x.data(), w.data(), v2, got.data());
  EXPECT_EQ(got, want) << "a new version must reorder the new contents";
  EXPECT_NE(got, old_result);
}

TEST(MatmulWeights, VersionZeroReadsTheWeightsAsStored) {
  const Gemm g = linear_input_grad_gemm(16, 32, 48, false);
  const auto dy = random_values(16 * 48, 3);
  auto w = random_values(48 * 32, 4);
  std::vector<float> want(16 * 32), got(16 * 32);
  gemm_weights(g, dy.data(), w.data(), 0, got.data());
  const auto new_contents = random_values(48 * 32, 5);
  std::copy(new_contents.begin(), new_contents.end(), w.begin());
  gemm(g, dy.data(), w.data(), want.data());
  gemm_weights(g, dy.data(), w.data(), 0, got.data());
  EXPECT_EQ(got, want);
}

#ifndef __SANITIZE_ADDRESS__  // ASan's allocator quarantine puts small allocations on fresh pages
TEST(MatmulWeights, SteadyStateTouchesNoFreshMemory) {
  // 1 MB of weights per copy (256 pages): a copy allocated per call or per
  // version would fault hundreds of pages.
  const LinearCase c{256, 512, 512};
  const Gemm fwd = linear_forward_gemm(c.n, c.in, c.out, false);
  const Gemm dgrad = linear_input_grad_gemm(c.n, c.in, c.out, false);
  const auto x = random_values(static_cast<std::size_t>(c.n * c.in), 1);
  const auto dy = random_values(static_cast<std::size_t>(c.n * c.out), 2);
  const auto w = random_values(static_cast<std::size_t>(c.out * c.in), 3);
  std::vector<float> y(static_cast<std::size_t>(c.n * c.out)), dx(static_cast<std::size_t>(c.n * c.in));
  auto step = [&](std::uint64_t version) {
    for (int micro = 0; micro < 2; ++micro) {
      gemm_weights(fwd, x.data(), w.data(), version, y.data());
      gemm_weights(dgrad, dy.data(), w.data(), version, dx.data());
    }
  };
  step(next_weights_version());  // the copies and primitives are made here
  const long before = minor_page_faults();
  for (int i = 0; i < 10; ++i) step(next_weights_version());
  EXPECT_LT(minor_page_faults() - before, 20);
}
#endif

}  // namespace
}  // namespace dtrain::nn::cpu
