// nn/attention against a naive double-precision reference (per batch and
// head: softmax(Q K^T / sqrt(hd)) V, with and without the causal mask), and
// its backward against finite differences of L = sum(out * R) w.r.t. qkv.
//
// The CPU works in tiles of 64 query rows, so shapes with T above, below
// and not a multiple of 64 take every path: one tile, a short last tile,
// causal tiles that skip the keys past their last row.
//
// Tolerances: forward 1e-5 absolute (outputs are convex combinations of V ~
// N(0, 1); f32 GEMMs over hd or T terms and fast_exp give ~1e-6). FD: h = 1e-2
// on qkv ~ N(0, 1); rel 2e-3 covers the O(h^2) truncation (scores move by
// ~h |k|/sqrt(hd)); the floor 1e-4 covers f32 noise of the touched head's
// T * hd outputs, ~sqrt(20) * 1e-7 / (2h) ~ 2e-5.
#include "nn/attention.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "nn/cpu/matmul.h"
#include "nn/linear.h"
#include "nn/parameters.h"
#include "unit/gradient_check.h"

namespace dtrain::nn {
namespace {

using testing::check_gradient;
using testing::dot;
using testing::FdTolerance;
using testing::random_normal;

// Owns every buffer one attention call needs.
struct AttentionCase {
  AttentionShape shape;
  std::vector<float> qkv, out, r;
  std::vector<float> q, k, v, lse;
  std::vector<float> d_qkv;

  AttentionCase(AttentionShape s, std::uint32_t seed) : shape(s) {
    std::mt19937 rng(seed);
    const auto head = static_cast<std::size_t>(s.head_elems());
    qkv = random_normal(rng, 3 * head);
    r = random_normal(rng, head);
    out.resize(head);
    for (auto* buf : {&q, &k, &v}) buf->resize(head);
    lse.resize(static_cast<std::size_t>(s.row_elems()));
    d_qkv.resize(3 * head);
  }
  AttentionSaved<float> saved() { return {q.data(), k.data(), v.data(), lse.data()}; }
  double loss() {
    attention_forward(shape, qkv.data(), out.data(), saved());
    return dot(out.data(), r.data(), shape.head_elems());
  }
  void backward(float* d_bias = nullptr) {
    loss();
    attention_backward(shape, r.data(), d_qkv.data(), saved(), d_bias);
  }
};

// Reference: out [B, T, H, hd] and the scores' log-sum-exp [B, H, T] in double.
void reference(const AttentionShape& s, const std::vector<float>& qkv, std::vector<double>* out,
               std::vector<double>* lse) {
  const std::int64_t B = s.batch, T = s.seq, H = s.heads, hd = s.head_dim, d = s.d_model();
  out->assign(static_cast<std::size_t>(s.head_elems()), 0.0);
  lse->assign(static_cast<std::size_t>(s.row_elems()), 0.0);
  auto at = [&](std::int64_t b, std::int64_t t, std::int64_t part, std::int64_t h, std::int64_t i) {
    return static_cast<double>(qkv[static_cast<std::size_t>(((b * T + t) * 3 + part) * d + h * hd + i)]);
  };
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t h = 0; h < H; ++h) {
      for (std::int64_t t = 0; t < T; ++t) {
        const std::int64_t valid = s.causal ? t + 1 : T;
        std::vector<double> p(static_cast<std::size_t>(T), 0.0);
        double mx = -std::numeric_limits<double>::infinity();
        for (std::int64_t j = 0; j < valid; ++j) {
          double sc = 0.0;
          for (std::int64_t i = 0; i < hd; ++i) sc += at(b, t, 0, h, i) * at(b, j, 1, h, i);
          p[static_cast<std::size_t>(j)] = sc / std::sqrt(static_cast<double>(hd));
          mx = std::max(mx, p[static_cast<std::size_t>(j)]);
        }
        double sum = 0.0;
        for (std::int64_t j = 0; j < valid; ++j) {
          p[static_cast<std::size_t>(j)] = std::exp(p[static_cast<std::size_t>(j)] - mx);
          sum += p[static_cast<std::size_t>(j)];
        }
        (*lse)[static_cast<std::size_t>((b * H + h) * T + t)] = mx + std::log(sum);
        for (std::int64_t j = 0; j < valid; ++j) {
          const double pj = p[static_cast<std::size_t>(j)] / sum;
          for (std::int64_t i = 0; i < hd; ++i) {
            (*out)[static_cast<std::size_t>(((b * T + t) * H + h) * hd + i)] += pj * at(b, j, 2, h, i);
          }
        }
      }
    }
  }
}

class AttentionTest : public ::testing::TestWithParam<bool> {};

void check_forward(const AttentionShape& s, std::uint32_t seed) {
  AttentionCase ac(s, seed);
  ac.loss();
  std::vector<double> out, lse;
  reference(s, ac.qkv, &out, &lse);
  for (std::size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(ac.out[i], out[i], 1e-5) << "out " << i;
  // lse ~ log(T) + O(1): f32 sums of T exps and fast_exp, a few ulp of it.
  for (std::size_t i = 0; i < lse.size(); ++i) EXPECT_NEAR(ac.lse[i], lse[i], 1e-5) << "lse " << i;
}

TEST_P(AttentionTest, ForwardMatchesDoubleReference) {
  check_forward(AttentionShape{2, 5, 2, 4, GetParam()}, 1);
  // A larger shape: more keys than a SIMD register and head_dim not a power of 2.
  check_forward(AttentionShape{1, 19, 3, 6, GetParam()}, 2);
  // Several tiles: a full one, and a short last one.
  check_forward(AttentionShape{2, 100, 2, 8, GetParam()}, 6);
  check_forward(AttentionShape{1, 128, 1, 16, GetParam()}, 7);
}

// The first query of a causal head sees only itself: its output is V[0].
TEST(Attention, CausalFirstPositionCopiesItsValue) {
  const AttentionShape s{2, 5, 2, 4, true};
  AttentionCase ac(s, 3);
  ac.loss();
  for (std::int64_t b = 0; b < s.batch; ++b) {
    for (std::int64_t h = 0; h < s.heads; ++h) {
      for (std::int64_t i = 0; i < s.head_dim; ++i) {
        const float v0 = ac.qkv[static_cast<std::size_t>((b * s.seq * 3 + 2) * s.d_model() + h * s.head_dim + i)];
        EXPECT_FLOAT_EQ(ac.out[static_cast<std::size_t>((b * s.seq * s.heads + h) * s.head_dim + i)], v0);
      }
    }
  }
}

TEST_P(AttentionTest, BackwardMatchesFiniteDifferences) {
  const AttentionShape s{2, 5, 2, 4, GetParam()};
  AttentionCase ac(s, 4);
  std::fill(ac.d_qkv.begin(), ac.d_qkv.end(), std::numeric_limits<float>::quiet_NaN());
  ac.backward();  // d_qkv is written in full: no NaN may survive
  const std::vector<float> grad = ac.d_qkv;
  std::mt19937 rng(9);
  check_gradient("d_qkv", ac.qkv.data(), grad.data(), 3 * s.head_elems(), [&] { return ac.loss(); },
                 FdTolerance{1e-2, 2e-3, 1e-4, 40}, rng);
  // In a causal head the query of position 0 has zero gradient: its one score
  // sits alone in its softmax row, which is 1 whatever the score.
  if (s.causal) {
    for (std::int64_t b = 0; b < s.batch; ++b) {
      for (std::int64_t h = 0; h < s.heads; ++h) {
        for (std::int64_t i = 0; i < s.head_dim; ++i) {
          const auto q0 = static_cast<std::size_t>((b * s.seq * 3 + 0) * s.d_model() + h * s.head_dim + i);
          EXPECT_NEAR(grad[q0], 0.0f, 1e-7) << "dQ at position 0";
        }
      }
    }
  }
}

// Every element at once, on the larger shape.
TEST_P(AttentionTest, BackwardMatchesFiniteDifferencesLargerShape) {
  const AttentionShape s{1, 19, 3, 6, GetParam()};
  AttentionCase ac(s, 5);
  ac.backward();
  const std::vector<float> grad = ac.d_qkv;
  std::mt19937 rng(10);
  check_gradient("d_qkv", ac.qkv.data(), grad.data(), 3 * s.head_elems(), [&] { return ac.loss(); },
                 FdTolerance{1e-2, 2e-3, 1e-4, 20}, rng);
}

// Across tiles: T = 70 is a tile of 64 and one of 6.
TEST_P(AttentionTest, BackwardMatchesFiniteDifferencesAcrossTiles) {
  const AttentionShape s{1, 70, 2, 4, GetParam()};
  AttentionCase ac(s, 8);
  std::fill(ac.d_qkv.begin(), ac.d_qkv.end(), std::numeric_limits<float>::quiet_NaN());
  ac.backward();
  const std::vector<float> grad = ac.d_qkv;
  for (std::size_t i = 0; i < grad.size(); ++i) ASSERT_TRUE(std::isfinite(grad[i])) << "d_qkv " << i;
  std::mt19937 rng(11);
  check_gradient("d_qkv", ac.qkv.data(), grad.data(), 3 * s.head_elems(), [&] { return ac.loss(); },
                 FdTolerance{1e-2, 2e-3, 1e-4, 40}, rng);
}

// Each pair is computed by one thread in a fixed order: the thread count
// does not change a bit of the result.
TEST_P(AttentionTest, OneAndTwoThreadsAgreeBitwise) {
  const AttentionShape s{2, 70, 2, 8, GetParam()};  // enough work to split across threads
  const int threads = omp_get_max_threads();
  std::vector<float> out[2], lse[2], grad[2], bias[2];
  for (int n : {1, 2}) {
    omp_set_num_threads(n);
    AttentionCase ac(s, 12);
    bias[n - 1].assign(static_cast<std::size_t>(3 * s.d_model()), 0.0f);
    ac.backward(bias[n - 1].data());
    out[n - 1] = ac.out;
    lse[n - 1] = ac.lse;
    grad[n - 1] = ac.d_qkv;
  }
  omp_set_num_threads(threads);
  EXPECT_EQ(out[0], out[1]);
  EXPECT_EQ(lse[0], lse[1]);
  EXPECT_EQ(grad[0], grad[1]);
  EXPECT_EQ(bias[0], bias[1]);
}

// The bias gradient of the qkv projection, summed as the gradients are
// scattered: added to what is there, the column sums of d_qkv (1e-5 of the
// sum of magnitudes: f32 sums in another order than the double reference);
// d_qkv itself bit for bit as without it.
TEST_P(AttentionTest, BackwardSumsTheQkvBiasGradient) {
  const AttentionShape s{3, 70, 2, 8, GetParam()};  // two tiles of rows, three batches
  AttentionCase plain(s, 13), fused(s, 13);
  plain.backward();
  std::vector<float> d_bias(static_cast<std::size_t>(3 * s.d_model()), 0.25f);
  fused.backward(d_bias.data());
  EXPECT_EQ(fused.d_qkv, plain.d_qkv);
  const std::int64_t rows = s.batch * s.seq, width = 3 * s.d_model();
  for (std::int64_t j = 0; j < width; ++j) {
    double sum = 0.25, magnitude = 0.25;
    for (std::int64_t i = 0; i < rows; ++i) {
      sum += plain.d_qkv[static_cast<std::size_t>(i * width + j)];
      magnitude += std::fabs(plain.d_qkv[static_cast<std::size_t>(i * width + j)]);
    }
    EXPECT_NEAR(d_bias[static_cast<std::size_t>(j)], sum, 1e-5 * magnitude) << "column " << j;
  }
}

// The CPU's products straight into and out of the heads' layout
// (attention_project, attention_output_grad) against the linears they replace
// around the same attention: out, lse, d_qkv and the qkv bias gradient bit for
// bit (f32: each head's product sums the same terms in the same order as the
// whole one).
TEST_P(AttentionTest, ProductsIntoTheHeadsEqualTheLinearsAround) {
  const AttentionShape s{2, 70, 2, 64, GetParam()};  // heads of 64: the products brgemm runs in training
  const std::int64_t n = s.batch * s.seq, d = s.d_model();
  std::mt19937 rng(14);
  const auto x = random_normal(rng, n * d), w = random_normal(rng, 3 * d * d), b = random_normal(rng, 3 * d);
  const auto w_out = random_normal(rng, d * d), dy = random_normal(rng, n * d);
  const std::uint64_t version = next_weights_version(), out_version = next_weights_version();

  AttentionCase linears(s, 15), heads(s, 15);
  std::vector<float> d_out(static_cast<std::size_t>(s.head_elems()));
  std::vector<float> bias_linears(static_cast<std::size_t>(3 * d), 0.0f), bias_heads = bias_linears;
  linear_forward(x.data(), w.data(), b.data(), linears.qkv.data(), n, d, 3 * d, false, version);
  attention_forward(s, linears.qkv.data(), linears.out.data(), linears.saved());
  cpu::gemm_weights(linear_input_grad_gemm(n, d, d, false), dy.data(), w_out.data(), out_version, d_out.data());
  attention_backward(s, d_out.data(), linears.d_qkv.data(), linears.saved(), bias_linears.data());

  attention_project(s, x.data(), w.data(), b.data(), version, heads.saved());
  attention_forward(s, static_cast<const float*>(nullptr), heads.out.data(), heads.saved());
  std::vector<float> d_heads(d_out.size(), std::numeric_limits<float>::quiet_NaN());
  attention_output_grad(s, dy.data(), w_out.data(), out_version, d_heads.data());
  std::fill(heads.d_qkv.begin(), heads.d_qkv.end(), std::numeric_limits<float>::quiet_NaN());
  attention_backward(s, static_cast<const float*>(nullptr), heads.d_qkv.data(), heads.saved(), bias_heads.data(),
                     d_heads.data());

  EXPECT_EQ(heads.out, linears.out);
  EXPECT_EQ(heads.lse, linears.lse);
  EXPECT_EQ(heads.d_qkv, linears.d_qkv);
  EXPECT_EQ(bias_heads, bias_linears);
}

INSTANTIATE_TEST_SUITE_P(CausalAndNot, AttentionTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "causal" : "full";
                         });

}  // namespace
}  // namespace dtrain::nn
