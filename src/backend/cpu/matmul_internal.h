// Internal interface between the matmul driver (matmul.cpp: validation, grouping, threading) and the
// per-instruction-set kernel files (matmul_scalar.cpp, matmul_avx2.cpp, matmul_avx512.cpp).
// A kernel set works on one weight slice (one expert or a whole 2-D weight) given as raw pointers.
#pragma once
#include <cstdint>
#include <functional>

#include "core/dtype.h"
#include "quant/qweight.h"

namespace moecel::cpu::detail {

// One weight slice: row r of the packed/dense weight starts at w + r * row_bytes.
struct Slice {
  const uint8_t* w = nullptr;
  int64_t row_bytes = 0;
  const uint8_t* w_end = nullptr;   // end of the whole weight tensor: vector loads never pass it
  const uint8_t* scales = nullptr;  // quantized: (out, groups) of sdtype
  const uint8_t* biases = nullptr;  // (out, groups) of sdtype; null = all zero
  DType wdtype = DType::kF32;       // dense F32/F16/BF16, or U32 when quantized
  DType sdtype = DType::kF32;
  int bits = 0;  // 0 = dense
  int group_size = 0;
  int64_t groups = 0;  // in / group_size
  int64_t out = 0, in = 0;
};

// Floats of the per-group sums of x in a prepared vector, zero-padded to a multiple of 16 groups.
inline int64_t sums_floats(const Slice& s) {
  return ((s.groups + 15) / 16) * 16 + 16;
}
// Floats of a prepared input vector: a kernel-specific copy of x (in), the group sums, then room for the
// VNNI kernels' fixed-point form of x (a header, a scale per group, 3 bytes per value, 64-byte aligned).
inline int64_t prep_floats(const Slice& s) {
  return s.in + sums_floats(s) + 16 + ((s.groups + 15) / 16) * 16 + (3 * s.in + 63) / 64 * 16 + 16;
}

// Prepares x (in,) for gemv: px gets prep_floats(s) floats.
using PrepFn = void (*)(const Slice& s, const float* x, float* px);
// y[r] = dot(w[r], x) for r in [r0, r1), with px from the matching PrepFn.
using GemvFn = void (*)(const Slice& s, const float* px, int64_t r0, int64_t r1, float* y);
// Writes rows [r0, r1) as f32 to dst, rows ld floats apart (ld >= in).
using DequantFn = void (*)(const Slice& s, int64_t r0, int64_t r1, float* dst, int64_t ld);
// For i < n_rows, t < n_tok: v = sum over k in [k0, k0 + kc) of w[i * ldw + k] * x[t][k];
// y[t][y_off + i] = v, or += v when accumulate.
using GemmFn = void (*)(const float* w, int64_t ldw, int64_t n_rows, const float* const* x, int64_t n_tok, int64_t k0,
                        int64_t kc, float* const* y, int64_t y_off, bool accumulate);

struct Kernels {
  PrepFn prep = nullptr;
  GemvFn gemv = nullptr;
  DequantFn dequant = nullptr;  // unused for dense F32 weights (rows are used in place)
  GemmFn gemm = nullptr;
};

// The portable PrepFn: x copied unchanged, then the group sums.
void prep_plain(const Slice& s, const float* x, float* px);

// Portable kernels for every format.
void scalar_kernels(const Slice& s, Kernels& k);
// Replace the entries they have fast versions of. Defined on x86-64 only; callers check the CPU first.
void avx2_kernels(const Slice& s, Kernels& k);
void avx512_kernels(const Slice& s, Kernels& k);
void avx512_vnni_kernels(const Slice& s, Kernels& k);

// ---- driver helpers (matmul.cpp), shared with the fused decode-MoE path ----

// Slice `expert` of w (0 for a 2-D weight).
Slice make_slice(const LinearWeight& w, int64_t expert);
// The fastest kernel set for the slice's format on this CPU (at the current SIMD level).
Kernels select_kernels(const Slice& s);
// Runs fn(task) for every task in [0, n_tasks) on the thread pool; every task runs exactly once.
void run_tasks(int64_t n_tasks, const std::function<void(int64_t)>& fn);
// Runs fn(begin, end) over [0, n) in pieces of a multiple of `grain` items (the last one shorter), each piece
// exactly once. Each pool thread owns a contiguous part and walks it front to back; one that finishes early
// takes pieces from the back of the others' parts. Piece bounds depend only on n, grain and the thread count,
// never on which thread ran a piece.
void run_parts(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

// Reads value i (bits wide) of a packed little-endian bit stream; the stream holds at least (i + 1) * bits bits.
inline uint32_t unpack_value(const uint8_t* row, int64_t i, int bits) {
  int64_t bit = i * bits;
  const uint8_t* p = row + (bit >> 3);
  int shift = int(bit & 7);
  uint32_t v = p[0] >> shift;
  if (shift + bits > 8) v |= uint32_t(p[1]) << (8 - shift);
  return v & ((1u << bits) - 1u);
}

}  // namespace moecel::cpu::detail
