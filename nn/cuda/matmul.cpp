#include "nn/cuda/matmul.h"

#include <cublas_v2.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <type_traits>

#include "core/cuda/check.h"
#include "core/error.h"
#include "nn/cuda/bias.h"
#include "nn/cuda/convert.h"

// A failed setup call of a plan: CUBLAS_STATUS_NOT_SUPPORTED means cuBLASLt
// refuses the product, so the plan (left unfused) is returned; any other
// failure throws like DTRAIN_CUDA_CHECK.
#define DTRAIN_LT_SETUP(call)                                                      \
  do {                                                                             \
    const cublasStatus_t dtrain_lt_status_ = (call);                               \
    if (dtrain_lt_status_ == CUBLAS_STATUS_NOT_SUPPORTED) return plan;             \
    if (::dtrain::cuda::failed(dtrain_lt_status_)) {                               \
      ::dtrain::cuda::throw_failure(dtrain_lt_status_, #call, __FILE__, __LINE__); \
    }                                                                              \
  } while (0)

namespace dtrain::nn::cuda {
namespace {

constexpr std::size_t kWorkspaceBytes = std::size_t{32} << 20;

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

// g's leading dimensions and batch strides, the dense defaults filled in.
struct Dims {
  std::int64_t lda, ldb, ldc, stride_a, stride_b, stride_c;
};

Dims dims(const Gemm& g) {
  Dims d{};
  d.lda = g.lda != 0 ? g.lda : (g.trans_a ? g.m : g.k);
  d.ldb = g.ldb != 0 ? g.ldb : (g.trans_b ? g.k : g.n);
  d.ldc = g.ldc != 0 ? g.ldc : g.n;
  d.stride_a = g.stride_a != 0 ? g.stride_a : (g.trans_a ? g.k : g.m) * d.lda;
  d.stride_b = g.stride_b != 0 ? g.stride_b : (g.trans_b ? g.n : g.k) * d.ldb;
  d.stride_c = g.stride_c != 0 ? g.stride_c : g.m * d.ldc;
  return d;
}

// The largest power of two up to 256 dividing p's address and the byte
// stride between batch items (null and 0: 256): what the algorithm a plan
// chose may assume of every item's address in later calls.
std::uint32_t alignment(const void* p, std::int64_t stride_bytes = 0) {
  const auto bits = reinterpret_cast<std::uintptr_t>(p) | static_cast<std::uintptr_t>(stride_bytes);
  if (bits == 0) return 256;
  return static_cast<std::uint32_t>(std::min<std::uintptr_t>(256, bits & (~bits + 1)));
}

template <class V>
cublasStatus_t set(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute, const V& value) {
  return cublasLtMatmulDescSetAttribute(desc, attribute, &value, sizeof(value));
}
template <class V>
cublasStatus_t set(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attribute, const V& value) {
  return cublasLtMatmulPreferenceSetAttribute(pref, attribute, &value, sizeof(value));
}

// A column-major rows x cols layout (leading dimension ld) of type t; with
// batch > 1, items `stride` elements apart.
cublasStatus_t make_layout(cublasLtMatrixLayout_t* layout, DType t, std::int64_t rows, std::int64_t cols,
                           std::int64_t ld, std::int64_t batch, std::int64_t stride) {
  cublasStatus_t s = cublasLtMatrixLayoutCreate(layout, cuda_type(t), static_cast<std::uint64_t>(rows),
                                                static_cast<std::uint64_t>(cols), ld);
  if (s != CUBLAS_STATUS_SUCCESS || batch == 1) return s;
  const auto count = static_cast<std::int32_t>(batch);
  s = cublasLtMatrixLayoutSetAttribute(*layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count));
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  return cublasLtMatrixLayoutSetAttribute(*layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                          sizeof(stride));
}

void round_bias(const float* bias, void* dst, DType t, std::int64_t n, cudaStream_t stream) {
  if (t == DType::bf16) return to_format<DType::bf16>(bias, static_cast<Storage<DType::bf16>*>(dst), n, stream);
  to_format<DType::f16>(bias, static_cast<Storage<DType::f16>*>(dst), n, stream);
}

// The bias broadcast into C, then C += the product: products that cuBLASLt
// does not run, and every product without a bias.
void broadcast_and_gemm(cublasHandle_t handle, const Gemm& g, const Dims& d, const void* a, const void* b, void* c,
                        const float* bias, cudaStream_t stream) {
  if (bias != nullptr) {
    broadcast_bias(bias, c, g.c_type, g.m, g.n, d.ldc, d.stride_c, g.batch, g.accumulate, stream);
  }
  const float alpha = g.alpha;
  const float beta = (g.accumulate || bias != nullptr) ? 1.0f : 0.0f;
  DTRAIN_CUDA_CHECK(cublasSetStream(handle, stream));
  DTRAIN_CUDA_CHECK(cublasGemmStridedBatchedEx(
      handle, g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(g.n),
      static_cast<int>(g.m), static_cast<int>(g.k), &alpha, b, cuda_type(g.b_type), static_cast<int>(d.ldb), d.stride_b,
      a, cuda_type(g.a_type), static_cast<int>(d.lda), d.stride_a, &beta, c, cuda_type(g.c_type),
      static_cast<int>(d.ldc), d.stride_c, static_cast<int>(g.batch), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace

// cuBLASLt's view of one product with a bias, column-major like every cuBLAS
// call here: its A is our B, its B our A, and C = D our C (one layout for
// both: an in-place product needs them equal).
struct Blas::Plan {
  bool fused = false;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};

  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (d != nullptr) cublasLtMatrixLayoutDestroy(d);
    if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (desc != nullptr) cublasLtMatmulDescDestroy(desc);
  }
};

Blas::Blas(bool allow_tf32) : allow_tf32_(allow_tf32) {
  try {
    DTRAIN_CUDA_CHECK(cublasCreate(&handle_));
    // Set explicitly so that a process-wide default cannot lower fp32 products
    // to TF32; the default mode still runs 16-bit operands on tensor cores.
    DTRAIN_CUDA_CHECK(cublasSetMathMode(handle_, allow_tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
    DTRAIN_CUDA_CHECK(cublasLtCreate(&lt_));
    DTRAIN_CUDA_CHECK(cudaMalloc(&workspace_, kWorkspaceBytes));
  } catch (...) {
    release();
    throw;
  }
}

Blas::~Blas() { release(); }

void Blas::release() noexcept {
  plans_.clear();
  if (half_bias_ != nullptr) cudaFree(half_bias_);
  if (workspace_ != nullptr) cudaFree(workspace_);
  if (lt_ != nullptr) cublasLtDestroy(lt_);
  if (handle_ != nullptr) cublasDestroy(handle_);
  half_bias_ = workspace_ = nullptr;
  lt_ = nullptr;
  handle_ = nullptr;
}

Blas::PlanCounts Blas::plan_counts() const {
  PlanCounts counts;
  for (const auto& [key, plan] : plans_) ++(plan->fused ? counts.fused : counts.fallback);
  return counts;
}

void Blas::reserve_half_bias(std::int64_t n) {
  if (n <= half_bias_elems_) return;
  void* p = nullptr;
  DTRAIN_CUDA_CHECK(cudaMalloc(&p, static_cast<std::size_t>(n) * sizeof(std::uint16_t)));
  if (half_bias_ != nullptr) cudaFree(half_bias_);  // waits for the products still reading it
  half_bias_ = p;
  half_bias_elems_ = n;
}

// The descriptor (epilogue, transposes, compute type), the layouts and the
// heuristic's best algorithm for the workspace and the key's alignments.
std::unique_ptr<Blas::Plan> Blas::make_plan(const Gemm& g, const PlanKey& key, const void* lt_bias) {
  auto plan = std::make_unique<Plan>();
  const Dims d = dims(g);
  // Only fp32 operands may be lowered to TF32; 16-bit ones run on tensor cores anyway.
  const bool tf32 = allow_tf32_ && g.a_type == DType::f32;
  DTRAIN_LT_SETUP(
      cublasLtMatmulDescCreate(&plan->desc, tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const auto op = [](bool trans) { return static_cast<std::int32_t>(trans ? CUBLAS_OP_T : CUBLAS_OP_N); };
  DTRAIN_LT_SETUP(set(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, op(g.trans_b)));
  DTRAIN_LT_SETUP(set(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, op(g.trans_a)));
  DTRAIN_LT_SETUP(set(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, static_cast<std::uint32_t>(CUBLASLT_EPILOGUE_BIAS)));
  // The bias in C's type: cuBLASLt documents no other for these types.
  DTRAIN_LT_SETUP(set(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, static_cast<std::int32_t>(cuda_type(g.c_type))));
  DTRAIN_LT_SETUP(set(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, std::int64_t{0}));  // one bias for all items
  // The heuristic reads the bias pointer's alignment.
  DTRAIN_LT_SETUP(set(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, lt_bias));

  // Row-major op(B) [K,N] is column-major op(B)^T [N,K]; cuBLAS's rows are our columns.
  DTRAIN_LT_SETUP(
      make_layout(&plan->a, g.b_type, g.trans_b ? g.k : g.n, g.trans_b ? g.n : g.k, d.ldb, g.batch, d.stride_b));
  DTRAIN_LT_SETUP(
      make_layout(&plan->b, g.a_type, g.trans_a ? g.m : g.k, g.trans_a ? g.k : g.m, d.lda, g.batch, d.stride_a));
  DTRAIN_LT_SETUP(make_layout(&plan->d, g.c_type, g.n, g.m, d.ldc, g.batch, d.stride_c));

  cublasLtMatmulPreference_t pref = nullptr;
  DTRAIN_CUDA_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>, decltype(&cublasLtMatmulPreferenceDestroy)>
      pref_owner(pref, &cublasLtMatmulPreferenceDestroy);
  DTRAIN_LT_SETUP(set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, std::uint64_t{kWorkspaceBytes}));
  DTRAIN_LT_SETUP(set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_b));
  DTRAIN_LT_SETUP(set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_a));
  DTRAIN_LT_SETUP(set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_c));
  DTRAIN_LT_SETUP(set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_c));

  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  DTRAIN_LT_SETUP(
      cublasLtMatmulAlgoGetHeuristic(lt_, plan->desc, plan->a, plan->b, plan->d, plan->d, pref, 1, &result, &found));
  if (found == 0 || result.state != CUBLAS_STATUS_SUCCESS) return plan;
  plan->algo = result.algo;
  plan->fused = true;
  return plan;
}

// Queues g with its bias as one cublasLtMatmul (after the bias's rounding
// for a 16-bit C); false, with the product not queued, when g's plan falls
// back.
bool Blas::run_fused(const Gemm& g, const void* a, const void* b, void* c, const float* bias, cudaStream_t stream) {
  const bool half_c = g.c_type != DType::f32;
  if (half_c) reserve_half_bias(g.n);
  const void* lt_bias = half_c ? half_bias_ : bias;
  const Dims d = dims(g);
  const bool batched = g.batch > 1;
  const auto bytes = [&](std::int64_t stride, DType t) {
    return batched ? stride * static_cast<std::int64_t>(dtype_size(t)) : 0;
  };
  const std::int64_t none = 0;  // a single item's strides do not matter
  const PlanKey key{
      .m = g.m, .n = g.n, .k = g.k, .lda = d.lda, .ldb = d.ldb, .ldc = d.ldc, .batch = g.batch,
      .stride_a = batched ? d.stride_a : none, .stride_b = batched ? d.stride_b : none,
      .stride_c = batched ? d.stride_c : none,
      .trans_a = g.trans_a, .trans_b = g.trans_b, .accumulate = g.accumulate,
      .a_type = g.a_type, .b_type = g.b_type, .c_type = g.c_type,
      .align_a = alignment(a, bytes(d.stride_a, g.a_type)), .align_b = alignment(b, bytes(d.stride_b, g.b_type)),
      .align_c = alignment(c, bytes(d.stride_c, g.c_type)), .align_bias = alignment(lt_bias)};
  auto it = plans_.find(key);
  if (it == plans_.end()) it = plans_.emplace(key, make_plan(g, key, lt_bias)).first;
  Plan& plan = *it->second;
  if (!plan.fused) return false;

  if (half_c) round_bias(bias, half_bias_, g.c_type, g.n, stream);
  DTRAIN_CUDA_CHECK(set(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, lt_bias));
  const float alpha = g.alpha, beta = g.accumulate ? 1.0f : 0.0f;
  const cublasStatus_t s = cublasLtMatmul(lt_, plan.desc, &alpha, b, plan.a, a, plan.b, &beta, c, plan.d, c, plan.d,
                                          &plan.algo, workspace_, kWorkspaceBytes, stream);
  if (s == CUBLAS_STATUS_NOT_SUPPORTED) {  // refused at the call after all: this key falls back from now on
    plan.fused = false;
    return false;
  }
  if (dtrain::cuda::failed(s)) dtrain::cuda::throw_failure(s, "cublasLtMatmul", __FILE__, __LINE__);
  return true;
}

// Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: cuBLAS gets
// B as its first operand and A as its second, each with its own transpose.
void gemm(Blas& blas, const Gemm& g, const void* a, const void* b, void* c, const float* bias, cudaStream_t stream) {
  validate(g, bias != nullptr);
  if (bias != nullptr && blas.run_fused(g, a, b, c, bias, stream)) return;
  broadcast_and_gemm(blas.handle(), g, dims(g), a, b, c, bias, stream);
}

}  // namespace dtrain::nn::cuda
