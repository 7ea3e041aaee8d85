// Tensor-core fragment helpers shared by the prefill kernel (qgemm_mma.cu) and the decode matrix-vector kernels
// (gemv_mma.cuh): the m16n8k16 bf16 and f16 MMAs, quantized codes unpacked into centered bf16 / f16 pairs, and
// f32 values split into three bf16 or two f16 terms. Fragment layouts and the precision argument: qgemm_mma.cu's file
// comment.
#pragma once
#include <cstdint>
#include <cstring>

#include "backend/cuda/cuda_common.cuh"

namespace moecel::cuda {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, bypassing L1; valid == false writes 16 zero bytes and reads nothing.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Waits until at most N of this thread's most recent groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
// 4 bytes global -> shared (through L1); valid == false writes 4 zero bytes and reads nothing.
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 4 : 0) : "memory");
}

// D += A * B, m16n8k16, bf16 inputs, f32 accumulators (fragment layouts in the file comment).
__device__ __forceinline__ void mma_bf16(float* d, const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// D += A * B, m16n8k16, f16 inputs, f32 accumulators (same fragment layouts as mma_bf16).
__device__ __forceinline__ void mma_f16(float* d, const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// D = A * B (no accumulator input), m16n8k16, f16 inputs, f32 results.
__device__ __forceinline__ void mma_f16_zero(float* d, const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%10,%10,%10};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.0f));
}

// D += A * B, m16n8k32, unsigned 8-bit A, signed 8-bit B, s32 accumulators. Fragments: lane (gid, t) holds A bytes
// k = 4t .. 4t + 3 of rows gid (a[0]) and gid + 8 (a[1]), then k + 16 (a[2], a[3]); B bytes k = 4t .. 4t + 3 (b0) and
// k + 16 (b1) of column gid; D as mma_bf16's.
__device__ __forceinline__ void mma_u8s8(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t bf16x2_bits(__nv_bfloat162 v) {
  uint32_t u;
  memcpy(&u, &v, 4);
  return u;
}

// Nibbles j and j + 4 of a 4-bit word as centered codes q - 8 in a bf16x2 (low half: nibble j). 0x4300 | q is
// the bf16 of 128 + q (q < 128 fills the mantissa of 2^7 exactly); one bf16x2 fma subtracts 136 exactly.
__device__ __forceinline__ uint32_t q4_pair(uint32_t w, int j) {
  uint32_t v, r;  // (w >> 4j) & mask | magic in one lop3 (the compiler emits two)
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(v) : "r"(w >> (4 * j)), "r"(0x000F000Fu), "r"(0x43004300u));
  asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(r) : "r"(v), "r"(0x3F803F80u), "r"(0xC308C308u));  // v * 1 - 136
  return r;
}

// Nibbles j and j + 4 of a 4-bit word as the bf16x2 of 128 + q (low half: nibble j): q4_pair without its fma. The
// decode kernels take the 128 out of their sums with the bias term (kFoldZero), one instruction fewer per pair.
__device__ __forceinline__ uint32_t q4_raw_pair(uint32_t w, int j) {
  uint32_t v;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(v) : "r"(w >> (4 * j)), "r"(0x000F000Fu), "r"(0x43004300u));
  return v;
}

// Byte j of lo and byte j of hi (8-bit codes) as centered codes q - 128 in a bf16x2: 0x4B000000 | q is the f32
// 2^23 + q; subtracting 2^23 + 128 leaves q - 128 exactly, which has at most 8 significant bits, so the f32's
// upper half is its exact bf16.
__device__ __forceinline__ uint32_t q8_pair(uint32_t lo, uint32_t hi, int j) {
  const float a = __uint_as_float(__byte_perm(lo, 0x4B000000u, 0x7540u | unsigned(j))) - 8388736.0f;
  const float b = __uint_as_float(__byte_perm(hi, 0x4B000000u, 0x7540u | unsigned(j))) - 8388736.0f;
  return __byte_perm(__float_as_uint(a), __float_as_uint(b), 0x7632u);
}

// The f16 forms of q4_pair / q8_pair: 0x6400 | q is the f16 of 1024 + q (q < 1024 fills the mantissa of 2^10
// exactly), and one f16x2 fma subtracts 1024 + z exactly (centered codes have at most 8 significant bits).
__device__ __forceinline__ uint32_t q4_pair_f16(uint32_t w, int j) {
  uint32_t v, r;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(v) : "r"(w >> (4 * j)), "r"(0x000F000Fu), "r"(0x64006400u));
  asm("fma.rn.f16x2 %0, %1, %2, %3;\n" : "=r"(r) : "r"(v), "r"(0x3C003C00u), "r"(0xE408E408u));  // v * 1 - 1032
  return r;
}
__device__ __forceinline__ uint32_t q8_pair_f16(uint32_t lo, uint32_t hi, int j) {
  const unsigned l = unsigned(j), h = 4u + unsigned(j);  // byte selectors: x's bytes are 0-3, y's 4-7
  const uint32_t b = __byte_perm(lo, hi, l | (l << 4) | (h << 8) | (h << 12));
  uint32_t v, r;  // bytes j of lo and hi in bits [0, 8) and [16, 24), under the exponent of 1024
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(v) : "r"(b), "r"(0x00FF00FFu), "r"(0x64006400u));
  asm("fma.rn.f16x2 %0, %1, %2, %3;\n" : "=r"(r) : "r"(v), "r"(0x3C003C00u), "r"(0xE480E480u));  // v * 1 - 1152
  return r;
}

// Values a, b (|a|, |b| < 2^15, see row_scale_kernel) as two f16x2 terms (hi, lo; low halves from a) with
// |a - hi - lo| <= 2^-23 |a| + 2^-25: hi keeps 11 significant bits, a - hi is exact in f32 and lo keeps 11 of its bits.
__device__ __forceinline__ void split2_f16(float a, float b, uint32_t& hi, uint32_t& lo) {
  const __half2 hh = __floats2half2_rn(a, b);
  const __half2 lh = __floats2half2_rn(a - __low2float(hh), b - __high2float(hh));
  memcpy(&hi, &hh, 4);
  memcpy(&lo, &lh, 4);
}

// Values a, b as three bf16x2 terms (hi, mid, lo; low halves from a) with a == hi + mid + lo exactly (down to
// |a| ~ 1e-33): both differences are exact in f32, each subtrahend being the minuend rounded to 8 significant bits.
__device__ __forceinline__ void split3(float a, float b, uint32_t& hi, uint32_t& mid, uint32_t& lo) {
  const __nv_bfloat162 hb = __floats2bfloat162_rn(a, b);
  const float r0 = a - __low2float(hb), r1 = b - __high2float(hb);
  const __nv_bfloat162 mb = __floats2bfloat162_rn(r0, r1);
  hi = bf16x2_bits(hb);
  mid = bf16x2_bits(mb);
  lo = bf16x2_bits(__floats2bfloat162_rn(r0 - __low2float(mb), r1 - __high2float(mb)));
}

}  // namespace moecel::cuda
