#include "nn/cuda/matmul.h"

#include <cublas_v2.h>

#include <climits>

#include "core/error.h"
#include "core/cuda/check.h"
#include "nn/cuda/bias.h"

namespace dtrain::nn::cuda {
namespace {

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::f32:
      return CUDA_R_32F;
    case DType::bf16:
      return CUDA_R_16BF;
    case DType::f16:
      return CUDA_R_16F;
    default:
      throw Error(fmt::format("cuda gemm: unsupported element type {}", dtype_name(t)));
  }
}

void validate(const Gemm& g, bool with_bias) {
  const auto fits = [](std::int64_t v) { return v > 0 && v <= INT_MAX; };  // cuBLAS takes int
  const bool lds = g.lda <= INT_MAX && g.ldb <= INT_MAX && g.ldc <= INT_MAX;
  const bool sizes = fits(g.m) && fits(g.n) && fits(g.k) && fits(g.batch) && lds;
  const bool half_ab = g.a_type != DType::f32 && g.a_type == g.b_type;
  const bool types = (g.a_type == DType::f32 && g.b_type == DType::f32) || half_ab;
  const bool c_ok = g.c_type == DType::f32 || (half_ab && g.c_type == g.a_type);
  if (!sizes || !types || !c_ok || (with_bias && g.alpha != 1.0f)) {
    throw Error(fmt::format("cuda gemm: unsupported or malformed shape {}", cpu::gemm_string(g)));
  }
}

}  // namespace

Blas::Blas(bool allow_tf32) {
  DTRAIN_CUDA_CHECK(cublasCreate(&handle_));
  // Set explicitly so that a process-wide default cannot lower fp32 products
  // to TF32; the default mode still runs 16-bit operands on tensor cores.
  DTRAIN_CUDA_CHECK(
      cublasSetMathMode(handle_, allow_tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
}

Blas::~Blas() {
  if (handle_ != nullptr) cublasDestroy(handle_);
}

// Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: cuBLAS gets
// B as its first operand and A as its second, each with its own transpose.
void gemm(Blas& blas, const Gemm& g, const void* a, const void* b, void* c, const float* bias,
          cudaStream_t stream) {
  validate(g, bias != nullptr);
  const std::int64_t lda = g.lda != 0 ? g.lda : (g.trans_a ? g.m : g.k);
  const std::int64_t ldb = g.ldb != 0 ? g.ldb : (g.trans_b ? g.k : g.n);
  const std::int64_t ldc = g.ldc != 0 ? g.ldc : g.n;
  const std::int64_t stride_a = g.stride_a != 0 ? g.stride_a : (g.trans_a ? g.k : g.m) * lda;
  const std::int64_t stride_b = g.stride_b != 0 ? g.stride_b : (g.trans_b ? g.n : g.k) * ldb;
  const std::int64_t stride_c = g.stride_c != 0 ? g.stride_c : g.m * ldc;
  if (bias != nullptr) {
    broadcast_bias(bias, c, g.c_type, g.m, g.n, ldc, stride_c, g.batch, g.accumulate, stream);
  }
  const float alpha = g.alpha;
  const float beta = (g.accumulate || bias != nullptr) ? 1.0f : 0.0f;
  DTRAIN_CUDA_CHECK(cublasSetStream(blas.handle(), stream));
  DTRAIN_CUDA_CHECK(cublasGemmStridedBatchedEx(
      blas.handle(), g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
      static_cast<int>(g.n), static_cast<int>(g.m), static_cast<int>(g.k), &alpha, b,
      cuda_type(g.b_type), static_cast<int>(ldb), stride_b, a, cuda_type(g.a_type),
      static_cast<int>(lda), stride_a, &beta, c, cuda_type(g.c_type), static_cast<int>(ldc),
      stride_c, static_cast<int>(g.batch), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace dtrain::nn::cuda
