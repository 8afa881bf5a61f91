// Every matrix multiply of the GPU path: cuBLAS behind the CPU's interface. A
// cpu::Gemm (nn/cpu/matmul.h) means the same thing on both devices: row-major
// C[M,N] = alpha * op(A) op(B) (+ bias[N]) (+ C if accumulate), the same
// transposes, leading dimensions and batch strides (0 = dense), so a layer
// builds one Gemm and runs it on either device.
//
// A product with a bias is one cublasLtMatmul with the bias epilogue, the
// accumulation into C included (beta = 1 with C as both input and output).
// Where cuBLASLt has no algorithm for it (or refuses it), the bias is first
// broadcast into C by a kernel and cublasGemmStridedBatchedEx adds the product
// (beta = 1); products without a bias always run the latter.
#pragma once

#include <cublasLt.h>
#include <cublas_api.h>
#include <cuda_runtime_api.h>

#include <compare>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>

#include "nn/cpu/matmul.h"

namespace dtrain::nn::cuda {

using cpu::Gemm;

// A cuBLAS handle and a cuBLASLt one, with the latter's workspace and plans.
// Threading: one thread uses a Blas at a time, without locks (cuBLAS handles
// are not safe to share between threads that call at once); make one per
// thread. Its calls share one workspace: calls queued on different streams
// must not overlap (dtrain binds a Blas to one stream).
// Memory: a 32 MiB workspace from construction on. The first product with a
// bias of each shape (dimensions, types, accumulation, batch strides and the
// operands' address alignment) makes a plan: cuBLASLt's descriptors and the
// algorithm its heuristic chose, or the decision to fall back. Plans are kept
// until the destructor; later calls of the same shape allocate nothing. A
// 16-bit C's rounded bias lives in a scratch grown to the widest N seen.
// fp32 products run in true fp32 unless allow_tf32 (TF32 tensor cores:
// ~10 mantissa bits per operand, faster, outside the fp32 parity tolerances).
class Blas {
 public:
  explicit Blas(bool allow_tf32 = false);
  ~Blas();
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;
  cublasHandle_t handle() const { return handle_; }

  // The plans made so far: fused (cublasLtMatmul) or fallen back. For tests.
  struct PlanCounts {
    std::size_t fused = 0, fallback = 0;
  };
  PlanCounts plan_counts() const;

 private:
  struct Plan;  // matmul.cpp
  // What a plan depends on: the shape (dense defaults filled in; strides 0
  // for a single item), types, accumulation, and the alignment in bytes (up
  // to 256) of the addresses cuBLASLt reads: A, B, C (every batch item's)
  // and the bias.
  struct PlanKey {
    std::int64_t m, n, k, lda, ldb, ldc, batch, stride_a, stride_b, stride_c;
    bool trans_a, trans_b, accumulate;
    DType a_type, b_type, c_type;
    std::uint32_t align_a, align_b, align_c, align_bias;
    auto operator<=>(const PlanKey&) const = default;
  };

  friend void gemm(Blas& blas, const Gemm& g, const void* a, const void* b, void* c, const float* bias,
                   cudaStream_t stream);
  bool run_fused(const Gemm& g, const void* a, const void* b, void* c, const float* bias, cudaStream_t stream);
  std::unique_ptr<Plan> make_plan(const Gemm& g, const PlanKey& key, const void* lt_bias);
  void reserve_half_bias(std::int64_t n);
  void release() noexcept;

  bool allow_tf32_;
  cublasHandle_t handle_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  void* workspace_ = nullptr;
  void* half_bias_ = nullptr;  // the bias rounded to a 16-bit C's type
  std::int64_t half_bias_elems_ = 0;
  std::map<PlanKey, std::unique_ptr<Plan>> plans_;
};

// Runs g on `stream` (the handles are bound to it for this call); asynchronous.
// a, b, c: device memory of g.a_type, g.b_type, g.c_type; bias: f32 [N] or null.
// REQUIRES (as the CPU): m, n, k, batch > 0; a_type and b_type both f32 or
// both the same 16-bit type (products accumulate in f32); c_type f32 or that
// 16-bit type; alpha == 1 when a bias is given. Throws dtrain::Error naming
// the shape when g is malformed, or cuBLAS's status when the call fails.
// Rounding with a bias: cuBLASLt sums product, bias and (accumulating) C in
// f32 and rounds once to C's type. It reads the bias in C's type (the only
// one it documents for these types), so a 16-bit C's bias is rounded to that
// type first, which the CPU does not do. The fallback path rounds bias (+ C)
// to C's type before the product is added: with a 16-bit C and accumulate,
// one rounding more.
void gemm(Blas& blas, const Gemm& g, const void* a, const void* b, void* c, const float* bias, cudaStream_t stream);

}  // namespace dtrain::nn::cuda
