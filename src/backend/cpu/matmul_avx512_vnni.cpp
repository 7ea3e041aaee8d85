// AVX-512 VNNI matrix-vector kernels for 4-, 6- and 8-bit affine weights, chosen at run time over the AVX-512 ones.
// x is taken in per-group fixed point: q = rint(x 2^S_g) with |q| <= 2^22 (2^20 with 8-bit codes), S_g from the
// group's largest |x|, held as three signed 8-bit digits (q = 65536 d2 + 256 d1 + d0). vpdpbusd multiplies the
// raw u8 codes by each digit with exact s32 sums, and a shift-and-add chain gives sum(code * q) per lane (at most
// 8 * 15 * 2^22, 4 * 63 * 2^22 or 4 * 255 * 2^20: inside s32). A group then adds s_g 2^-S_g times that, and b_g
// sum(x_g) from the exact group sums. A value's error is at most 2^-23 (2^-21) of its group's largest |x|, within f32
// rounding of the f32 kernels, for about half their instructions per weight. A vector the fixed point cannot hold (a
// value not finite, a group's largest |x| outside [2^-100, 2^100]) takes the portable kernel instead.
#if defined(__x86_64__)
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "backend/cpu/matmul_avx512.h"

#define MOECEL_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))

namespace moecel::cpu::detail {
namespace {

using namespace avx512;

// Values per block of codes (64 bytes of 4- or 8-bit codes, 48 of 6-bit), and per 32-bit lane once unpacked.
template <int BITS>
constexpr int kBlock = BITS == 4 ? 128 : 64;
template <int BITS>
constexpr int kBlockBytes = kBlock<BITS>* BITS / 8;
template <int BITS>
constexpr int kLane = BITS == 4 ? 8 : 4;
// |q| <= 2^Q keeps a lane's sum inside s32: 8 * 15 * 2^22, 4 * 63 * 2^22, 4 * 255 * 2^20.
template <int BITS>
constexpr int kQBits = BITS == 8 ? 20 : 22;

// The fixed-point form of x, after prep_plain's floats (x, then the group sums) in the prepared vector; F is
// float or const float.
template <class F>
struct Fixed {
  F* header;  // [0]: 1 when the fixed point holds x, 0 when the portable kernel must run
  F* inv;     // (groups padded to 16,) 2^-S_g
  std::conditional_t<std::is_const_v<F>, const int8_t, int8_t>* digits;  // 3 * kBlock bytes per block, aligned
};

template <class F>
inline Fixed<F> fixed_of(const Slice& s, F* px) {
  Fixed<F> f;
  f.header = px + s.in + sums_floats(s);
  f.inv = f.header + 16;
  const auto base = reinterpret_cast<uintptr_t>(f.inv + ((s.groups + 15) / 16) * 16);
  f.digits = reinterpret_cast<decltype(f.digits)>((base + 63) & ~uintptr_t(63));
  return f;
}

// q (16 values, |q| <= 2^22) as three signed bytes each.
MOECEL_VNNI inline void split_digits(__m512i q, __m128i& d2, __m128i& d1, __m128i& d0) {
  const __m512i e0 = _mm512_srai_epi32(_mm512_slli_epi32(q, 24), 24);
  const __m512i q1 = _mm512_srai_epi32(_mm512_sub_epi32(q, e0), 8);
  const __m512i e1 = _mm512_srai_epi32(_mm512_slli_epi32(q1, 24), 24);
  d2 = _mm512_cvtepi32_epi8(_mm512_srai_epi32(_mm512_sub_epi32(q1, e1), 8));
  d1 = _mm512_cvtepi32_epi8(e1);
  d0 = _mm512_cvtepi32_epi8(e0);
}

// The digits of a block: 4-bit codes hold values 2m (low nibble) and 2m+1 (high) in byte m, so a block's
// digits are [d2 even, d2 odd, d1 even, d1 odd, d0 even, d0 odd], 64 bytes each; 6- and 8-bit codes (one
// byte per value once unpacked): [d2, d1, d0].
template <int BITS>
MOECEL_VNNI void prep_fixed(const Slice& s, const float* x, float* px) {
  prep_plain(s, x, px);
  const Fixed<float> f = fixed_of(s, px);
  const float* sums = px + s.in;
  const int64_t gs = s.group_size;
  f.header[0] = 0.0f;
  for (int64_t g = 0; g < s.groups; ++g) {
    if (!std::isfinite(sums[g])) return;  // a NaN or infinity in the group (or a sum past f32)
    __m512 m = _mm512_setzero_ps();
    for (int64_t i = 0; i < gs; i += 16) m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(x + g * gs + i)));
    const float mx = _mm512_reduce_max_ps(m);
    int e = 0;
    if (mx != 0.0f) {
      if (!(mx >= 0x1p-100f && mx <= 0x1p100f)) return;
      std::frexp(mx, &e);  // mx = fr 2^e, fr in [0.5, 1): |x| 2^(Q - e) < 2^Q
    }
    f.inv[g] = std::ldexp(1.0f, e - kQBits<BITS>);
  }
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  for (int64_t blk = 0; blk < s.in / kBlock<BITS>; ++blk) {
    int8_t* d = f.digits + blk * 3 * kBlock<BITS>;
    for (int64_t it = 0; it < kBlock<BITS> / 32; ++it) {
      const int64_t i = blk * kBlock<BITS> + it * 32;  // 32 values inside one group (group sizes >= 32)
      const __m512 scale = _mm512_set1_ps(1.0f / f.inv[i / gs]);
      const __m512 a = _mm512_mul_ps(_mm512_loadu_ps(x + i), scale);
      const __m512 b = _mm512_mul_ps(_mm512_loadu_ps(x + i + 16), scale);
      __m128i a2, a1, a0, b2, b1, b0;
      if constexpr (BITS == 4) {
        split_digits(_mm512_cvtps_epi32(_mm512_permutex2var_ps(a, even, b)), a2, a1, a0);
        split_digits(_mm512_cvtps_epi32(_mm512_permutex2var_ps(a, odd, b)), b2, b1, b0);
        const __m128i parts[6] = {a2, b2, a1, b1, a0, b0};  // even, odd per digit
        for (int p = 0; p < 6; ++p) _mm_storeu_si128(reinterpret_cast<__m128i*>(d + p * 64 + it * 16), parts[p]);
      } else {
        split_digits(_mm512_cvtps_epi32(a), a2, a1, a0);
        split_digits(_mm512_cvtps_epi32(b), b2, b1, b0);
        const __m128i parts[6] = {a2, b2, a1, b1, a0, b0};  // two 16-value halves per digit
        for (int p = 0; p < 6; ++p)
          _mm_storeu_si128(reinterpret_cast<__m128i*>(d + (p / 2) * 64 + it * 32 + (p % 2) * 16), parts[p]);
      }
    }
  }
  f.header[0] = 1.0f;
}

// The 64 6-bit codes of 48 bytes, one per byte: each 3 bytes (4 codes, bits 6i..6i+5) go to a dword, whose
// four bytes then take bits 0-5, 6-11, 12-17 and 18-23. A masked load: the block may end the tensor.
MOECEL_VNNI inline __m512i unpack6(const uint8_t* w) {
  const __m512i src = _mm512_maskz_loadu_epi32(0x0fff, w);
  // 128-bit lane L gets bytes 12L..12L+15, then dword j of it bytes 3j..3j+2.
  const __m512i lanes =
      _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 1, 2, 3, 3, 4, 5, 6, 6, 7, 8, 9, 9, 10, 11, 12), src);
  const __m512i d = _mm512_shuffle_epi8(
      lanes, _mm512_broadcast_i32x4(_mm_setr_epi8(0, 1, 2, -1, 3, 4, 5, -1, 6, 7, 8, -1, 9, 10, 11, -1)));
  // (a & c) | (b & ~c): byte 0 from d, 1 from d << 2, 2 from d << 4, 3 from d << 6, then 6 bits of each.
  constexpr int kSelect = 0xe4;
  const __m512i lo = _mm512_ternarylogic_epi32(d, _mm512_slli_epi32(d, 2), _mm512_set1_epi32(0x000000ff), kSelect);
  const __m512i hi = _mm512_ternarylogic_epi32(_mm512_slli_epi32(d, 4), _mm512_slli_epi32(d, 6),
                                               _mm512_set1_epi32(0x00ff0000), kSelect);
  const __m512i codes = _mm512_ternarylogic_epi32(lo, hi, _mm512_set1_epi32(0x0000ffff), kSelect);
  return _mm512_and_si512(codes, _mm512_set1_epi32(0x3f3f3f3f));
}

// sum(code * q) per lane of one block of codes.
template <int BITS>
MOECEL_VNNI inline __m512i block_dot(const uint8_t* w, const __m512i (&xd)[6]) {
  __m512i v;
  if constexpr (BITS == 6)
    v = unpack6(w);
  else
    v = _mm512_loadu_si512(w);
  const __m512i z = _mm512_setzero_si512();
  if constexpr (BITS == 4) {
    const __m512i m4 = _mm512_set1_epi8(15);
    const __m512i lo = _mm512_and_si512(v, m4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
    __m512i acc = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(z, lo, xd[0]), hi, xd[1]);
    acc = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_slli_epi32(acc, 8), lo, xd[2]), hi, xd[3]);
    return _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_slli_epi32(acc, 8), lo, xd[4]), hi, xd[5]);
  } else {
    __m512i acc = _mm512_dpbusd_epi32(z, v, xd[0]);
    acc = _mm512_dpbusd_epi32(_mm512_slli_epi32(acc, 8), v, xd[1]);
    return _mm512_dpbusd_epi32(_mm512_slli_epi32(acc, 8), v, xd[2]);
  }
}

template <DType ST, int BITS, int GS, int R>
MOECEL_VNNI void fixed_rows(const Slice& s, const Fixed<const float>& f, const float* sums, int64_t r, float* y) {
  RowPtrs<R> p(s, r);
  constexpr int kDigits = BITS == 4 ? 6 : 3;
  // Lane l of block b (of a chunk of 16 groups) belongs to group (b * kBlock + l * kLane) / GS of the chunk.
  const __m512i lane_vals = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                               _mm512_set1_epi32(kLane<BITS>));
  __m512 tot[R];
  MOECEL_UNROLL
  for (int i = 0; i < R; ++i) tot[i] = _mm512_setzero_ps();
  for (int64_t g16 = 0; g16 < s.groups; g16 += 16) {
    const int64_t ng = std::min<int64_t>(16, s.groups - g16);
    const __m512 inv = _mm512_loadu_ps(f.inv + g16);
    __m512 sv[R];
    MOECEL_UNROLL
    for (int i = 0; i < R; ++i) {
      const uint8_t* src = p.sc[i] + g16 * kElem<ST>;
      sv[i] = _mm512_mul_ps(ng == 16 ? load16<ST>(src) : load16_partial<ST>(src, ng), inv);
      prefetch_ahead(src, R * p.sb);
      if (p.bi[i]) prefetch_ahead(p.bi[i] + g16 * kElem<ST>, R * p.sb);
    }
    const int64_t b0 = g16 * GS / kBlock<BITS>, nb = ng * GS / kBlock<BITS>;
    for (int64_t b = 0; b < nb; ++b) {
      const __m512i idx =
          _mm512_srli_epi32(_mm512_add_epi32(lane_vals, _mm512_set1_epi32(int(b * kBlock<BITS>))), __builtin_ctz(GS));
      const int8_t* d = f.digits + (b0 + b) * 3 * kBlock<BITS>;
      __m512i xd[6];
      MOECEL_UNROLL
      for (int k = 0; k < kDigits; ++k) xd[k] = _mm512_load_si512(d + k * 64);
      MOECEL_UNROLL
      for (int i = 0; i < R; ++i) {
        const uint8_t* w = p.w[i] + (b0 + b) * kBlockBytes<BITS>;
        prefetch_ahead(w, R * s.row_bytes);
        const __m512 dot = _mm512_cvtepi32_ps(block_dot<BITS>(w, xd));
        tot[i] = _mm512_fmadd_ps(dot, _mm512_permutexvar_ps(idx, sv[i]), tot[i]);
      }
    }
  }
  MOECEL_UNROLL
  for (int i = 0; i < R; ++i) y[r + i] = _mm512_reduce_add_ps(tot[i]) + bias_term<ST>(p.bi[i], sums, s.groups);
}

template <DType ST, int BITS, int GS>
MOECEL_VNNI void gemv_fixed(const Slice& s, const float* px, int64_t r0, int64_t r1, float* y) {
  const Fixed<const float> f = fixed_of(s, px);
  if (f.header[0] == 0.0f) {
    Kernels portable;
    scalar_kernels(s, portable);
    return portable.gemv(s, px, r0, r1, y);
  }
  const float* sums = px + s.in;
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4) fixed_rows<ST, BITS, GS, 4>(s, f, sums, r, y);
  for (; r < r1; ++r) fixed_rows<ST, BITS, GS, 1>(s, f, sums, r, y);
}

template <DType ST, int BITS>
GemvFn gemv_for(int group_size) {
  switch (group_size) {
    case 32: return gemv_fixed<ST, BITS, 32>;
    case 64: return gemv_fixed<ST, BITS, 64>;
    case 128: return gemv_fixed<ST, BITS, 128>;
    default: return nullptr;
  }
}

template <int BITS>
GemvFn gemv_for_scales(DType st, int group_size) {
  switch (st) {
    case DType::kF32: return gemv_for<DType::kF32, BITS>(group_size);
    case DType::kF16: return gemv_for<DType::kF16, BITS>(group_size);
    case DType::kBF16: return gemv_for<DType::kBF16, BITS>(group_size);
    default: return nullptr;
  }
}

}  // namespace

void avx512_vnni_kernels(const Slice& s, Kernels& k) {
  if (s.bits != 4 && s.bits != 6 && s.bits != 8) return;
  const int64_t block = s.bits == 4 ? kBlock<4> : kBlock<8>;
  if (s.in % block != 0) return;  // whole blocks of codes only; the others keep the AVX-512 kernels
  GemvFn gemv = s.bits == 4   ? gemv_for_scales<4>(s.sdtype, s.group_size)
                : s.bits == 6 ? gemv_for_scales<6>(s.sdtype, s.group_size)
                              : gemv_for_scales<8>(s.sdtype, s.group_size);
  if (!gemv) return;
  k.prep = s.bits == 4 ? prep_fixed<4> : s.bits == 6 ? prep_fixed<6> : prep_fixed<8>;
  k.gemv = gemv;
}

}  // namespace moecel::cpu::detail
#endif  // __x86_64__
