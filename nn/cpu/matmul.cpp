#include "nn/cpu/matmul.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <unordered_map>
#include <vector>

#include <dnnl.hpp>

#include "core/aligned_buffer.h"
#include "core/error.h"
#include "nn/cpu/convert.h"
#include "nn/cpu/gemm_avx2.h"
#include "nn/cpu/kernel_profile.h"
#include "nn/cpu/weight_pack.h"

namespace dtrain::nn::cpu {
namespace {

// The cache key: every field of Gemm, whether a bias is given and whether B
// is read in the layout the primitive picks (gemm_weights).
struct Key {
  Gemm g;
  bool bias = false;
  bool packed_b = false;
  bool operator==(const Key&) const = default;
};

struct KeyHash {
  std::size_t operator()(const Key& key) const {
    const Gemm& g = key.g;
    std::size_t h = 0;
    auto mix = [&h](std::int64_t v) {
      h ^= std::hash<std::int64_t>{}(v) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    };
    for (std::int64_t v : {g.m, g.n, g.k, g.lda, g.ldb, g.ldc, g.batch, g.stride_a, g.stride_b,
                           g.stride_c}) {
      mix(v);
    }
    const float alpha = g.alpha == 0.0f ? 0.0f : g.alpha;  // -0 == 0 must hash alike
    std::int32_t alpha_bits = 0;
    static_assert(sizeof(alpha_bits) == sizeof(alpha));
    std::memcpy(&alpha_bits, &alpha, sizeof(alpha_bits));
    mix(alpha_bits);
    mix((g.trans_a ? 1 : 0) | (g.trans_b ? 2 : 0) | (g.accumulate ? 4 : 0) | (key.bias ? 8 : 0) |
        (key.packed_b ? 16 : 0));
    mix(static_cast<int>(g.a_type) | static_cast<int>(g.b_type) << 8 |
        static_cast<int>(g.c_type) << 16);
    return h;
  }
};

// One cached primitive with its memory objects and argument array, so that a
// call only swaps data handles.
struct Entry {
  dnnl::matmul prim;
  dnnl::memory a, b, c, bias;
  std::array<dnnl_exec_arg_t, 4> args{};
  int nargs = 0;
  std::string impl;
  bool sgemm = false;  // impl is oneDNN's sgemm ("gemm:jit"): see padding()
  bool avx2 = false;   // runs avx2_gemm (kAvx2Impl), not oneDNN: prim and its memories are empty
  // Operands that widen (gemm_widens) run the f32 primitive on widened
  // copies of these extents.
  bool widen = false;
  std::int64_t extent_a = 0, extent_b = 0, extent_c = 0;
  // packed_b: B as stored -> B in the primitive's layout (`b`), of packed_bytes:
  // by pack_weight_f32 or pack_weight_bf16 (weight_pack.h) where that layout is one they write
  // (blocked_pack), else by oneDNN's reorder.
  dnnl::reorder pack;
  dnnl::memory b_stored;
  std::size_t packed_bytes = 0;
  int blocked_pack = 0;  // 0: reorder; 1: BA16a64b (f32); 2: BA16a64b2a (bf16)
  // The primitive picked a plain layout for B (row- or column-major: oneDNN's
  // sgemm, "gemm:jit", which packs its operands itself, as on CPUs with AVX2
  // alone): a copy would only reorder B, so gemm_weights runs gemm() instead.
  bool plain_b = false;
};

// A weight in the layout one cached primitive reads it, made from the
// contents `version` named.
struct Packed {
  AlignedBuffer<std::byte> data;
  std::uint64_t version = 0;
};

struct PackedKey {
  Key key;
  const void* b = nullptr;
  bool operator==(const PackedKey&) const = default;
};

struct PackedKeyHash {
  std::size_t operator()(const PackedKey& k) const {
    return KeyHash{}(k.key) ^ (std::hash<const void*>{}(k.b) * 0x9e3779b97f4a7c15ULL);
  }
};

// Per-thread state: see the threading contract in matmul.h.
struct ThreadCache {
  dnnl::stream stream;
  std::unordered_map<Key, std::unique_ptr<Entry>, KeyHash> entries;
  std::vector<float> wide_a, wide_b, wide_c;  // widening scratch; only grows
  std::vector<float> padded;  // padded copies of A and B (padded_gemm); only grows
  std::unordered_map<PackedKey, Packed, PackedKeyHash> packed;  // gemm_weights' copies
};

dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

ThreadCache& thread_cache() {
  thread_local ThreadCache cache{dnnl::stream(cpu_engine()), {}, {}, {}, {}, {}, {}};
  return cache;
}

// A stored matrix of `rows` x `cols` elements with leading dimension ld, read
// as logical [outer, inner] (transposed when `trans`).
Stored stored(std::int64_t outer, std::int64_t inner, bool trans, std::int64_t ld, std::int64_t stride) {
  Stored o{trans ? inner : outer, trans ? outer : inner, ld, stride};
  if (o.ld == 0) o.ld = o.cols;
  if (o.stride == 0) o.stride = o.rows * o.ld;
  return o;
}

// The oneDNN view of a logical [outer, inner] matrix (batched: [batch, outer, inner]).
// Elements from an operand's first addressed element to its last, inclusive.
std::int64_t extent(const Stored& o, std::int64_t batch) {
  return (batch - 1) * o.stride + (o.rows - 1) * o.ld + o.cols;
}

dnnl::memory::data_type dnnl_type(DType t) {
  switch (t) {
    case DType::bf16: return dnnl::memory::data_type::bf16;
    case DType::f16: return dnnl::memory::data_type::f16;
    default: return dnnl::memory::data_type::f32;
  }
}

dnnl::memory::desc describe(const Stored& o, bool trans, std::int64_t batch,
                            dnnl::memory::data_type dt) {
  const std::int64_t outer = trans ? o.cols : o.rows;
  const std::int64_t inner = trans ? o.rows : o.cols;
  const std::int64_t s_outer = trans ? 1 : o.ld;
  const std::int64_t s_inner = trans ? o.ld : 1;
  if (batch == 1) return {{outer, inner}, dt, dnnl::memory::dims{s_outer, s_inner}};
  return {{batch, outer, inner}, dt, dnnl::memory::dims{o.stride, s_outer, s_inner}};
}

void validate(const Gemm& g, bool with_bias) {
  auto fail = [&g](const char* why) {
    throw Error(fmt::format("gemm {}: {}", gemm_string(g), why));
  };
  if (g.m <= 0 || g.n <= 0 || g.k <= 0 || g.batch <= 0) fail("m, n, k and batch must be positive");
  if (g.lda < 0 || g.ldb < 0 || g.ldc < 0 || g.stride_a < 0 || g.stride_b < 0 || g.stride_c < 0) {
    fail("leading dimensions and strides must not be negative");
  }
  if (g.lda != 0 && g.lda < (g.trans_a ? g.m : g.k)) fail("lda is smaller than a stored row of A");
  if (g.ldb != 0 && g.ldb < (g.trans_b ? g.k : g.n)) fail("ldb is smaller than a stored row of B");
  if (g.ldc != 0 && g.ldc < g.n) fail("ldc is smaller than n");
  if (!std::isfinite(g.alpha)) fail("alpha is not finite");
  if (with_bias && g.alpha != 1.0f) fail("alpha != 1 with a bias is not supported");
  auto known = [](DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16; };
  if (!known(g.a_type) || !known(g.b_type) || !known(g.c_type)) fail("unsupported element type");
  if ((g.a_type == DType::f32) != (g.b_type == DType::f32)) fail("A and B must both be f32 or both 16-bit");
  if (g.a_type != DType::f32 && g.a_type != g.b_type) fail("A and B must share their 16-bit type");
}

// Whether oneDNN has a JIT bf16 matmul on this CPU (AVX512-BF16 or AMX, or
// its AVX-512 emulation); on AVX2 alone it has none (status unimplemented).
// Asked once, of a small product.
bool bf16_kernels() {
  static const bool yes = [] {
    using dt = dnnl::memory::data_type;
    using tag = dnnl::memory::format_tag;
    const dnnl::memory::dims dims{64, 64};
    try {
      const dnnl::matmul::primitive_desc pd(
          dnnl::matmul::desc(dnnl::memory::desc(dims, dt::bf16, tag::ab), dnnl::memory::desc(dims, dt::bf16, tag::ab),
                             dnnl::memory::desc(dims, dt::f32, tag::ab)),
          cpu_engine());
      return std::string(pd.impl_info_str()).rfind("ref", 0) != 0;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return yes;
}

// Products that gemm() runs through dtrain's own kernel (nn/cpu/gemm_avx2.h)
// rather than oneDNN: on CPUs with AVX2 alone (avx2_gemm_preferred), f32 or
// widened, one item, m and k both kAvx2MinSide or more: every linear layer's
// product at training sizes. Attention's tiles (64 query rows: m or k is 64)
// and batched products stay on oneDNN's sgemm, which ran them faster (the
// same EPYC: tiles 1.0-1.5x, batched T = 128 products 1.3-1.9x the own
// kernel's speed; Matmul.DISABLED_ReportTrainingShapeGflops). A rule on m and
// k alone: a product split by columns (a head's share of a projection) runs
// where the whole one does, so each head's numbers are the whole product's
// bit for bit.
constexpr std::int64_t kAvx2MinSide = 128;
constexpr const char* kAvx2Impl = "dtrain:avx2_gemm";

bool runs_avx2(const Gemm& g) {
  return avx2_gemm_preferred() && g.batch == 1 && g.m >= kAvx2MinSide && g.k >= kAvx2MinSide;
}

std::unique_ptr<Entry> create_entry(const Key& key) {
  const Gemm& g = key.g;
  validate(g, key.bias);
  const Stored oa = stored_a(g), ob = stored_b(g), oc = stored_c(g);
  // Widened operands run the f32 primitive (see matmul.h).
  const bool widen = gemm_widens(g);
  if (runs_avx2(g) && (widen || g.a_type == DType::f32)) {
    auto entry = std::make_unique<Entry>();
    entry->impl = kAvx2Impl;
    entry->avx2 = true;
    entry->widen = widen;
    entry->plain_b = true;  // it packs B itself, per call
    entry->extent_a = extent(oa, g.batch);
    entry->extent_b = extent(ob, g.batch);
    entry->extent_c = extent(oc, g.batch);
    return entry;
  }
  auto type = [widen](DType t) { return widen ? dnnl::memory::data_type::f32 : dnnl_type(t); };
  const dnnl::memory::desc a = describe(oa, g.trans_a, g.batch, type(g.a_type));
  const dnnl::memory::desc b_stored = describe(ob, g.trans_b, g.batch, type(g.b_type));
  const dnnl::memory::desc b =
      key.packed_b ? dnnl::memory::desc(b_stored.dims(), type(g.b_type), dnnl::memory::format_tag::any) : b_stored;
  const dnnl::memory::desc c = describe(oc, false, g.batch, type(g.c_type));
  const dnnl::memory::dims bias_dims =
      g.batch == 1 ? dnnl::memory::dims{1, g.n} : dnnl::memory::dims{1, 1, g.n};
  const dnnl::memory::desc bias(bias_dims, dnnl::memory::data_type::f32,
                                g.batch == 1 ? dnnl::memory::format_tag::ab
                                             : dnnl::memory::format_tag::abc);

  dnnl::primitive_attr attr;
  if (g.alpha != 1.0f) attr.set_output_scales(0, {g.alpha});
  if (g.accumulate) {
    dnnl::post_ops ops;
    ops.append_sum(1.0f);
    attr.set_post_ops(ops);
  }
  const dnnl::matmul::desc desc = key.bias ? dnnl::matmul::desc(a, b, bias, c)
                                           : dnnl::matmul::desc(a, b, c);
  const dnnl::matmul::primitive_desc pd(desc, attr, cpu_engine());

  auto entry = std::make_unique<Entry>();
  entry->impl = pd.impl_info_str();
  entry->sgemm = entry->impl.rfind("gemm:jit", 0) == 0;
  entry->widen = widen;
  entry->extent_a = extent(oa, g.batch);
  entry->extent_b = extent(ob, g.batch);
  entry->extent_c = extent(oc, g.batch);
  // oneDNN's reference kernels are two orders of magnitude slower than its JIT
  // ones; no shape tested picks them (test_matmul), so one that does is a bug.
  if (entry->impl.rfind("ref", 0) == 0) {
    throw Error(fmt::format("gemm {} bias={}: oneDNN offers only its reference implementation "
                            "'{}'; use dense leading dimensions or another layout",
                            gemm_string(g), key.bias, entry->impl));
  }
  entry->prim = dnnl::matmul(pd);
  entry->a = dnnl::memory(a, cpu_engine(), DNNL_MEMORY_NONE);
  entry->b = dnnl::memory(pd.weights_desc(), cpu_engine(), DNNL_MEMORY_NONE);
  if (key.packed_b) {
    entry->b_stored = dnnl::memory(b_stored, cpu_engine(), DNNL_MEMORY_NONE);
    entry->pack = dnnl::reorder(dnnl::reorder::primitive_desc(entry->b_stored, entry->b));
    entry->packed_bytes = pd.weights_desc().get_size();
    using tag = dnnl::memory::format_tag;
    const dnnl::memory::dims dims = b_stored.dims();
    entry->plain_b = g.batch == 1 && (pd.weights_desc() == dnnl::memory::desc(dims, type(g.b_type), tag::ab) ||
                                      pd.weights_desc() == dnnl::memory::desc(dims, type(g.b_type), tag::ba));
    // Any ldb: the copy loops read B's rows at ldb (bf16's transposing copy in
    // 32-bit words, so an even ldb there).
    const bool whole_words = g.b_type != DType::bf16 || !g.trans_b || g.ldb % 2 == 0;
    if (g.batch == 1 && whole_words && g.n % kWeightPackN == 0) {
      if (g.b_type == DType::f32 && g.k % 16 == 0 &&
          pd.weights_desc() == dnnl::memory::desc(dims, type(g.b_type), tag::BA16a64b)) {
        entry->blocked_pack = 1;
      } else if (g.b_type == DType::bf16 && g.k % 32 == 0 &&
                 pd.weights_desc() == dnnl::memory::desc(dims, type(g.b_type), tag::BA16a64b2a)) {
        entry->blocked_pack = 2;
      }
    }
  }
  entry->c = dnnl::memory(c, cpu_engine(), DNNL_MEMORY_NONE);
  entry->args[0] = {DNNL_ARG_SRC, entry->a.get()};
  entry->args[1] = {DNNL_ARG_WEIGHTS, entry->b.get()};
  entry->args[2] = {DNNL_ARG_DST, entry->c.get()};
  entry->nargs = 3;
  if (key.bias) {
    entry->bias = dnnl::memory(bias, cpu_engine(), DNNL_MEMORY_NONE);
    entry->args[3] = {DNNL_ARG_BIAS, entry->bias.get()};
    entry->nargs = 4;
  }
  return entry;
}

Entry& lookup(const Gemm& g, bool with_bias, bool packed_b = false) {
  ThreadCache& cache = thread_cache();
  const Key key{g, with_bias, packed_b};
  auto it = cache.entries.find(key);
  if (it != cache.entries.end()) return *it->second;
  try {
    return *cache.entries.emplace(key, create_entry(key)).first->second;
  } catch (const dnnl::error& e) {
    throw Error(fmt::format("gemm {} bias={}: oneDNN could not create the matmul: {} (status {})",
                            gemm_string(g), with_bias, e.what(), static_cast<int>(e.status)));
  }
}

void check_status(dnnl_status_t status, const char* what, const Gemm& g) {
  if (status != dnnl_success) {
    throw Error(fmt::format("gemm {}: oneDNN {} failed with status {}", gemm_string(g), what,
                            static_cast<int>(status)));
  }
}

// g with every type f32: the product a widened g runs.
Gemm in_f32(Gemm g) {
  g.a_type = g.b_type = g.c_type = DType::f32;
  return g;
}

void run(const Gemm& g, Entry& e, const void* a, const void* b, void* c, const float* bias) {
  if (e.avx2) {
    avx2_gemm(in_f32(g), static_cast<const float*>(a), static_cast<const float*>(b), static_cast<float*>(c), bias);
    return;
  }
  // oneDNN takes non-const handles; it never writes through a, b or bias.
  check_status(dnnl_memory_set_data_handle_v2(e.a.get(), const_cast<void*>(a), nullptr),
               "set_data_handle(A)", g);
  check_status(dnnl_memory_set_data_handle_v2(e.b.get(), const_cast<void*>(b), nullptr),
               "set_data_handle(B)", g);
  check_status(dnnl_memory_set_data_handle_v2(e.c.get(), c, nullptr), "set_data_handle(C)", g);
  if (bias != nullptr) {
    check_status(dnnl_memory_set_data_handle_v2(e.bias.get(), const_cast<float*>(bias), nullptr),
                 "set_data_handle(bias)", g);
  }
  // The C API, because the C++ execute() builds a std::vector of arguments per call.
  ThreadCache& cache = thread_cache();
  check_status(dnnl_primitive_execute(e.prim.get(), cache.stream.get(), e.nargs, e.args.data()),
               "execute", g);
  check_status(dnnl_stream_wait(cache.stream.get()), "stream wait", g);
}

// oneDNN's sgemm ("gemm:jit": every f32 product on CPUs with AVX2 alone)
// reads a transposed A, and a B as stored, down their columns. When the rows
// are a multiple of 1 KiB apart, those reads crowd into a few cache sets and
// the product slows: lm-small's weight gradients of fc1 (A = dy^T, dy [2048,
// 1024]) and fc2 (B = x [2048, 1024]) ran at 33-37 GFLOP/s on an AVX2 AMD
// EPYC, 77-81 with 16 floats more per row; cls-seed's proj weight gradient
// and per-head output gradients (rows of 512 floats) at 50-52. Rows 1 or 3
// KiB apart (lm-small's qkv and proj weight gradients, 256 and 768 floats)
// slow it on 2 MiB pages, which keep the address bits that pick an L2 set:
// 58-66 GFLOP/s, 71-88 padded. Such an operand (f32, one item, 256 rows or
// more) is copied into per-thread scratch with kPadFloats more per row (about
// 1 ms per 8 MiB) and the product runs on the copy: the same numbers, the
// same summation order.
constexpr std::int64_t kPadFloats = 16;

// The same kernel reads a transposed B (a linear layer's forward: x W^T) more
// slowly than one stored [K, N] when N is small: at M = 2048 on the same EPYC,
// 65 against 76 GFLOP/s for N = 256, K = 1024 (lm-small's fc2), 73-75 against
// 80-83 for N = 256 and 64, K = 256 (proj, the heads' q, k, v, the lm head),
// the same for N of 768 or 1024. For M of kTransposeRowsMin or more and N of
// kTransposeColsMax or less, B is transposed into the padded scratch (a small
// weight: 0.12-0.23 ms per MiB, against 2-16 ms for the product) and read
// as stored.
constexpr std::int64_t kTransposeRowsMin = 1024;
constexpr std::int64_t kTransposeColsMax = 256;

struct Padding {
  bool a = false, b = false;
  bool b_transposed = false;  // b: B^T (stored [N, K]) copied as [K, N] (b_rows = K, b_cols = N)
  std::int64_t a_rows = 0, a_cols = 0, b_rows = 0, b_cols = 0;  // as stored
  std::int64_t floats() const {
    return (a ? a_rows * (a_cols + kPadFloats) : 0) + (b ? b_rows * (b_cols + kPadFloats) : 0);
  }
};

Padding padding(const Gemm& g, const Entry& e) {
  Padding p;
  if (g.batch != 1 || g.a_type != DType::f32 || !e.sgemm) return p;
  auto conflicts = [](std::int64_t ld, std::int64_t rows) {
    return ld % static_cast<std::int64_t>(1024 / sizeof(float)) == 0 && rows >= 256;
  };
  const std::int64_t lda = g.lda != 0 ? g.lda : (g.trans_a ? g.m : g.k);
  const std::int64_t ldb = g.ldb != 0 ? g.ldb : (g.trans_b ? g.k : g.n);
  p.a = g.trans_a && conflicts(lda, g.k);
  p.a_rows = g.k, p.a_cols = g.m;
  p.b_transposed = g.trans_b && g.m >= kTransposeRowsMin && g.n <= kTransposeColsMax;
  p.b = p.b_transposed || (!g.trans_b && conflicts(ldb, g.k));
  p.b_rows = g.k, p.b_cols = g.n;
  return p;
}

// rows x cols floats at ld into dst at cols + kPadFloats.
const float* pad_rows(const float* src, std::int64_t ld, std::int64_t rows, std::int64_t cols, float* dst) {
  for (std::int64_t r = 0; r < rows; ++r) {
    std::memcpy(dst + r * (cols + kPadFloats), src + r * ld, static_cast<std::size_t>(cols) * sizeof(float));
  }
  return dst;
}

// src stored [cols, rows] at ld, transposed into dst [rows, cols + kPadFloats],
// in blocks of 8 source rows by 64 floats: 8 rows 4 KiB apart still fit one
// 8-way L1 set. fc2's weight (256 rows 4 KiB apart) took 0.13-0.17 ms per
// MiB, against 0.32-0.50 in blocks of 16 x 16; 0.12-0.23 for lm-small's others.
const float* transpose_rows(const float* src, std::int64_t ld, std::int64_t rows, std::int64_t cols, float* dst) {
  constexpr std::int64_t kSourceRows = 8, kSourceCols = 64;
  const std::int64_t ld_dst = cols + kPadFloats;
  for (std::int64_t c0 = 0; c0 < cols; c0 += kSourceRows) {
    const std::int64_t c1 = std::min(c0 + kSourceRows, cols);
    for (std::int64_t r0 = 0; r0 < rows; r0 += kSourceCols) {
      const std::int64_t r1 = std::min(r0 + kSourceCols, rows);
      for (std::int64_t r = r0; r < r1; ++r) {
        for (std::int64_t c = c0; c < c1; ++c) dst[r * ld_dst + c] = src[c * ld + r];
      }
    }
  }
  return dst;
}

// Runs g (f32) through padded copies where padding(g, e) asks for them; false
// when it does not (the caller runs g as it is).
bool run_padded(const Gemm& g, const Entry& e, const void* a, const void* b, void* c, const float* bias) {
  const Padding p = padding(g, e);
  if (!p.a && !p.b) return false;
  std::vector<float>& scratch = thread_cache().padded;
  if (scratch.size() < static_cast<std::size_t>(p.floats())) scratch.resize(static_cast<std::size_t>(p.floats()));
  Gemm padded = g;
  float* next = scratch.data();
  if (p.a) {
    a = pad_rows(static_cast<const float*>(a), g.lda != 0 ? g.lda : g.m, p.a_rows, p.a_cols, next);
    padded.lda = p.a_cols + kPadFloats;
    next += p.a_rows * padded.lda;
  }
  if (p.b_transposed) {
    b = transpose_rows(static_cast<const float*>(b), g.ldb != 0 ? g.ldb : g.k, p.b_rows, p.b_cols, next);
    padded.trans_b = false;
    padded.ldb = p.b_cols + kPadFloats;
  } else if (p.b) {
    b = pad_rows(static_cast<const float*>(b), g.ldb != 0 ? g.ldb : g.n, p.b_rows, p.b_cols, next);
    padded.ldb = p.b_cols + kPadFloats;
  }
  run(padded, lookup(padded, bias != nullptr), a, b, c, bias);
  return true;
}

// An operand widened to f32 in `scratch` (grown once, then reused).
const float* widened(const void* p, DType t, std::int64_t n, std::vector<float>& scratch) {
  if (t == DType::f32) return static_cast<const float*>(p);
  if (scratch.size() < static_cast<std::size_t>(n)) scratch.resize(static_cast<std::size_t>(n));
  half_to_f32(static_cast<const std::uint16_t*>(p), t, scratch.data(), n);
  return scratch.data();
}

// Widens A, B and C (C too, so its unaddressed padding round-trips exactly),
// runs in f32, narrows C back.
void run_widened(const Gemm& g, Entry& e, const void* a, const void* b, void* c,
                 const float* bias) {
  ThreadCache& cache = thread_cache();
  const float* wa = widened(a, g.a_type, e.extent_a, cache.wide_a);
  const float* wb = widened(b, g.b_type, e.extent_b, cache.wide_b);
  float* wc = const_cast<float*>(widened(c, g.c_type, e.extent_c, cache.wide_c));
  if (!run_padded(in_f32(g), e, wa, wb, wc, bias)) run(g, e, wa, wb, wc, bias);
  if (g.c_type != DType::f32) f32_to_half(wc, g.c_type, static_cast<std::uint16_t*>(c), e.extent_c);
}

// This thread's copy of b in e's layout, reordered again when `version` is new.
const void* packed(const Gemm& g, bool with_bias, Entry& e, const void* b, std::uint64_t version) {
  ThreadCache& cache = thread_cache();
  Packed& p = cache.packed[PackedKey{Key{g, with_bias, true}, b}];
  if (p.version == version) return p.data.data();
  if (p.data.size() == 0) p.data = AlignedBuffer<std::byte>(e.packed_bytes);
  const KernelTimer timer(KernelKind::convert,
                          static_cast<double>(e.b_stored.get_desc().get_size() + e.packed_bytes));
  const std::int64_t ld = g.ldb != 0 ? g.ldb : (g.trans_b ? g.k : g.n);
  if (e.blocked_pack == 1) {
    pack_weight_f32(static_cast<const float*>(b), g.trans_b, g.k, g.n, ld,
                    reinterpret_cast<float*>(p.data.data()));
  } else if (e.blocked_pack == 2) {
    pack_weight_bf16(static_cast<const std::uint16_t*>(b), g.trans_b, g.k, g.n, ld,
                     reinterpret_cast<std::uint16_t*>(p.data.data()));
  } else {
    check_status(dnnl_memory_set_data_handle_v2(e.b_stored.get(), const_cast<void*>(b), nullptr),
                 "set_data_handle(stored B)", g);
    check_status(dnnl_memory_set_data_handle_v2(e.b.get(), p.data.data(), nullptr),
                 "set_data_handle(packed B)", g);
    const std::array<dnnl_exec_arg_t, 2> args{{{DNNL_ARG_SRC, e.b_stored.get()}, {DNNL_ARG_DST, e.b.get()}}};
    check_status(dnnl_primitive_execute(e.pack.get(), cache.stream.get(), 2, args.data()), "reorder(B)", g);
    check_status(dnnl_stream_wait(cache.stream.get()), "stream wait", g);
  }
  p.version = version;
  return p.data.data();
}

// What a profile counts for g (nn/cpu/kernel_profile.h).
double flops(const Gemm& g) {
  return 2.0 * static_cast<double>(g.m) * static_cast<double>(g.n) * static_cast<double>(g.k) *
         static_cast<double>(g.batch);
}

}  // namespace

Stored stored_a(const Gemm& g) { return stored(g.m, g.k, g.trans_a, g.lda, g.stride_a); }
Stored stored_b(const Gemm& g) { return stored(g.k, g.n, g.trans_b, g.ldb, g.stride_b); }
Stored stored_c(const Gemm& g) { return stored(g.m, g.n, false, g.ldc, g.stride_c); }

void gemm(const Gemm& g, const float* a, const float* b, float* c, const float* bias) {
  const KernelTimer timer(KernelKind::gemm, flops(g));
  DTRAIN_CHECK(g.a_type == DType::f32 && g.b_type == DType::f32 && g.c_type == DType::f32,
               "gemm {} on float pointers with 16-bit types", gemm_string(g));
  Entry& e = lookup(g, bias != nullptr);
  if (!run_padded(g, e, a, b, c, bias)) run(g, e, a, b, c, bias);
}

void gemm(const Gemm& g, const void* a, const void* b, void* c, const float* bias) {
  const KernelTimer timer(KernelKind::gemm, flops(g));  // widening included
  Entry& e = lookup(g, bias != nullptr);
  if (e.widen) {
    run_widened(g, e, a, b, c, bias);
  } else if (!run_padded(g, e, a, b, c, bias)) {
    run(g, e, a, b, c, bias);
  }
}

void gemm_weights(const Gemm& g, const void* a, const void* b, std::uint64_t b_version, void* c,
                  const float* bias) {
  if (b_version == 0 || g.batch != 1 || gemm_widens(g)) {
    gemm(g, a, b, c, bias);
    return;
  }
  Entry& e = lookup(g, bias != nullptr, /*packed_b=*/true);
  if (e.plain_b) {
    gemm(g, a, b, c, bias);
    return;
  }
  const void* pb = packed(g, bias != nullptr, e, b, b_version);
  const KernelTimer timer(KernelKind::gemm, flops(g));
  run(g, e, a, pb, c, bias);
}

std::string gemm_impl_info(const Gemm& g, bool with_bias) { return lookup(g, with_bias).impl; }

bool widens(DType t) { return t == DType::f16 || (t == DType::bf16 && !bf16_kernels()); }

bool gemm_widens(const Gemm& g) { return widens(g.a_type) || widens(g.b_type) || widens(g.c_type); }

GemmCopies gemm_copies(const Gemm& g) {
  const Entry& e = lookup(g, false);
  const Padding p = padding(e.widen ? in_f32(g) : g, e);
  constexpr auto kBytes = static_cast<std::int64_t>(sizeof(float));
  return {p.a ? p.a_rows * (p.a_cols + kPadFloats) * kBytes : 0,
          p.b ? p.b_rows * (p.b_cols + kPadFloats) * kBytes : 0};
}

std::int64_t gemm_copy_bytes(const Gemm& g) {
  const GemmCopies c = gemm_copies(g);
  return c.a + c.b;
}

std::int64_t gemm_scratch_bytes(const Gemm& g) {
  const Entry& e = lookup(g, false);
  return e.avx2 ? avx2_gemm_scratch_bytes(g) : gemm_copy_bytes(g);
}

std::int64_t activation_row_stride(std::int64_t cols, std::int64_t other, DType t) {
  if (t != DType::f32) return cols;
  // The two weight gradients that read it, over 256 rows, with dense rows.
  const Gemm as_a{.m = cols, .n = other, .k = 256, .trans_a = true};
  const Gemm as_b{.m = other, .n = cols, .k = 256, .trans_a = true};
  const bool copied = padding(as_a, lookup(as_a, false)).a || padding(as_b, lookup(as_b, false)).b;
  return copied ? cols + kPadFloats : cols;
}

bool copies_weights(DType t) {
  if (widens(t)) return false;
  Gemm g{.m = 64, .n = 64, .k = 64, .trans_b = true};  // a linear layer's forward
  g.a_type = g.b_type = g.c_type = t;
  return !lookup(g, false, /*packed_b=*/true).plain_b;
}

std::string gemm_weights_pack_info(const Gemm& g, bool with_bias) {
  if (gemm_widens(g)) return "none: widened as stored";
  const Entry& e = lookup(g, with_bias, /*packed_b=*/true);
  if (e.plain_b) return "none: plain layout";
  switch (e.blocked_pack) {
    case 1: return "copy BA16a64b";
    case 2: return "copy BA16a64b2a";
    default: return "reorder";
  }
}

std::size_t gemm_cache_size() { return thread_cache().entries.size(); }

std::string gemm_string(const Gemm& g) {
  return fmt::format(
      "[m={} n={} k={} trans_a={} trans_b={} accumulate={} alpha={} lda={} ldb={} ldc={} "
      "batch={} stride_a={} stride_b={} stride_c={} types={}.{}->{}]",
      g.m, g.n, g.k, g.trans_a, g.trans_b, g.accumulate, g.alpha, g.lda, g.ldb, g.ldc, g.batch,
      g.stride_a, g.stride_b, g.stride_c, dtype_name(g.a_type), dtype_name(g.b_type),
      dtype_name(g.c_type));
}

double measure_gemm_peak_gflops(std::int64_t n, double min_seconds) {
  DTRAIN_CHECK(n > 0, "n = {}", n);
  const auto count = static_cast<std::size_t>(n * n);
  AlignedBuffer<float> a(count), b(count), c(count);
  for (std::size_t i = 0; i < count; ++i) {
    a[i] = static_cast<float>(i % 7) * 0.25f - 0.75f;
    b[i] = static_cast<float>(i % 5) * 0.5f - 1.0f;
  }
  Gemm g;
  g.m = g.n = g.k = n;
  gemm(g, a.data(), b.data(), c.data());  // warm-up: creates the primitive, touches caches

  using clock = std::chrono::steady_clock;
  double best = 1e300;
  const auto start = clock::now();
  int reps = 0;
  while (reps < 3 || std::chrono::duration<double>(clock::now() - start).count() < min_seconds) {
    const auto t0 = clock::now();
    gemm(g, a.data(), b.data(), c.data());
    best = std::min(best, std::chrono::duration<double>(clock::now() - t0).count());
    ++reps;
  }
  return 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) / best /
         1e9;
}

}  // namespace dtrain::nn::cpu
