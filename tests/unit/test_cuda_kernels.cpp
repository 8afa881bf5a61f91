// The CUDA kernel set (nn/cuda/cuda_kernels.h) against the CPU's
// (nn/cpu/host_kernels.h): every member function runs on the same inputs
// through both, in f32, bf16 and f16 storage, and the results must agree
// within |gpu - cpu| <= atol + rtol * |cpu|:
//   f32: elementwise results rtol 1e-5, atol 1e-6 (the kernels repeat the
//     CPU's float operations, its exp and erf included); results that sum
//     (norms, products, softmax, gradients) rtol 1e-4, atol 1e-5: only the
//     order of the sums differs.
//   16-bit outputs may differ by one rounding: bf16 rtol 1e-2, atol 1e-2;
//     f16 rtol 2e-3, atol 2e-3. Outputs rounded twice on the GPU (a product
//     with a bias into a 16-bit output: the bias is rounded to its type
//     first, nn/cuda/matmul.h) or after a chain of 16-bit roundings
//     (attention's backward) get twice to five times that. The key/value
//     caches of decoding are copies: exact.
// Skips, saying why, where dtrain was built without CUDA or no GPU is visible.
#include <gtest/gtest.h>

#include "dtrain/config.h"

#if DTRAIN_HAVE_CUDA
#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/cuda/check.h"
#include "nn/cpu/host_device.h"
#include "nn/cpu/host_kernels.h"
#include "nn/cuda/cuda_device.h"
#include "nn/cuda/cuda_kernels.h"
#include "nn/dropout.h"
#endif

namespace dtrain::nn {
namespace {

#if !DTRAIN_HAVE_CUDA
TEST(CudaKernels, ParityWithCpu) {
  GTEST_SKIP() << "dtrain was built without CUDA (DTRAIN_WITH_CUDA=OFF or no nvcc)";
}
#else

using namespace std::chrono_literals;

struct Tol {
  float rtol, atol;
};

// kOne: one rounding (or the same float operations); kSum: sums in another
// order; kChain: several roundings in a row.
template <class F>
struct Tolerance;
template <>
struct Tolerance<cpu::F32Format> {
  static constexpr Tol kOne{1e-5f, 1e-6f}, kSum{1e-4f, 1e-5f}, kChain{1e-4f, 1e-5f};
};
template <>
struct Tolerance<cpu::Bf16Format> {
  static constexpr Tol kOne{1e-2f, 1e-2f}, kSum{2e-2f, 1e-2f}, kChain{5e-2f, 2e-2f};
};
template <>
struct Tolerance<cpu::F16Format> {
  static constexpr Tol kOne{2e-3f, 2e-3f}, kSum{4e-3f, 2e-3f}, kChain{1e-2f, 5e-3f};
};

// The same values in host memory (for the CPU kernel set) and GPU memory.
template <class E>
struct Twin {
  std::vector<E> host;
  DeviceArray<E> gpu;
};

// Which side of a Twin a kernel set works on.
struct OnHost {
  template <class E>
  E* operator()(Twin<E>& t) const { return t.host.data(); }
};
struct OnGpu {
  template <class E>
  E* operator()(Twin<E>& t) const { return t.gpu.data(); }
};

template <class F>
class CudaKernelParity : public ::testing::Test {
 protected:
  using T = typename F::T;
  using Tols = Tolerance<F>;
  static constexpr bool kF32 = std::is_same_v<T, float>;

  void SetUp() override {
    std::string why;
    if (dtrain::cuda::device_count(&why) == 0) GTEST_SKIP() << "no GPU to run CUDA kernels on: " << why;
    gpu_ = std::make_unique<cuda::CudaDevice>(0, 60s);
  }

  template <class E>
  Twin<E> twin(std::vector<E> values) {
    const std::size_t n = values.size();
    Twin<E> t{std::move(values), DeviceArray<E>(*gpu_, n)};
    gpu_->copy(t.gpu.data(), t.host.data(), t.gpu.bytes());
    gpu_->synchronize();
    return t;
  }
  // n values from normal(0, scale), seeded, stored as E.
  template <class E>
  Twin<E> random(std::size_t n, std::uint32_t seed, float scale = 1.0f) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, scale);
    std::vector<E> v(n);
    for (E& x : v) x = store<E>(dist(rng));
    return twin(std::move(v));
  }
  template <class E>
  Twin<E> filled(std::size_t n, float value) {
    return twin(std::vector<E>(n, store<E>(value)));
  }
  // `values` rounded to the storage format.
  Twin<T> rounded(const Twin<float>& values) {
    std::vector<T> v(values.host.size());
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = store<T>(values.host[i]);
    return twin(std::move(v));
  }
  Twin<std::int32_t> ints(std::size_t n, std::int32_t bound, std::uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<std::int32_t> dist(0, bound - 1);
    std::vector<std::int32_t> v(n);
    for (auto& x : v) x = dist(rng);
    return twin(std::move(v));
  }

  // fn(kernels, side): the CPU kernel set on host memory, then the CUDA one on GPU memory.
  template <class Fn>
  void both(Fn fn) {
    fn(cpu::HostKernels<F>(host_), OnHost{});
    fn(cuda::CudaKernels<F>(*gpu_), OnGpu{});
  }

  template <class E>
  void expect_close(Twin<E>& t, Tol tol, const std::string& what) {
    std::vector<E> gpu(t.host.size());
    gpu_->copy(gpu.data(), t.gpu.data(), t.gpu.bytes());
    gpu_->synchronize();
    std::size_t bad = 0, first = 0;
    for (std::size_t i = 0; i < gpu.size(); ++i) {
      const float want = load(t.host[i]), got = load(gpu[i]);
      if (!(std::fabs(got - want) <= tol.atol + tol.rtol * std::fabs(want)) && bad++ == 0) first = i;
    }
    EXPECT_EQ(bad, 0u) << what << " (" << dtype_name(F::kDType) << "): " << bad << " of " << gpu.size()
                       << " differ; first at " << first << ": gpu " << load(gpu[first]) << ", cpu "
                       << load(t.host[first]);
  }

  template <class E>
  static E store(float v) {
    if constexpr (std::is_same_v<E, float>) {
      return v;
    } else {
      return F::store(v);
    }
  }
  template <class E>
  static float load(E v) {
    if constexpr (std::is_same_v<E, T>) {
      return static_cast<float>(F::load(v));
    } else {
      return static_cast<float>(v);
    }
  }

  cpu::HostDevice host_;
  std::unique_ptr<cuda::CudaDevice> gpu_;
};

using Formats = ::testing::Types<cpu::F32Format, cpu::Bf16Format, cpu::F16Format>;
TYPED_TEST_SUITE(CudaKernelParity, Formats);

TYPED_TEST(CudaKernelParity, LayerNorm) {
  using T = typename TestFixture::T;
  const std::int64_t n = 37, c = 300;
  auto x = this->template random<float>(n * c, 1, 2.0f), w = this->template random<float>(c, 2);
  auto b = this->template random<float>(c, 3), dy = this->template random<float>(n * c, 4);
  auto y32 = this->template filled<float>(n * c, 0), y = this->template filled<T>(n * c, 0);
  auto mean = this->template filled<float>(n, 0), rstd = this->template filled<float>(n, 0);
  auto dx = this->template filled<float>(n * c, 1), dw = this->template filled<float>(c, 0.5f);
  auto db = this->template filled<float>(c, 0.5f);
  auto y_eps = this->template filled<float>(n * c, 0), rstd_eps = this->template filled<float>(n, 0);
  this->both([&](auto k, auto on) {
    k.layernorm_forward(on(x), on(w), on(b), on(y), on(mean), on(rstd), n, c);
    k.layernorm_forward(on(x), on(w), on(b), on(y32), on(mean), on(rstd), n, c);
    k.layernorm_backward(on(dy), on(x), on(w), on(mean), on(rstd), on(dx), on(dw), on(db), n, c, true);
    // Another eps, large enough to move rstd by far more than the tolerance (var(x) is about 4).
    k.layernorm_forward(on(x), on(w), on(b), on(y_eps), on(mean), on(rstd_eps), n, c, nullptr, 0.5f);
  });
  this->expect_close(y, TestFixture::Tols::kSum, "y");
  this->expect_close(y32, Tolerance<cpu::F32Format>::kSum, "y f32");
  this->expect_close(rstd, Tolerance<cpu::F32Format>::kSum, "rstd");
  this->expect_close(dx, Tolerance<cpu::F32Format>::kSum, "dx");
  this->expect_close(dw, Tolerance<cpu::F32Format>::kSum, "dweight");
  this->expect_close(db, Tolerance<cpu::F32Format>::kSum, "dbias");
  this->expect_close(y_eps, Tolerance<cpu::F32Format>::kSum, "y, eps 0.5");
  this->expect_close(rstd_eps, Tolerance<cpu::F32Format>::kSum, "rstd, eps 0.5");
}

TYPED_TEST(CudaKernelParity, RmsNorm) {
  using T = typename TestFixture::T;
  constexpr Tol kF32Sum = Tolerance<cpu::F32Format>::kSum;
  const std::int64_t n = 37, c = 300;
  const float eps = 1e-5f;
  auto x = this->template random<float>(n * c, 40, 2.0f), w = this->template random<float>(c, 41);
  auto dy = this->template random<float>(n * c, 42), y = this->template filled<T>(n * c, 0);
  auto y32 = this->template filled<float>(n * c, 0), x_copy = this->template filled<float>(n * c, 0);
  auto rstd = this->template filled<float>(n, 0), dx = this->template filled<float>(n * c, 1);
  auto dx_new = this->template filled<float>(n * c, 1), dw = this->template filled<float>(c, 0.5f);
  this->both([&](auto k, auto on) {
    k.rmsnorm_forward(on(x), on(w), on(y), on(rstd), n, c, eps);
    k.rmsnorm_forward(on(x), on(w), on(y32), on(rstd), n, c, eps, on(x_copy));
    k.rmsnorm_backward(on(dy), on(x), on(w), on(rstd), on(dx), on(dw), n, c, true);
    k.rmsnorm_backward(on(dy), on(x), on(w), on(rstd), on(dx_new), on(dw), n, c, false);
  });
  this->expect_close(y, TestFixture::Tols::kSum, "y");
  this->expect_close(y32, kF32Sum, "y f32");
  this->expect_close(x_copy, Tol{0, 0}, "x_copy");
  this->expect_close(rstd, kF32Sum, "rstd");
  this->expect_close(dx, kF32Sum, "dx accumulated");
  this->expect_close(dx_new, kF32Sum, "dx written");
  this->expect_close(dw, kF32Sum, "dweight, twice");
}

// The graph's uses: 16-bit products with a bias, added to a residual or into
// an f32 output, and the backward with the bias summed from f32 or from dy.
TYPED_TEST(CudaKernelParity, Linear) {
  using T = typename TestFixture::T;
  using Tols = typename TestFixture::Tols;
  const std::int64_t n = 24, in = 40, out = 56;
  auto x = this->template random<T>(n * in, 5), w = this->template random<T>(out * in, 6, 0.2f);
  auto b = this->template random<float>(out, 7), dy32 = this->template random<float>(n * out, 8);
  auto dy = this->rounded(dy32);  // the gradient the graph rounds from dy_f32
  auto y = this->template random<T>(n * out, 9), y32 = this->template filled<float>(n * out, 0);
  auto dx = this->template filled<T>(n * in, 0), dx32 = this->template filled<float>(n * in, 0);
  auto dw = this->template filled<float>(out * in, 0.25f), db = this->template filled<float>(out, 0.5f);
  auto dw2 = this->template filled<float>(out * in, 0), db2 = this->template filled<float>(out, 0);
  this->both([&](auto k, auto on) {
    k.linear_forward(on(x), on(w), on(b), on(y), n, in, out, true);
    k.linear_forward(on(x), on(w), nullptr, on(y32), n, in, out, false);
    k.linear_backward(on(dy), nullptr, on(x), on(w), on(dx), on(dw), on(db), n, in, out);
    k.linear_backward(on(dy), on(dy32), on(x), on(w), on(dx32), on(dw2), on(db2), n, in, out);
  });
  this->expect_close(y, Tols::kChain, "y += x W^T + b");
  this->expect_close(y32, Tols::kSum, "f32 y = x W^T");
  this->expect_close(dx, Tols::kSum, "dx");
  this->expect_close(dx32, Tols::kSum, "f32 dx");
  this->expect_close(dw, Tols::kSum, "dweight");
  this->expect_close(db, Tols::kSum, "dbias from dy");
  this->expect_close(db2, Tolerance<cpu::F32Format>::kSum, "dbias from dy_f32");
}

// The bias epilogue of cuda::gemm (nn/cuda/matmul.h) as the graph uses it:
// into 16-bit and f32 outputs, with and without the accumulation, at an
// output width that is a multiple of 8 and one that is not. Each product runs
// twice, the second time with another bias and output: the plan made by the
// first call is reused.
TYPED_TEST(CudaKernelParity, LinearBias) {
  using T = typename TestFixture::T;
  using Tols = typename TestFixture::Tols;
  const std::int64_t n = 19, in = 40;
  for (const std::int64_t out : {std::int64_t{64}, std::int64_t{37}}) {
    const auto seed = static_cast<std::uint32_t>(out);
    auto x = this->template random<T>(n * in, seed), w = this->template random<T>(out * in, seed + 1, 0.2f);
    std::vector<Twin<float>> biases;  // all alive at once: two bias pointers
    for (std::uint32_t i = 0; i < 2; ++i) biases.push_back(this->template random<float>(out, seed + 2 + i, 1.0f + i));
    for (std::size_t i = 0; i < biases.size(); ++i) {
      const std::uint32_t s = seed + 10 * static_cast<std::uint32_t>(i + 1);
      auto y = this->template filled<T>(n * out, 0.5f), r = this->template random<T>(n * out, s);
      auto z = this->template filled<float>(n * out, 0.5f), a = this->template random<float>(n * out, s + 1);
      Twin<float>& b = biases[i];
      this->both([&](auto k, auto on) {
        k.linear_forward(on(x), on(w), on(b), on(y), n, in, out, false);
        k.linear_forward(on(x), on(w), on(b), on(r), n, in, out, true);
        k.linear_forward(on(x), on(w), on(b), on(z), n, in, out, false);
        k.linear_forward(on(x), on(w), on(b), on(a), n, in, out, true);
      });
      const std::string what = "out " + std::to_string(out) + ", call " + std::to_string(i + 1) + ": ";
      this->expect_close(y, Tols::kChain, what + "y = x W^T + b");
      this->expect_close(r, Tols::kChain, what + "y += x W^T + b");
      this->expect_close(z, Tols::kSum, what + "f32 y = x W^T + b");
      this->expect_close(a, Tols::kSum, what + "f32 y += x W^T + b");
    }
  }
  // One plan per width, output type and accumulation: the second calls made none.
  const cuda::Blas::PlanCounts plans = this->gpu_->blas().plan_counts();
  EXPECT_EQ(plans.fused + plans.fallback, TestFixture::kF32 ? 4u : 8u);
  int major = 0;
  DTRAIN_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  if (major >= 8) {
    EXPECT_EQ(plans.fallback, 0u) << "cuBLASLt had no bias epilogue for some of these products";
  }
}

// Operands, bias and output at addresses only 2 (16-bit) or 4 (f32) bytes
// aligned, as views into one allocation (the parameters) are: the plan's
// algorithm must not need more (or the product falls back).
TYPED_TEST(CudaKernelParity, LinearBiasUnaligned) {
  using T = typename TestFixture::T;
  using Tols = typename TestFixture::Tols;
  const std::int64_t n = 9, in = 24, out = 40;
  auto x = this->template random<T>(n * in + 1, 70), w = this->template random<T>(out * in + 1, 71, 0.2f);
  auto b = this->template random<float>(out + 1, 72), y = this->template random<T>(n * out + 1, 73);
  auto z = this->template random<float>(n * out + 1, 74);
  this->both([&](auto k, auto on) {
    k.linear_forward(on(x) + 1, on(w) + 1, on(b) + 1, on(y) + 1, n, in, out, true);
    k.linear_forward(on(x) + 1, on(w) + 1, on(b) + 1, on(z) + 1, n, in, out, true);
  });
  this->expect_close(y, Tols::kChain, "y += x W^T + b");
  this->expect_close(z, Tols::kSum, "f32 y += x W^T + b");
}

// cuda::gemm itself against cpu::gemm: batched products with one bias for
// every item, a transposed B, padded rows and a padded batch stride in C
// (the padding must stay as it was), into 16-bit and f32 outputs, with and
// without the accumulation.
TYPED_TEST(CudaKernelParity, BatchedGemmWithBias) {
  using T = typename TestFixture::T;
  using Tols = typename TestFixture::Tols;
  constexpr DType kType = TypeParam::kDType;
  cpu::Gemm g{.m = 6,
              .n = 13,
              .k = 9,
              .trans_b = true,
              .ldc = 16,
              .batch = 3,
              .stride_c = 6 * 16 + 8,
              .a_type = kType,
              .b_type = kType};
  const auto c_elems = static_cast<std::size_t>(g.batch * g.stride_c);
  auto a = this->template random<T>(g.batch * g.m * g.k, 80), b = this->template random<T>(g.batch * g.n * g.k, 81);
  auto bias = this->template random<float>(g.n, 82);
  for (const bool accumulate : {false, true}) {
    g.accumulate = accumulate;
    auto c = this->template random<T>(c_elems, 83), c32 = this->template random<float>(c_elems, 84);
    for (const bool f32_c : {false, true}) {
      g.c_type = f32_c ? DType::f32 : kType;
      void* host_c = f32_c ? static_cast<void*>(c32.host.data()) : c.host.data();
      void* gpu_c = f32_c ? static_cast<void*>(c32.gpu.data()) : c.gpu.data();
      cpu::gemm(g, a.host.data(), b.host.data(), host_c, bias.host.data());
      cuda::gemm(this->gpu_->blas(), g, a.gpu.data(), b.gpu.data(), gpu_c, bias.gpu.data(), this->gpu_->stream());
    }
    const std::string what = accumulate ? "C += " : "C = ";
    this->expect_close(c, Tols::kChain, what + "A B^T + bias, batched");
    this->expect_close(c32, Tols::kSum, what + "A B^T + bias, batched, f32 C");
  }
}

// Both of the GPU's ways: the tiled steps over the whole-batch scratch, and
// the one-pass kernels (given only the scratch they use, delta, as the graph
// allocates it), for each head dim those are compiled for (8, 32 and 64 ->
// 64, 100 -> 128, zero-padded), with sequences that end inside a block of 64
// query rows and inside a tile of 32 keys; beyond kOnePassMaxHeadDim, tiled only.
TYPED_TEST(CudaKernelParity, Attention) {
  using T = typename TestFixture::T;
  using Tols = typename TestFixture::Tols;
  const AttentionShape shapes[] = {{2, 16, 2, 8, false}, {1, 37, 3, 32, false}, {1, 100, 2, 64, false},
                                   {2, 70, 1, 100, false}, {1, 20, 1, kOnePassMaxHeadDim + 8, false}};
  for (const AttentionShape& shape : shapes) {
    for (const bool one_pass : {false, true}) {
      if (one_pass && shape.head_dim > kOnePassMaxHeadDim) continue;
      for (const bool causal : {false, true}) {
        AttentionShape s = shape;
        s.causal = causal;
        const auto he = static_cast<std::size_t>(s.head_elems()), se = static_cast<std::size_t>(s.score_elems());
        const auto re = static_cast<std::size_t>(s.row_elems());
        auto qkv = this->template random<T>(3 * he, 10), d_out = this->template random<T>(he, 11);
        auto out = this->template filled<T>(he, 0), d_qkv = this->template filled<T>(3 * he, 0);
        auto q = this->template filled<T>(he, 0), kk = this->template filled<T>(he, 0);
        auto v = this->template filled<T>(he, 0), lse = this->template filled<float>(re, 0);
        auto scores = this->template filled<float>(se, 0), dp = this->template filled<float>(se, 0);
        auto probs = this->template filled<T>(se, 0), d_scores = this->template filled<T>(se, 0);
        auto heads = this->template filled<T>(he, 0), dq = this->template filled<float>(he, 0);
        auto dk = this->template filled<float>(he, 0), dv = this->template filled<float>(he, 0);
        auto delta = this->template filled<float>(re, 0);
        this->both([&](auto k, auto on) {
          const AttentionSaved<T> saved{on(q), on(kk), on(v), on(lse)};
          AttentionScratch<T> scratch{};
          if (one_pass) {
            scratch.delta = on(delta);
          } else if constexpr (TestFixture::kF32) {  // as the graph passes them: P over S, dS over dP
            scratch = {on(scores), on(dp), on(scores), on(dp), on(heads), on(dq), on(dk), on(dv), nullptr};
          } else {
            scratch = {on(scores), on(dp), on(probs), on(d_scores), on(heads), on(dq), on(dk), on(dv), nullptr};
          }
          k.attention_forward(s, on(qkv), on(out), saved, scratch);
          k.attention_backward(s, on(d_out), on(d_qkv), saved, scratch);
        });
        const std::string what = fmt::format("{}T {} hd {} ({}): ", causal ? "causal " : "", s.seq, s.head_dim,
                                             one_pass ? "one pass" : "tiled");
        this->expect_close(lse, Tolerance<cpu::F32Format>::kSum, what + "lse");
        this->expect_close(out, Tols::kSum, what + "out");
        this->expect_close(d_qkv, Tols::kChain, what + "d_qkv");
      }
    }
  }
}

// Decoding: a prompt of 5 rows after 3 cached positions, then one more row.
TYPED_TEST(CudaKernelParity, AttentionCached) {
  using T = typename TestFixture::T;
  const std::int64_t heads = 2, hd = 8, capacity = 16, d = heads * hd;
  auto k_cache = this->template random<T>(heads * capacity * hd, 26);
  auto v_cache = this->template random<T>(heads * capacity * hd, 27);
  auto qkv = this->template random<T>(5 * 3 * d, 28), out = this->template filled<T>(5 * d, 0);
  auto scores = this->template filled<float>(capacity, 0);
  this->both([&](auto k, auto on) {
    k.attention_cached(AttentionShape{1, 5, heads, hd, true}, 3, capacity, on(qkv), on(k_cache), on(v_cache),
                       on(out), on(scores));
    k.attention_cached(AttentionShape{1, 1, heads, hd, true}, 8, capacity, on(qkv), on(k_cache), on(v_cache),
                       on(out), on(scores));
  });
  this->expect_close(k_cache, Tol{0, 0}, "k cache");
  this->expect_close(v_cache, Tol{0, 0}, "v cache");
  this->expect_close(out, TestFixture::Tols::kSum, "out");
}

TYPED_TEST(CudaKernelParity, GeluAndStorage) {
  using T = typename TestFixture::T;
  const std::int64_t rows = 31, cols = 97, n = rows * cols;
  auto x = this->template random<T>(n, 12, 2.0f), y = this->template filled<T>(n, 0);
  auto dy = this->template random<T>(n, 13), f = this->template random<float>(n, 14, 3.0f);
  auto stored = this->template filled<T>(n, 0);
  auto dy2 = this->template random<T>(n, 17), db = this->template random<float>(cols, 18);
  this->both([&](auto k, auto on) {
    k.gelu_forward(on(x), on(y), on(x), n);  // x becomes gelu'(x), as in the graph
    k.gelu_backward(on(dy), on(x), on(dy), nullptr, 1, n);
    k.gelu_backward(on(dy2), on(x), on(dy2), on(db), rows, cols);  // with fc1's bias gradient
    k.to_storage(on(f), on(stored), n);
  });
  this->expect_close(y, TestFixture::Tols::kOne, "gelu");
  this->expect_close(x, TestFixture::Tols::kOne, "gelu'");
  this->expect_close(dy, TestFixture::Tols::kOne, "gelu backward");
  this->expect_close(dy2, TestFixture::Tols::kOne, "gelu backward with bias");
  this->expect_close(db, TestFixture::Tols::kSum, "gelu backward's bias gradient");
  this->expect_close(stored, Tol{0, 0}, "to_storage");
}

// The rotary heads (nn/rotary.h) for grouped and plain heads, with and
// without the rotation, from a position past 0 (decoding after a prompt).
// Without a rotation forward is a copy (exact); the backward sums of a
// group are in head order on both (f32 sums then the same bits). The table
// is the CPU's, copied to the GPU as the graph does.
TYPED_TEST(CudaKernelParity, QkvHeads) {
  using T = typename TestFixture::T;
  using Tols = typename TestFixture::Tols;
  for (const std::int64_t kv_heads : {4, 2, 1}) {
    for (const bool rotate : {false, true}) {
      const HeadsShape s{.batch = 2, .seq = 5, .heads = 4, .kv_heads = kv_heads, .head_dim = 8, .position = 3};
      const std::int64_t rows = s.batch * s.seq, width = s.packed_width(), half = s.head_dim / 2;
      const std::int64_t positions = s.position + s.seq;
      std::vector<float> cos(static_cast<std::size_t>(positions * half)), sin(cos.size());
      rope_table(10000.0, s.head_dim, positions, cos.data(), sin.data());
      auto cos_t = this->twin(std::move(cos)), sin_t = this->twin(std::move(sin));
      const auto seed = static_cast<std::uint32_t>(50 + 2 * kv_heads + (rotate ? 1 : 0));
      auto packed = this->template random<T>(rows * width, seed);
      auto d_qkv = this->template random<T>(rows * 3 * s.heads * s.head_dim, seed + 10);
      auto qkv = this->template filled<T>(rows * 3 * s.heads * s.head_dim, 0);
      auto d_packed = this->template filled<T>(rows * width, 0), d_packed2 = this->template filled<T>(rows * width, 0);
      auto d_bias = this->template random<float>(width, seed + 20);
      this->both([&](auto k, auto on) {
        const float* c = rotate ? on(cos_t) : nullptr;
        const float* sn = rotate ? on(sin_t) : nullptr;
        k.qkv_heads_forward(s, on(packed), on(qkv), c, sn);
        k.qkv_heads_backward(s, on(d_qkv), on(d_packed), c, sn);
        k.qkv_heads_backward(s, on(d_qkv), on(d_packed2), c, sn, on(d_bias));
      });
      const std::string what = fmt::format("{} kv heads of 4, {}: ", kv_heads, rotate ? "rotated" : "not rotated");
      this->expect_close(qkv, rotate ? Tols::kOne : Tol{0, 0}, what + "qkv");
      this->expect_close(d_packed, rotate ? Tols::kSum : Tols::kOne, what + "d_packed");
      this->expect_close(d_packed2, rotate ? Tols::kSum : Tols::kOne, what + "d_packed with the bias gradient");
      this->expect_close(d_bias, Tolerance<cpu::F32Format>::kSum, what + "d_bias");
    }
  }
}

// SwiGLU dense and with padded rows (the padding, the same on both sides
// before, must be left as it was); the bias gradient of the gate/up
// projection.
TYPED_TEST(CudaKernelParity, SwiGlu) {
  using T = typename TestFixture::T;
  using Tols = typename TestFixture::Tols;
  const std::int64_t n = 29, c = 50;
  for (const std::int64_t pad : {0, 3}) {
    const std::int64_t ld_h = 2 * c + pad, ld_a = c + 2 * pad;
    const auto seed = static_cast<std::uint32_t>(60 + pad);
    auto h = this->template random<T>(n * ld_h, seed, 3.0f), da = this->template random<T>(n * ld_a, seed + 1);
    auto a = this->template random<T>(n * ld_a, seed + 2), d_h = this->template random<T>(n * ld_h, seed + 3);
    auto d_h2 = this->template random<T>(n * ld_h, seed + 4), d_bias = this->template random<float>(2 * c, seed + 5);
    this->both([&](auto k, auto on) {
      const std::int64_t lh = pad == 0 ? 0 : ld_h, la = pad == 0 ? 0 : ld_a;  // 0: dense, the default
      k.swiglu_forward(on(h), on(a), n, c, lh, la);
      k.swiglu_backward(on(da), on(h), on(d_h), nullptr, n, c, la, lh);
      k.swiglu_backward(on(da), on(h), on(d_h2), on(d_bias), n, c, la, lh);
    });
    const std::string what = pad == 0 ? "dense: " : "padded rows: ";
    this->expect_close(a, Tols::kOne, what + "a");
    this->expect_close(d_h, Tols::kOne, what + "d_h");
    this->expect_close(d_h2, Tols::kOne, what + "d_h with the bias gradient");
    this->expect_close(d_bias, Tolerance<cpu::F32Format>::kSum, what + "d_bias");
  }
}

// GELU's tanh form: y and dydx, and y alone; normal(0, 3) inputs, into both tails.
TYPED_TEST(CudaKernelParity, GeluTanh) {
  using T = typename TestFixture::T;
  const std::int64_t n = 3001;
  auto x = this->template random<T>(n, 30, 3.0f), y = this->template filled<T>(n, 0);
  auto dydx = this->template filled<T>(n, 0), y_only = this->template filled<T>(n, 0);
  this->both([&](auto k, auto on) {
    k.gelu_forward(on(x), on(y), on(dydx), n, GeluForm::tanh);
    k.gelu_forward(on(x), on(y_only), nullptr, n, GeluForm::tanh);
  });
  this->expect_close(y, TestFixture::Tols::kOne, "tanh gelu");
  this->expect_close(dydx, TestFixture::Tols::kOne, "tanh gelu'");
  this->expect_close(y_only, TestFixture::Tols::kOne, "tanh gelu without gelu'");
}

// The kernels without a storage format, once.
class CudaKernels : public CudaKernelParity<cpu::F32Format> {};
constexpr Tol kOne = Tolerance<cpu::F32Format>::kOne, kSum = Tolerance<cpu::F32Format>::kSum;

TEST_F(CudaKernels, DropoutAndResidual) {
  const std::int64_t n = 5000;
  auto x = random<float>(n, 15), branch = random<float>(n, 16), out = filled<float>(n, 0);
  const std::uint64_t key = dropout_key(7, 3, 1, 2, 96);
  both([&](auto k, auto on) {
    k.dropout(on(x), n, 0.25f, key);
    k.residual(on(x), on(branch), on(out), n);
  });
  expect_close(x, Tol{0, 0}, "dropout: the same mask and scale");
  expect_close(out, kOne, "residual");
}

TEST_F(CudaKernels, Embeddings) {
  const std::int64_t B = 3, T = 7, d = 24, V = 11, P = 12;
  auto tokens = ints(B * T, V, 17);
  tokens.host[1] = tokens.host[0];  // a repeated token: its table row gets both gradients
  tokens = twin(tokens.host);
  auto table = random<float>(V * d, 18), pos = random<float>(T * d, 19), d_out = random<float>(B * T * d, 20);
  auto patches = random<float>(B * T * P, 21), pw = random<float>(d * P, 22), pb = random<float>(d, 23);
  auto out = filled<float>(B * T * d, 0), pout = filled<float>(B * T * d, 0), pooled = filled<float>(B * d, 0);
  auto d_table = filled<float>(V * d, 0.5f), d_pos = filled<float>(T * d, 0.25f), d_pw = filled<float>(d * P, 0);
  auto d_pb = filled<float>(d, 0), d_pos2 = filled<float>(T * d, 0), d_x = filled<float>(B * T * d, 0);
  both([&](auto k, auto on) {
    k.token_embedding_forward(on(tokens), on(table), on(pos), on(out), B, T, d, V);
    k.token_embedding_backward(on(tokens), on(d_out), on(d_table), on(d_pos), B, T, d);
    k.patch_embedding_forward(on(patches), on(pw), on(pb), on(pos), on(pout), B, T, d, P);
    k.patch_embedding_backward(on(patches), on(d_out), on(d_pw), on(d_pb), on(d_pos2), B, T, d, P);
    k.mean_pool_forward(on(out), on(pooled), B, T, d);
    k.mean_pool_backward(on(pooled), on(d_x), B, T, d);
  });
  expect_close(out, kOne, "token embedding");
  expect_close(d_table, kSum, "d_table");
  expect_close(d_pos, kSum, "d_pos");
  expect_close(pout, kSum, "patch embedding");
  expect_close(d_pw, kSum, "d_patch.weight");
  expect_close(d_pb, kSum, "d_patch.bias");
  expect_close(d_pos2, kSum, "patch d_pos");
  expect_close(pooled, kSum, "mean pool");
  expect_close(d_x, kSum, "mean pool backward");
}

TEST_F(CudaKernels, CrossEntropyAddsToTheTotals) {
  const std::int64_t n = 33, v = 301;
  auto logits = random<float>(n * v, 24, 3.0f);
  auto targets = ints(n, v, 25);
  targets.host[0] = 0;
  targets = twin(targets.host);
  auto totals = twin(std::vector<CrossEntropyTotals>{{1.5, 2}});  // forward adds to what is there
  both([&](auto k, auto on) {
    k.cross_entropy_forward(on(logits), on(targets), on(logits), n, v, on(totals));
    k.cross_entropy_forward(on(logits), on(targets), on(logits), 1, v, on(totals));  // softmax of a softmax row
    k.cross_entropy_backward(on(logits), on(targets), n, v, 0.125f);
  });
  expect_close(logits, kSum, "d_logits");
  std::vector<CrossEntropyTotals> got(1);
  gpu_->copy(got.data(), totals.gpu.data(), totals.gpu.bytes());
  gpu_->synchronize();
  EXPECT_NEAR(got[0].loss_sum, totals.host[0].loss_sum, 1e-5 * totals.host[0].loss_sum);
  EXPECT_EQ(got[0].correct, totals.host[0].correct);
}

#endif

}  // namespace
}  // namespace dtrain::nn
