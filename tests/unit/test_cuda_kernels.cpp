// Every kernel of nn/cuda/ against its CPU counterpart in nn/ on random inputs.
// Tolerances, |gpu - cpu| <= atol + rtol * |cpu|:
//   fp32 elementwise (embedding, GELU, residual, dropout, AdamW with a host
//     scale, conversions): rtol 1e-5, atol 1e-6. The kernels repeat the CPU's
//     float operations, exp/erf included, so only the rounding of FMAs the
//     host compiler may contract remains.
//   fp32 reductions and matmuls (embedding gradients, LayerNorm, softmax,
//     attention, cross-entropy, norms and AdamW after a device-computed clip
//     factor, cuBLAS, Linear): rtol 1e-4, atol 1e-5 (summation order differs).
//   bf16: rtol 1e-2, atol 1e-2; a bf16 matmul output with a bias is rounded
//     twice on the GPU (nn/cuda/matmul.h), so there rtol 2e-2.
// Skips, saying why, where dtrain was built without CUDA or no GPU is present.
#include <gtest/gtest.h>

#include "dtrain/config.h"

#if DTRAIN_HAVE_CUDA
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "nn/adamw.h"
#include "nn/attention.h"
#include "nn/attention_half.h"
#include "nn/cpu/matmul.h"
#include "nn/cross_entropy.h"
#include "nn/cuda/adamw.h"
#include "nn/cuda/attention.h"
#include "nn/cuda/attention_half.h"
#include "nn/cuda/check.h"
#include "nn/cuda/clip.h"
#include "nn/cuda/convert.h"
#include "nn/cuda/cross_entropy.h"
#include "nn/cuda/device_buffer.h"
#include "nn/cuda/dropout.h"
#include "nn/cuda/embedding.h"
#include "nn/cuda/gelu.h"
#include "nn/cuda/layernorm.h"
#include "nn/cuda/linear.h"
#include "nn/cuda/matmul.h"
#include "nn/cuda/residual.h"
#include "nn/dropout.h"
#include "nn/embedding.h"
#include "nn/gelu.h"
#include "nn/layernorm.h"
#include "nn/linear.h"
#endif

namespace dtrain::nn {
namespace {

#if !DTRAIN_HAVE_CUDA
TEST(CudaKernels, ParityWithCpu) {
  GTEST_SKIP() << "dtrain was built without CUDA (DTRAIN_WITH_CUDA=OFF or no nvcc)";
}
#else

using cuda::DeviceBuffer;

struct Tol {
  float rtol, atol;
};
constexpr Tol kElementwise{1e-5f, 1e-6f};
constexpr Tol kReduction{1e-4f, 1e-5f};
constexpr Tol kBf16{1e-2f, 1e-2f};

std::vector<float> random_floats(std::size_t n, std::uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

std::vector<std::int32_t> random_ints(std::size_t n, std::int32_t bound, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<std::int32_t> dist(0, bound - 1);
  std::vector<std::int32_t> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

std::vector<float> widen(const std::vector<std::uint16_t>& h) {
  std::vector<float> f(h.size());
  for (std::size_t i = 0; i < h.size(); ++i) f[i] = bf16_to_f32(h[i]);
  return f;
}

void expect_close(const std::vector<float>& gpu, const std::vector<float>& cpu, Tol tol,
                  const std::string& what) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < cpu.size(); ++i) {
    if (!(std::fabs(gpu[i] - cpu[i]) <= tol.atol + tol.rtol * std::fabs(cpu[i]))) {
      if (bad++ == 0) first = i;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << cpu.size() << " differ; first at " << first
                     << ": gpu " << gpu[first] << " cpu " << cpu[first];
}

template <class T>
DeviceBuffer<T> dev(const std::vector<T>& host) {
  return DeviceBuffer<T>::from_host_sync(host);
}

class CudaKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (cuda::device_count(&why) == 0) GTEST_SKIP() << why;
    DTRAIN_CUDA_TRY(cudaStreamCreate(&stream_));
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  template <class T>
  std::vector<T> get(const DeviceBuffer<T>& b) {
    DTRAIN_CUDA_TRY(cudaStreamSynchronize(stream_));
    return b.to_host_sync();
  }
  cudaStream_t stream_ = nullptr;
};

TEST_F(CudaKernels, TokenEmbeddingAndPositions) {
  const std::int64_t B = 3, T = 7, d = 24, V = 11;
  auto tokens = random_ints(B * T, V, 1);
  tokens[1] = tokens[0];  // a repeated token: d_table adds both rows
  const auto table = random_floats(V * d, 2), pos = random_floats(T * d, 3);
  const auto d_out = random_floats(B * T * d, 4);
  std::vector<float> out(B * T * d), d_table(V * d, 0.5f), d_pos(T * d, 0.25f);
  token_embedding_forward(tokens.data(), table.data(), pos.data(), out.data(), B, T, d, V);
  token_embedding_backward(tokens.data(), d_out.data(), d_table.data(), d_pos.data(), B, T, d);
  auto g_tokens = dev(tokens);
  auto g_table = dev(table), g_pos = dev(pos), g_dout = dev(d_out);
  DeviceBuffer<float> g_out(out.size());
  auto g_dtable = dev(std::vector<float>(V * d, 0.5f)),
       g_dpos = dev(std::vector<float>(T * d, 0.25f));
  auto g_bad = dev(std::vector<std::int32_t>{-1});
  cuda::token_embedding_forward(g_tokens.data(), g_table.data(), g_pos.data(), g_out.data(), B, T,
                                d, V, g_bad.data(), stream_);
  cuda::token_embedding_backward(g_tokens.data(), g_dout.data(), g_dtable.data(), g_dpos.data(), B,
                                 T, d, stream_);
  expect_close(get(g_out), out, kElementwise, "embedding forward");
  expect_close(get(g_dtable), d_table, kReduction, "embedding d_table");
  expect_close(get(g_dpos), d_pos, kReduction, "embedding d_pos");
  EXPECT_EQ(get(g_bad)[0], -1);
  // A token outside the vocabulary is reported, not read.
  tokens[5] = static_cast<std::int32_t>(V);
  g_tokens.upload(tokens.data(), stream_);
  cuda::token_embedding_forward(g_tokens.data(), g_table.data(), g_pos.data(), g_out.data(), B, T,
                                d, V, g_bad.data(), stream_);
  EXPECT_EQ(get(g_bad)[0], 5);
}

TEST_F(CudaKernels, MeanPoolAndPatchPositions) {
  const std::int64_t B = 4, T = 9, d = 40;
  const auto x = random_floats(B * T * d, 5), d_out = random_floats(B * d, 6);
  const auto pos = random_floats(T * d, 7);
  std::vector<float> pooled(B * d), d_x(B * T * d);
  mean_pool_forward(x.data(), pooled.data(), B, T, d);
  mean_pool_backward(d_out.data(), d_x.data(), B, T, d);
  auto g_x = dev(x), g_dout = dev(d_out), g_pos = dev(pos);
  DeviceBuffer<float> g_pooled(pooled.size()), g_dx(d_x.size());
  cuda::mean_pool_forward(g_x.data(), g_pooled.data(), B, T, d, stream_);
  cuda::mean_pool_backward(g_dout.data(), g_dx.data(), B, T, d, stream_);
  expect_close(get(g_pooled), pooled, kElementwise, "mean pool forward");
  expect_close(get(g_dx), d_x, kElementwise, "mean pool backward");
  // Positions added to [B, T, d] and their gradient summed over B.
  std::vector<float> plus = x, d_pos(T * d, 0.0f);
  for (std::int64_t i = 0; i < B * T * d; ++i) plus[i] += pos[i % (T * d)];
  for (std::int64_t i = 0; i < B * T * d; ++i) d_pos[i % (T * d)] += x[i];
  auto g_dpos = dev(std::vector<float>(T * d, 0.0f));
  cuda::add_positions_backward(g_x.data(), g_dpos.data(), B, T, d, stream_);
  cuda::add_positions_forward(g_pos.data(), g_x.data(), B, T, d, stream_);
  expect_close(get(g_x), plus, kElementwise, "add positions");
  expect_close(get(g_dpos), d_pos, kReduction, "positions backward");
}

TEST_F(CudaKernels, LayerNorm) {
  const std::int64_t n = 37, c = 300;
  const auto x = random_floats(n * c, 8, 2.0f), w = random_floats(c, 9), b = random_floats(c, 10);
  const auto dy = random_floats(n * c, 11);
  std::vector<float> y(n * c), mean(n), rstd(n), dx(n * c, 1.0f), dw(c, 0.5f), db(c, 0.5f);
  layernorm_forward(x.data(), w.data(), b.data(), y.data(), mean.data(), rstd.data(), n, c);
  layernorm_backward(dy.data(), x.data(), w.data(), mean.data(), rstd.data(), dx.data(), dw.data(),
                     db.data(), n, c, true);
  auto g_x = dev(x), g_w = dev(w), g_b = dev(b), g_dy = dev(dy);
  DeviceBuffer<float> g_y(y.size()), g_mean(n), g_rstd(n);
  auto g_dx = dev(std::vector<float>(n * c, 1.0f));
  auto g_dw = dev(std::vector<float>(c, 0.5f)), g_db = dev(std::vector<float>(c, 0.5f));
  cuda::layernorm_forward(g_x.data(), g_w.data(), g_b.data(), g_y.data(), g_mean.data(),
                          g_rstd.data(), n, c, stream_);
  cuda::layernorm_backward(g_dy.data(), g_x.data(), g_w.data(), g_mean.data(), g_rstd.data(),
                           g_dx.data(), g_dw.data(), g_db.data(), n, c, true, stream_);
  expect_close(get(g_y), y, kReduction, "layernorm y");
  expect_close(get(g_mean), mean, kReduction, "layernorm mean");
  expect_close(get(g_rstd), rstd, kReduction, "layernorm rstd");
  expect_close(get(g_dx), dx, kReduction, "layernorm dx (accumulated)");
  expect_close(get(g_dw), dw, kReduction, "layernorm dweight");
  expect_close(get(g_db), db, kReduction, "layernorm dbias");
  // bf16 output.
  std::vector<std::uint16_t> y16(n * c);
  layernorm_forward_half(x.data(), w.data(), b.data(), y16.data(), DType::bf16, mean.data(),
                         rstd.data(), n, c);
  DeviceBuffer<std::uint16_t> g_y16(y16.size());
  cuda::layernorm_forward_half(g_x.data(), g_w.data(), g_b.data(), g_y16.data(), DType::bf16,
                               g_mean.data(), g_rstd.data(), n, c, stream_);
  expect_close(widen(get(g_y16)), widen(y16), kBf16, "layernorm bf16 y");
}

TEST_F(CudaKernels, GeluAndResidual) {
  const std::int64_t n = 10007;
  const auto x = random_floats(n, 12, 3.0f), dy = random_floats(n, 13), r = random_floats(n, 14);
  std::vector<float> y(n), dydx(n), dx(n), sum(n);
  gelu_forward(x.data(), y.data(), dydx.data(), n);
  gelu_backward(dy.data(), dydx.data(), dx.data(), n);
  for (std::int64_t i = 0; i < n; ++i) sum[i] = x[i] + r[i];
  auto g_x = dev(x), g_dy = dev(dy), g_r = dev(r);
  DeviceBuffer<float> g_y(n), g_dydx(n), g_dx(n), g_sum(n);
  cuda::gelu_forward(g_x.data(), g_y.data(), g_dydx.data(), n, stream_);
  cuda::gelu_backward(g_dy.data(), g_dydx.data(), g_dx.data(), n, stream_);
  cuda::residual_forward(g_x.data(), g_r.data(), g_sum.data(), n, stream_);
  expect_close(get(g_y), y, kElementwise, "gelu y");
  expect_close(get(g_dydx), dydx, kElementwise, "gelu dydx");
  expect_close(get(g_dx), dx, kElementwise, "gelu dx");
  expect_close(get(g_sum), sum, kElementwise, "residual");
  cuda::add_inplace(g_x.data(), g_r.data(), n, stream_);
  expect_close(get(g_x), sum, kElementwise, "add_inplace");
  // bf16 storage.
  std::vector<std::uint16_t> x16(n), y16(n), d16(n);
  for (std::int64_t i = 0; i < n; ++i) x16[i] = f32_to_bf16(x[i]);
  gelu_forward_half(DType::bf16, x16.data(), y16.data(), d16.data(), n);
  auto g_x16 = dev(x16);
  DeviceBuffer<std::uint16_t> g_y16(n), g_d16(n);
  cuda::gelu_forward_half(DType::bf16, g_x16.data(), g_y16.data(), g_d16.data(), n, stream_);
  expect_close(widen(get(g_y16)), widen(y16), kBf16, "gelu bf16 y");
  expect_close(widen(get(g_d16)), widen(d16), kBf16, "gelu bf16 dydx");
}

void check_attention(cudaStream_t stream, bool causal) {
  const AttentionShape s{2, 17, 3, 8, causal};
  const auto qkv = random_floats(s.batch * s.seq * 3 * s.d_model(), 15);
  const auto d_out = random_floats(s.batch * s.seq * s.d_model(), 16);
  const auto he = static_cast<std::size_t>(s.head_elems()),
             pe = static_cast<std::size_t>(s.prob_elems());
  std::vector<float> q(he), k(he), v(he), p(pe), o(he), dp(pe), dq(he), dk(he), dv(he);
  std::vector<float> out(d_out.size()), d_qkv(qkv.size());
  attention_forward(s, qkv.data(), out.data(), {q.data(), k.data(), v.data(), p.data()},
                    {o.data(), dp.data(), dq.data(), dk.data(), dv.data()});
  attention_backward(s, d_out.data(), d_qkv.data(), {q.data(), k.data(), v.data(), p.data()},
                     {o.data(), dp.data(), dq.data(), dk.data(), dv.data()});
  auto g_qkv = dev(qkv), g_dout = dev(d_out);
  DeviceBuffer<float> gq(he), gk(he), gv(he), gp(pe), go(he), gdp(pe), gdq(he), gdk(he), gdv(he);
  DeviceBuffer<float> g_out(out.size()), g_dqkv(qkv.size());
  const AttentionSaved saved{gq.data(), gk.data(), gv.data(), gp.data()};
  const AttentionScratch scratch{go.data(), gdp.data(), gdq.data(), gdk.data(), gdv.data()};
  cuda::Blas blas;
  cuda::attention_forward(blas, s, g_qkv.data(), g_out.data(), saved, scratch, stream);
  cuda::attention_backward(blas, s, g_dout.data(), g_dqkv.data(), saved, scratch, stream);
  DTRAIN_CUDA_TRY(cudaStreamSynchronize(stream));
  expect_close(gp.to_host_sync(), p, kReduction, "attention probs");
  expect_close(g_out.to_host_sync(), out, kReduction, "attention out");
  expect_close(g_dqkv.to_host_sync(), d_qkv, kReduction, "attention d_qkv");
}

TEST_F(CudaKernels, AttentionCausal) { check_attention(stream_, true); }
TEST_F(CudaKernels, AttentionFull) { check_attention(stream_, false); }

// bf16 attention: the same inputs rounded, outputs compared in bf16.
TEST_F(CudaKernels, AttentionBf16) {
  const AttentionShape s{2, 33, 2, 16, true};
  const auto he = static_cast<std::size_t>(s.head_elems());
  const auto pe = static_cast<std::size_t>(s.prob_elems());
  using H = std::vector<std::uint16_t>;
  auto to_bf16 = [](const std::vector<float>& f) {
    H h(f.size());
    for (std::size_t i = 0; i < f.size(); ++i) h[i] = f32_to_bf16(f[i]);
    return h;
  };
  const H qkv = to_bf16(random_floats(3 * he, 50)), d_out = to_bf16(random_floats(he, 51));
  H q(he), k(he), v(he), p(pe), heads(he), ds(pe), dq(he), dk(he), dv(he), out(he), d_qkv(3 * he);
  std::vector<float> scores(pe);
  attention_forward_half(s, DType::bf16, qkv.data(), out.data(),
                         {q.data(), k.data(), v.data(), p.data()},
                         {scores.data(), heads.data(), ds.data(), dq.data(), dk.data(), dv.data()});
  attention_backward_half(
      s, DType::bf16, d_out.data(), d_qkv.data(), {q.data(), k.data(), v.data(), p.data()},
      {scores.data(), heads.data(), ds.data(), dq.data(), dk.data(), dv.data()});
  auto g_qkv = dev(qkv), g_dout = dev(d_out);
  DeviceBuffer<std::uint16_t> gq(he), gk(he), gv(he), gp(pe), gh(he), gds(pe), gdq(he), gdk(he);
  DeviceBuffer<std::uint16_t> gdv(he), g_out(he), g_dqkv(3 * he);
  DeviceBuffer<float> g_scores(pe);
  const AttentionSavedHalf saved{gq.data(), gk.data(), gv.data(), gp.data()};
  const AttentionScratchHalf scratch{g_scores.data(), gh.data(),  gds.data(),
                                     gdq.data(),      gdk.data(), gdv.data()};
  cuda::Blas blas;
  cuda::attention_forward_half(blas, s, DType::bf16, g_qkv.data(), g_out.data(), saved, scratch,
                               stream_);
  cuda::attention_backward_half(blas, s, DType::bf16, g_dout.data(), g_dqkv.data(), saved, scratch,
                                stream_);
  expect_close(widen(get(gp)), widen(p), kBf16, "bf16 attention probs");
  expect_close(widen(get(g_out)), widen(out), kBf16, "bf16 attention out");
  expect_close(widen(get(g_dqkv)), widen(d_qkv), kBf16, "bf16 attention d_qkv");
}

// Elements a stored operand spans: (batch - 1) strides plus one rows x ld matrix.
std::size_t span_of(std::int64_t rows, std::int64_t ld, std::int64_t stride, std::int64_t batch) {
  return static_cast<std::size_t>((batch - 1) * (stride != 0 ? stride : rows * ld) + rows * ld);
}

// One Gemm on both devices; 16-bit runs round the same inputs first.
void check_gemm(cudaStream_t stream, cuda::Blas& blas, const cpu::Gemm& g, bool with_bias) {
  const std::int64_t lda = g.lda ? g.lda : (g.trans_a ? g.m : g.k);
  const std::int64_t ldb = g.ldb ? g.ldb : (g.trans_b ? g.k : g.n);
  const std::int64_t ldc = g.ldc ? g.ldc : g.n;
  auto a = random_floats(span_of(g.trans_a ? g.k : g.m, lda, g.stride_a, g.batch), 30);
  auto b = random_floats(span_of(g.trans_b ? g.n : g.k, ldb, g.stride_b, g.batch), 31);
  auto c = random_floats(span_of(g.m, ldc, g.stride_c, g.batch), 32);
  const auto bias = random_floats(static_cast<std::size_t>(g.n), 33);
  const float* bias_ptr = with_bias ? bias.data() : nullptr;
  const std::string what = cpu::gemm_string(g) + (with_bias ? " +bias" : "");
  auto g_bias = dev(bias);
  const float* g_bias_ptr = with_bias ? g_bias.data() : nullptr;
  if (g.a_type == DType::f32) {
    auto g_a = dev(a), g_b = dev(b), g_c = dev(c);
    cpu::gemm(g, a.data(), b.data(), c.data(), bias_ptr);
    cuda::gemm(blas, g, g_a.data(), g_b.data(), g_c.data(), g_bias_ptr, stream);
    DTRAIN_CUDA_TRY(cudaStreamSynchronize(stream));
    expect_close(g_c.to_host_sync(), c, kReduction, what);
    return;
  }
  auto round = [](const std::vector<float>& f) {
    std::vector<std::uint16_t> h(f.size());
    for (std::size_t i = 0; i < f.size(); ++i) h[i] = f32_to_bf16(f[i]);
    return h;
  };
  const auto a16 = round(a), b16 = round(b);
  auto g_a = dev(a16), g_b = dev(b16);
  if (g.c_type == DType::f32) {
    auto g_c = dev(c);
    cpu::gemm(g, a16.data(), b16.data(), c.data(), bias_ptr);
    cuda::gemm(blas, g, g_a.data(), g_b.data(), g_c.data(), g_bias_ptr, stream);
    DTRAIN_CUDA_TRY(cudaStreamSynchronize(stream));
    expect_close(g_c.to_host_sync(), c, kBf16, what);
    return;
  }
  const Tol tol = with_bias ? Tol{2e-2f, 1e-2f} : kBf16;  // bias rounded to bf16 first
  auto c16 = round(c);
  auto g_c = dev(c16);
  cpu::gemm(g, a16.data(), b16.data(), c16.data(), bias_ptr);
  cuda::gemm(blas, g, g_a.data(), g_b.data(), g_c.data(), g_bias_ptr, stream);
  DTRAIN_CUDA_TRY(cudaStreamSynchronize(stream));
  expect_close(widen(g_c.to_host_sync()), widen(c16), tol, what);
}

TEST_F(CudaKernels, MatmulF32AndBf16) {
  std::vector<cpu::Gemm> shapes;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      cpu::Gemm g;
      g.m = 33, g.n = 47, g.k = 65, g.trans_a = ta, g.trans_b = tb;
      shapes.push_back(g);
    }
  }
  cpu::Gemm batched;  // padded leading dimensions, strides, alpha, accumulate
  batched.m = 17, batched.n = 24, batched.k = 9, batched.batch = 3, batched.trans_b = true;
  batched.lda = 12, batched.ldb = 10, batched.ldc = 30, batched.alpha = 0.5f;
  batched.accumulate = true, batched.stride_c = 17 * 30 + 5;
  shapes.push_back(batched);
  cuda::Blas blas;
  for (cpu::Gemm g : shapes) {
    for (DType ab : {DType::f32, DType::bf16}) {
      for (DType ct : {DType::f32, DType::bf16}) {
        if (ab == DType::f32 && ct != DType::f32) continue;
        g.a_type = g.b_type = ab;
        g.c_type = ct;
        check_gemm(stream_, blas, g, false);
        if (g.alpha == 1.0f) check_gemm(stream_, blas, g, true);
      }
    }
  }
}

TEST_F(CudaKernels, LinearAndDropout) {
  const std::int64_t n = 19, in = 48, out = 36;
  const auto x = random_floats(n * in, 40), w = random_floats(out * in, 41);
  const auto b = random_floats(out, 42), dy = random_floats(n * out, 43);
  std::vector<float> y(n * out), dx(n * in), dw(out * in, 0.5f), db(out, 0.5f);
  linear_forward(x.data(), w.data(), b.data(), y.data(), n, in, out);
  linear_backward(dy.data(), x.data(), w.data(), dx.data(), dw.data(), db.data(), n, in, out);
  auto g_x = dev(x), g_w = dev(w), g_b = dev(b), g_dy = dev(dy);
  auto g_dw = dev(std::vector<float>(out * in, 0.5f)), g_db = dev(std::vector<float>(out, 0.5f));
  DeviceBuffer<float> g_y(y.size()), g_dx(dx.size());
  cuda::Blas blas;
  cuda::linear_forward(blas, g_x.data(), g_w.data(), g_b.data(), g_y.data(), n, in, out, false,
                       stream_);
  cuda::linear_backward(blas, g_dy.data(), g_x.data(), g_w.data(), g_dx.data(), g_dw.data(),
                        g_db.data(), n, in, out, false, stream_);
  expect_close(get(g_y), y, kReduction, "linear y");
  expect_close(get(g_dx), dx, kReduction, "linear dx");
  expect_close(get(g_dw), dw, kReduction, "linear dweight");
  expect_close(get(g_db), db, kReduction, "linear dbias");
  // The same key drops the same elements on both devices.
  auto d = random_floats(10000, 44);
  auto g_d = dev(d);
  const std::uint64_t key = dropout_key(7, 3, 1, 2, 12345);
  dropout_apply(d.data(), static_cast<std::int64_t>(d.size()), 0.3f, key);
  cuda::dropout_apply(g_d.data(), static_cast<std::int64_t>(d.size()), 0.3f, key, stream_);
  expect_close(get(g_d), d, kElementwise, "dropout");
}

TEST_F(CudaKernels, CrossEntropy) {
  const std::int64_t n = 29, v = 1000;
  const auto logits = random_floats(n * v, 17, 2.0f);
  const auto targets = random_ints(n, static_cast<std::int32_t>(v), 18);
  std::vector<float> probs(n * v);
  const CrossEntropyResult want =
      cross_entropy_forward(logits.data(), targets.data(), probs.data(), n, v);
  auto g_logits = dev(logits);
  auto g_targets = dev(targets);
  DeviceBuffer<cuda::CrossEntropyDeviceResult> g_result(1);
  cuda::cross_entropy_reset(g_result.data(), stream_);
  // probs aliasing logits, as the CPU allows.
  cuda::cross_entropy_forward(g_logits.data(), g_targets.data(), g_logits.data(), n, v,
                              g_result.data(), stream_);
  expect_close(get(g_logits), probs, kReduction, "cross-entropy probs");
  const auto got = get(g_result)[0];
  EXPECT_NEAR(got.loss_sum, want.loss_sum, 1e-4 * std::fabs(want.loss_sum));
  EXPECT_EQ(static_cast<std::int64_t>(got.correct), want.correct);
  EXPECT_EQ(got.bad_row, -1);
  cross_entropy_backward(probs.data(), targets.data(), n, v, 1.0f / static_cast<float>(n));
  cuda::cross_entropy_backward(g_logits.data(), g_targets.data(), n, v,
                               1.0f / static_cast<float>(n), stream_);
  expect_close(get(g_logits), probs, kReduction, "cross-entropy gradient");
  // A target outside [0, v) is reported.
  auto bad = targets;
  bad[3] = -2;
  g_targets.upload(bad.data(), stream_);
  cuda::cross_entropy_reset(g_result.data(), stream_);
  cuda::cross_entropy_forward(g_logits.data(), g_targets.data(), g_logits.data(), n, v,
                              g_result.data(), stream_);
  EXPECT_EQ(get(g_result)[0].bad_row, 3);
}

TEST_F(CudaKernels, AdamWWithDeviceClipFactor) {
  const std::int64_t n = 5000;
  auto p = random_floats(n, 19), g = random_floats(n, 20, 3.0f);
  std::vector<float> m(n, 0.0f), v(n, 0.0f);
  const AdamWHyper hyper{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f};
  // Three steps clipped to max_norm 1: the factor is computed on each device.
  const double sumsq = sum_of_squares(g.data(), n);
  const float factor = clip_factor(std::sqrt(sumsq), 1.0f);
  auto g_p = dev(p), g_g = dev(g), g_m = dev(m), g_v = dev(v);
  auto g_sumsq = dev(std::vector<double>{0.0});
  DeviceBuffer<float> g_factor(1), g_norm(1);
  cuda::sum_of_squares(g_g.data(), n, g_sumsq.data(), stream_);
  cuda::clip_factor(g_sumsq.data(), 1.0f, g_factor.data(), g_norm.data(), stream_);
  EXPECT_NEAR(get(g_sumsq)[0], sumsq, 1e-4 * sumsq);
  expect_close(get(g_factor), {factor}, kReduction, "clip factor");
  for (std::int64_t step = 1; step <= 3; ++step) {
    adamw_update(p.data(), g.data(), m.data(), v.data(), n, hyper, hyper.weight_decay, step,
                 factor);
    cuda::adamw_update(g_p.data(), g_g.data(), g_m.data(), g_v.data(), n, hyper, hyper.weight_decay,
                       step, 1.0f, g_factor.data(), stream_);
  }
  // The factors agree to ~1e-7, so the updates agree within the reduction tolerance.
  expect_close(get(g_p), p, kReduction, "adamw param");
  expect_close(get(g_m), m, kReduction, "adamw exp_avg");
  expect_close(get(g_v), v, kReduction, "adamw exp_avg_sq");
  // The same host scale on both devices, from the same state: elementwise parity.
  const auto state = get(g_v);
  g_p.upload(p.data(), stream_);
  g_m.upload(m.data(), stream_);
  DTRAIN_CUDA_TRY(cudaStreamSynchronize(stream_));  // p and m change below
  v = state;
  cuda::adamw_update(g_p.data(), g_g.data(), g_m.data(), g_v.data(), n, hyper, 0.0f, 4, 0.5f,
                     nullptr, stream_);
  adamw_update(p.data(), g.data(), m.data(), v.data(), n, hyper, 0.0f, 4, 0.5f);
  expect_close(get(g_p), p, kElementwise, "adamw param, step 4");
  expect_close(get(g_m), m, kElementwise, "adamw exp_avg, step 4");
  expect_close(get(g_v), v, kElementwise, "adamw exp_avg_sq, step 4");
  scale(g.data(), n, factor);
  cuda::scale(g_g.data(), n, g_factor.data(), stream_);
  expect_close(get(g_g), g, kReduction, "clip scale");
}

TEST_F(CudaKernels, ConvertBf16AndF16) {
  const auto x = random_floats(4099, 21, 100.0f);
  auto g_x = dev(x);
  for (DType t : {DType::bf16, DType::f16}) {
    std::vector<float> want(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) {
      want[i] = t == DType::bf16 ? bf16_to_f32(f32_to_bf16(x[i])) : f16_to_f32(f32_to_f16(x[i]));
    }
    DeviceBuffer<std::uint16_t> g_h(x.size());
    DeviceBuffer<float> g_back(x.size());
    cuda::f32_to_half(g_x.data(), t, g_h.data(), static_cast<std::int64_t>(x.size()), stream_);
    cuda::half_to_f32(g_h.data(), t, g_back.data(), static_cast<std::int64_t>(x.size()), stream_);
    expect_close(get(g_back), want, Tol{0.0f, 0.0f}, std::string("round trip ") + dtype_name(t));
  }
}

#endif  // DTRAIN_HAVE_CUDA

}  // namespace
}  // namespace dtrain::nn
