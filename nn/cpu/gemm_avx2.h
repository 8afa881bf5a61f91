// dtrain's own f32 product for CPUs with AVX2 and FMA but no AVX-512: the
// machines on which oneDNN 2.6 has no brgemm matmul and runs its JIT sgemm
// ("gemm:jit"). On an AVX2 AMD EPYC (Zen 3), one thread, it ran lm-small's
// linear products 4-10% faster in all than that sgemm, and whole training
// steps 1.6-3.9% faster (docs/performance.md, "dtrain's own AVX2 GEMM", with
// the commands that measure it). gemm() (matmul.h) decides where it runs.
//
// The method is the classic one of BLIS and OpenBLAS for AVX2: op(B) is packed
// in blocks of kKC rows into panels of 16 columns, op(A) in blocks of kMC rows
// into panels of 6 rows (or read as stored where B is narrow), and a 6 x 16
// register tile (12 accumulators) runs over each pair of panels, one broadcast
// of A and two loads of B per two FMAs. Every element of C sums its products
// over k in the same order whatever the thread count and however the product
// is split: threads split C, never k.
#pragma once

#include "nn/cpu/matmul.h"

namespace dtrain::nn::cpu {

// True when this CPU has AVX2 and FMA (avx2_gemm runs here at all), as
// cpu_isa() sees it (nn/cpu/isa.h).
bool avx2_gemm_supported();

// True when gemm() runs f32 products through avx2_gemm on this CPU, by the
// environment's DTRAIN_CPU_GEMM (read once): unset or "auto", where
// cpu_isa() has AVX2 and FMA and no AVX-512 (where oneDNN's brgemm kernels
// run instead): a CPU with AVX2 alone, or any capped there by
// ONEDNN_MAX_CPU_ISA; "avx2", on any CPU with AVX2 and FMA (a dtrain::Error
// on others); "onednn", never (every product on oneDNN: to compare, or to
// rule the kernel out). Throws dtrain::Error naming the variable on any other
// value.
bool avx2_gemm_preferred();
// The same for a given DTRAIN_CPU_GEMM value (null: unset).
bool avx2_gemm_preferred(const char* choice);

// gemm()'s contract (matmul.h) for f32 operands: C = alpha * op(A) op(B)
// (+ bias) (+ C if accumulate), batched. Threads: omp_get_max_threads() of the
// caller, splitting C by rows or columns; the results do not depend on it.
// Scratch: per thread, grown on first use to the largest blocks seen (at most
// kMC x kKC + kKC x kNC floats), then reused.
// REQUIRES: avx2_gemm_supported(); g valid (matmul.h), all types f32.
void avx2_gemm(const Gemm& g, const float* a, const float* b, float* c, const float* bias);

// The per-thread pack scratch avx2_gemm uses for g, in bytes.
std::int64_t avx2_gemm_scratch_bytes(const Gemm& g);

}  // namespace dtrain::nn::cpu
