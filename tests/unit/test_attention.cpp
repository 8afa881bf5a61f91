// nn/attention against a naive double-precision reference (per batch and
// head: softmax(Q K^T / sqrt(hd)) V, with and without the causal mask), and
// its backward against finite differences of L = sum(out * R) w.r.t. qkv.
//
// Tolerances: forward 1e-5 absolute (outputs are convex combinations of V ~
// N(0, 1); f32 GEMMs over hd or T terms and fast_exp give ~1e-6). FD: h = 1e-2
// on qkv ~ N(0, 1); rel 2e-3 covers the O(h^2) truncation (scores move by
// ~h |k|/sqrt(hd)); the floor 1e-4 covers f32 noise of the touched head's
// T * hd outputs, ~sqrt(20) * 1e-7 / (2h) ~ 2e-5.
#include "nn/attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

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
  std::vector<float> q, k, v, probs;
  std::vector<float> d_out, d_probs, dq, dk, dv, d_qkv;

  AttentionCase(AttentionShape s, std::uint32_t seed) : shape(s) {
    std::mt19937 rng(seed);
    const auto head = static_cast<std::size_t>(s.head_elems());
    const auto pr = static_cast<std::size_t>(s.prob_elems());
    qkv = random_normal(rng, 3 * head);
    r = random_normal(rng, head);
    out.resize(head);
    for (auto* buf : {&q, &k, &v, &d_out, &dq, &dk, &dv}) buf->resize(head);
    probs.resize(pr);
    d_probs.resize(pr);
    d_qkv.resize(3 * head);
  }
  AttentionSaved<float> saved() { return {q.data(), k.data(), v.data(), probs.data()}; }
  // Scores and dS share d_probs (f32 storage runs softmax's backward in place).
  AttentionScratch<float> scratch() {
    return {d_probs.data(), d_out.data(), d_probs.data(), dq.data(), dk.data(), dv.data()};
  }
  double loss() {
    attention_forward(shape, qkv.data(), out.data(), saved(), scratch());
    return dot(out.data(), r.data(), shape.head_elems());
  }
  void backward() {
    loss();
    attention_backward(shape, r.data(), d_qkv.data(), saved(), scratch());
  }
};

// Reference: out [B, T, H, hd] and probs [B, H, T, T] in double.
void reference(const AttentionShape& s, const std::vector<float>& qkv, std::vector<double>* out,
               std::vector<double>* probs) {
  const std::int64_t B = s.batch, T = s.seq, H = s.heads, hd = s.head_dim, d = s.d_model();
  out->assign(static_cast<std::size_t>(s.head_elems()), 0.0);
  probs->assign(static_cast<std::size_t>(s.prob_elems()), 0.0);
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
        for (std::int64_t j = 0; j < valid; ++j) {
          const double pj = p[static_cast<std::size_t>(j)] / sum;
          (*probs)[static_cast<std::size_t>(((b * H + h) * T + t) * T + j)] = pj;
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
  std::vector<double> out, probs;
  reference(s, ac.qkv, &out, &probs);
  for (std::size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(ac.out[i], out[i], 1e-5) << "out " << i;
  for (std::size_t i = 0; i < probs.size(); ++i) {
    EXPECT_NEAR(ac.probs[i], probs[i], 1e-6) << "probs " << i;  // fast_exp: 2 ulp
    if (probs[i] == 0.0) {
      EXPECT_EQ(ac.probs[i], 0.0f) << "masked entry " << i;
    }
  }
}

TEST_P(AttentionTest, ForwardMatchesDoubleReference) {
  check_forward(AttentionShape{2, 5, 2, 4, GetParam()}, 1);
  // A larger shape: more keys than a SIMD register and head_dim not a power of 2.
  check_forward(AttentionShape{1, 19, 3, 6, GetParam()}, 2);
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

INSTANTIATE_TEST_SUITE_P(CausalAndNot, AttentionTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "causal" : "full";
                         });

}  // namespace
}  // namespace dtrain::nn
