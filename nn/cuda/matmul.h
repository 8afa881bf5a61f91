// Every matrix multiply of the GPU path: cuBLAS (cublasGemmStridedBatchedEx)
// behind the CPU's interface. A cpu::Gemm (nn/cpu/matmul.h) means the same
// thing on both devices: row-major C[M,N] = alpha * op(A) op(B) (+ bias[N])
// (+ C if accumulate), the same transposes, leading dimensions and batch
// strides (0 = dense), so a layer builds one Gemm and runs it on either device.
#pragma once

#include <cublas_api.h>
#include <cuda_runtime_api.h>

#include "nn/cpu/matmul.h"

namespace dtrain::nn::cuda {

using cpu::Gemm;

// A cuBLAS handle. Threading: one thread uses a Blas at a time (cuBLAS handles
// are not safe to share between threads that call at once); make one per
// thread. fp32 products run in true fp32 unless allow_tf32 (TF32 tensor cores:
// ~10 mantissa bits per operand, faster, outside the fp32 parity tolerances).
class Blas {
 public:
  explicit Blas(bool allow_tf32 = false);
  ~Blas();
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;
  cublasHandle_t handle() const { return handle_; }

 private:
  cublasHandle_t handle_ = nullptr;
};

// Runs g on `stream` (the handle is bound to it for this call); asynchronous.
// a, b, c: device memory of g.a_type, g.b_type, g.c_type; bias: f32 [N] or null.
// REQUIRES (as the CPU): m, n, k, batch > 0; a_type and b_type both f32 or
// both the same 16-bit type (products accumulate in f32); c_type f32 or that
// 16-bit type; alpha == 1 when a bias is given. Throws dtrain::Error naming
// the shape when g is malformed, or cuBLAS's status when the call fails.
// With a 16-bit C and a bias, the bias is rounded to C's type before the
// product is added (the CPU adds it in f32): a difference of one rounding.
void gemm(Blas& blas, const Gemm& g, const void* a, const void* b, void* c, const float* bias,
          cudaStream_t stream);

}  // namespace dtrain::nn::cuda
