// Every matrix multiply of dtrain's CPU training loop: one call on oneDNN's
// matmul primitive (JIT, AVX-512 where the CPU has it), or, on CPUs with AVX2
// alone, for the linear layers' products (one item, m and k of 128 or more),
// on dtrain's own AVX2 kernel (nn/cpu/gemm_avx2.h), which runs them faster
// than oneDNN's sgemm there. No GEMM loops elsewhere.
//
// Threading: callable from any number of threads at once. Each thread owns its
// own cache of primitives, memory objects and stream (oneDNN's default
// scratchpad belongs to the thread that created a primitive, and a cached
// memory object can only point at one caller's data), so threads share nothing
// but the engine. Parallelism inside one call follows the calling thread's
// OpenMP setting (omp_get_max_threads()).
//
// Memory: the first call with a given Gemm (and bias present or not) creates
// and caches a primitive; later calls with the same Gemm only swap data
// pointers and allocate nothing themselves. (oneDNN 2.6's execute still makes
// a few small internal allocations for its argument map: see test_matmul.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace dtrain::nn::cpu {

// Row-major C[M,N] = alpha * op(A)[M,K] . op(B)[K,N] (+ bias[N] broadcast over
// rows) (+ C if accumulate).
// op(A) = A stored [M,K] (lda >= K), or with trans_a: A stored [K,M] (lda >= M).
// op(B) = B stored [K,N] (ldb >= N), or with trans_b: B stored [N,K] (ldb >= K).
// Batched (batch > 1): item i uses a + i*stride_a, b + i*stride_b,
// c + i*stride_c and the same bias. A stride of 0 means dense: rows * ld of the
// stored matrix (m*k, k*n, m*n when the leading dimensions are dense too).
// REQUIRES: m, n, k, batch > 0; items of C do not overlap; alpha finite, and
// alpha == 1 when a bias is given (oneDNN 2.6 would scale the bias too).
// Types: a_type/b_type are f32, bf16 or f16 (both f32 or both 16-bit), c_type
// f32 or either 16-bit type; a bias is always f32. bf16 runs oneDNN's bf16
// kernels (f32 accumulation) where the CPU has them (AVX512-BF16, AMX, or
// oneDNN's AVX-512 emulation). oneDNN has no f16 matmul on CPUs without
// AVX512-FP16, nor a bf16 one on CPUs with AVX2 alone: there the 16-bit
// operands are widened into per-thread f32 scratch and the f32 kernel runs
// (the same result as 16-bit storage with f32 accumulation; gemm_widens).
// Speed: oneDNN's brgemm kernels need dense operands (ld and batch strides 0 or
// equal to the dense value); any padding falls to its JIT sgemm ("gemm:jit"),
// up to 2x slower on attention shapes (T = 64), but never a reference loop.
struct Gemm {
  std::int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  bool accumulate = false;  // C += result (oneDNN sum post-op), else C = result
  float alpha = 1.0f;       // scale of the product (e.g. 1/sqrt(head_dim))
  std::int64_t lda = 0, ldb = 0, ldc = 0;  // leading dimensions in elements; 0 = dense
  std::int64_t batch = 1;
  std::int64_t stride_a = 0, stride_b = 0, stride_c = 0;  // in elements; 0 = dense
  DType a_type = DType::f32, b_type = DType::f32, c_type = DType::f32;

  bool operator==(const Gemm&) const = default;
};

// How g stores A, B or C: rows x cols elements, rows ld apart, items stride
// apart, with the dense defaults (0 in Gemm) filled in.
struct Stored {
  std::int64_t rows, cols, ld, stride;
};
Stored stored_a(const Gemm& g);
Stored stored_b(const Gemm& g);
Stored stored_c(const Gemm& g);

// Runs g. a, b, c (and bias, if not null) must hold the elements g addresses;
// where oneDNN's sgemm runs g (CPUs with AVX2 alone) and would read A or B
// down columns whose rows are a multiple of 1 KiB apart, through a copy with
// padded rows in per-thread scratch (same results; gemm_copy_bytes), and a
// transposed B of at most 256 columns, for 1024 rows or more, through a copy
// stored [K, N] (gemm_copy_bytes; the results of that layout);
// c must not overlap a, b or bias. Throws dtrain::Error naming the shape when
// g is malformed or oneDNN fails.
// REQUIRES: g's types are all f32.
void gemm(const Gemm& g, const float* a, const float* b, float* c, const float* bias = nullptr);
// The same for any supported types: a, b, c hold elements of g.a_type,
// g.b_type and g.c_type. Allocates only when a shape is first seen (and, for
// f16, when the widening scratch must grow).
void gemm(const Gemm& g, const void* a, const void* b, void* c, const float* bias = nullptr);

// gemm() where B is a weight that changes far less often than it is used: B
// is read through a copy in the layout oneDNN's kernel prefers for g
// (format_tag::any; blocked: a median 1.06x the speed of B as stored in f32,
// 1.16x in bf16, at dtrain's linear shapes), made again when this thread's
// copy for (g, b) was made from another b_version: by dtrain's own copy loops
// into the layouts brgemm picks on AVX-512 (BA16a64b, BA16a64b2a; 2-4x
// oneDNN 2.6's reorders), by a oneDNN reorder into any other. The owner of b draws a new version from
// next_weights_version() whenever b's contents change. b_version 0, batched
// and widened products, and those whose kernel reads B in a plain layout
// (oneDNN's sgemm, which packs B itself: on CPUs with AVX2 alone), run gemm()
// on B as stored. f32 results equal gemm()'s bit for bit; bf16 ones may
// differ in the last bits (another summation order).
// B may have any ldb (e.g. some columns of a wider weight): the copy is dense.
// Memory: one copy of B per thread, g and b, allocated when first seen and
// kept; later calls allocate nothing.
void gemm_weights(const Gemm& g, const void* a, const void* b, std::uint64_t b_version, void* c,
                  const float* bias = nullptr);

// The oneDNN implementation that runs g (e.g. "brg:avx512_core"); creates and
// caches the primitive like gemm() does. For tests and tools.
std::string gemm_impl_info(const Gemm& g, bool with_bias);

// How gemm_weights(g) makes its copy of B: "copy BA16a64b" or "copy
// BA16a64b2a" (dtrain's loops), "reorder" (oneDNN's), or none: "none: widened
// as stored" (gemm_widens), "none: plain layout" (the kernel picked B's layout
// row- or column-major, as oneDNN's sgemm does on AVX2: gemm() runs). For tests.
std::string gemm_weights_pack_info(const Gemm& g, bool with_bias);

// Whether operands of type t run widened to f32 on this CPU: f16 always, bf16
// where oneDNN has no bf16 matmul for it. gemm_widens: any of g's types does.
bool widens(DType t);
bool gemm_widens(const Gemm& g);

// Bytes of the padded copies gemm(g) makes of its operands for oneDNN's sgemm
// on this CPU (0 where it reads them as stored); the scratch holding them
// grows to the largest and is kept.
std::int64_t gemm_copy_bytes(const Gemm& g);
// The same, per operand.
struct GemmCopies {
  std::int64_t a = 0, b = 0;
};
GemmCopies gemm_copies(const Gemm& g);

// Bytes of all the per-thread scratch gemm(g) copies its operands into: the
// padded copies above, or the packed blocks of dtrain's own kernel
// (gemm_avx2.h). Each scratch grows to the largest and is kept.
std::int64_t gemm_scratch_bytes(const Gemm& g);

// The row stride, in elements, to give an activation of `cols` columns of
// type t that weight gradients read down its columns, multiplied with
// activations of `other` columns (an MLP's: d_ff and d_model): as dy^T (A of
// dW [cols, other] = dy^T x) or as x (B of dW [other, cols]). cols, or cols +
// 16 where gemm() would otherwise read it through a padded copy in either
// product (oneDNN's sgemm, f32, rows a multiple of 1 KiB apart: see gemm()),
// as this CPU picks their kernels. Written with that stride by its
// producers, it is read as stored: the same results, without the copy (about
// 1 ms per 8 MiB in an lm-small step).
std::int64_t activation_row_stride(std::int64_t cols, std::int64_t other, DType t);

// Whether gemm_weights keeps copies of weights of operand type t on this CPU:
// not where they widen, nor where the kernel reads them as stored (AVX2).
bool copies_weights(DType t);

// Primitives cached by the calling thread.
std::size_t gemm_cache_size();

// "m=.. n=.. k=.. trans_a=.. ..." for messages.
std::string gemm_string(const Gemm& g);

// fp32 GEMM peak of gemm() on n x n x n in GFLOP/s: best of timed repetitions
// after a warm-up, repeated for at least min_seconds, with the calling thread's
// OpenMP setting. The denominator of MFU in dtrain's benchmarks.
double measure_gemm_peak_gflops(std::int64_t n = 2048, double min_seconds = 1.0);

}  // namespace dtrain::nn::cpu
