// AVX-512 (F, BW, VL, DQ) matmul kernels, chosen at run time on CPUs that have them. They replace the AVX2
// set where they exist: matrix-vector for 4-, 6- and 8-bit affine and dense weights, dequantization of 4- and
// 8-bit rows to f32, and a 4-row x 6-token f32 micro-kernel (about 1.6x the AVX2 one on a Sapphire Rapids core).
#if defined(__x86_64__)
#include "backend/cpu/matmul_avx512.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>

namespace moecel::cpu::detail {
namespace {

using namespace avx512;

// Converts 16 group scales (groups g16.. of each row) to f32 in scl[i][0..16) and prefetches the next rows'.
template <DType ST, int R>
MOECEL_AVX512 inline void load_scales(const RowPtrs<R>& p, int64_t g16, int64_t ng, float (*scl)[16]) {
  MOECEL_UNROLL
  for (int i = 0; i < R; ++i) {
    const uint8_t* src = p.sc[i] + g16 * kElem<ST>;
    _mm512_store_ps(scl[i], ng == 16 ? load16<ST>(src) : load16_partial<ST>(src, ng));
    prefetch_ahead(src, R * p.sb);
    if (p.bi[i]) prefetch_ahead(p.bi[i] + g16 * kElem<ST>, R * p.sb);
  }
}

// ---- 4-bit ----
// As in the AVX2 kernel, with 32-value blocks: byte j holds values 2j (low nibble) and 2j+1 (high). prep
// stores, per block, xe - xo/16 (16 floats) then xo/16 (16 floats); the low nibble becomes a float through a
// 16-entry permute table (the permute ignores the high bits) and the whole byte through a conversion.
MOECEL_AVX512 void prep_q4(const Slice& s, const float* x, float* px) {
  prep_plain(s, x, px);
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  const __m512 sixteenth = _mm512_set1_ps(1.0f / 16.0f);
  for (int64_t i = 0; i < s.in; i += 32) {
    __m512 a = _mm512_loadu_ps(x + i), b = _mm512_loadu_ps(x + i + 16);
    __m512 xe = _mm512_permutex2var_ps(a, even, b), xo = _mm512_permutex2var_ps(a, odd, b);
    __m512 xo16 = _mm512_mul_ps(xo, sixteenth);
    _mm512_storeu_ps(px + i, _mm512_sub_ps(xe, xo16));
    _mm512_storeu_ps(px + i + 16, xo16);
  }
}

template <DType ST, int GS, int R>
MOECEL_AVX512 void q4_rows(const Slice& s, const float* px, int64_t r, float* y) {
  RowPtrs<R> p(s, r);
  constexpr int64_t gs = GS, nb = gs / 32;
  const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  __m512 tot[R];
  MOECEL_UNROLL
  for (int i = 0; i < R; ++i) tot[i] = _mm512_setzero_ps();
  alignas(64) float scl[R][16];
  for (int64_t g16 = 0; g16 < s.groups; g16 += 16) {
    const int64_t ng = std::min<int64_t>(16, s.groups - g16);
    load_scales<ST, R>(p, g16, ng, scl);
    for (int64_t gi = 0; gi < ng; ++gi) {
      const int64_t i0 = (g16 + gi) * gs;
      __m512 a[R], b[R];
      MOECEL_UNROLL
      for (int i = 0; i < R; ++i) {
        a[i] = b[i] = _mm512_setzero_ps();
        prefetch_ahead(p.w[i] + i0 / 2, R * s.row_bytes);
      }
      MOECEL_UNROLL
      for (int64_t blk = 0; blk < nb; ++blk) {
        const __m512 xe = _mm512_loadu_ps(px + i0 + 32 * blk), xo = _mm512_loadu_ps(px + i0 + 32 * blk + 16);
        MOECEL_UNROLL
        for (int i = 0; i < R; ++i) {
          __m512i v =
              _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p.w[i] + i0 / 2 + 16 * blk)));
          a[i] = _mm512_fmadd_ps(_mm512_permutexvar_ps(v, iota), xe, a[i]);
          b[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(v), xo, b[i]);
        }
      }
      MOECEL_UNROLL
      for (int i = 0; i < R; ++i)
        tot[i] = _mm512_fmadd_ps(_mm512_set1_ps(scl[i][gi]), _mm512_add_ps(a[i], b[i]), tot[i]);
    }
  }
  MOECEL_UNROLL
  for (int i = 0; i < R; ++i) y[r + i] = _mm512_reduce_add_ps(tot[i]) + bias_term<ST>(p.bi[i], px + s.in, s.groups);
}

// ---- 8-bit ----
template <DType ST, int GS, int R>
MOECEL_AVX512 void q8_rows(const Slice& s, const float* px, int64_t r, float* y) {
  RowPtrs<R> p(s, r);
  constexpr int64_t gs = GS;
  __m512 tot[R];
  MOECEL_UNROLL
  for (int i = 0; i < R; ++i) tot[i] = _mm512_setzero_ps();
  alignas(64) float scl[R][16];
  for (int64_t g16 = 0; g16 < s.groups; g16 += 16) {
    const int64_t ng = std::min<int64_t>(16, s.groups - g16);
    load_scales<ST, R>(p, g16, ng, scl);
    for (int64_t gi = 0; gi < ng; ++gi) {
      const int64_t i0 = (g16 + gi) * gs;
      __m512 a[R], b[R];
      MOECEL_UNROLL
      for (int i = 0; i < R; ++i) {
        a[i] = b[i] = _mm512_setzero_ps();
        prefetch_ahead(p.w[i] + i0, R * s.row_bytes);
      }
      for (int64_t k = 0; k < gs; k += 32) {
        const __m512 x0 = _mm512_loadu_ps(px + i0 + k), x1 = _mm512_loadu_ps(px + i0 + k + 16);
        MOECEL_UNROLL
        for (int i = 0; i < R; ++i) {
          const uint8_t* q = p.w[i] + i0 + k;
          __m512i v0 = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)));
          __m512i v1 = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16)));
          a[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(v0), x0, a[i]);
          b[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(v1), x1, b[i]);
        }
      }
      MOECEL_UNROLL
      for (int i = 0; i < R; ++i)
        tot[i] = _mm512_fmadd_ps(_mm512_set1_ps(scl[i][gi]), _mm512_add_ps(a[i], b[i]), tot[i]);
    }
  }
  MOECEL_UNROLL
  for (int i = 0; i < R; ++i) y[r + i] = _mm512_reduce_add_ps(tot[i]) + bias_term<ST>(p.bi[i], px + s.in, s.groups);
}

// ---- 6-bit ----
// 16 values live in 12 bytes: 128-bit lane L takes values 4L..4L+3 from bytes 3L..3L+2. The 16 bytes loaded
// are broadcast to every lane and shuffled so dword j holds the 2 bytes containing its value.
MOECEL_AVX512 inline __m512i q6_decode16(const uint8_t* q) {
  alignas(64) static const int8_t kShuf[64] = {0, 1,  -1, -1, 0, 1,  -1, -1, 1,  2,  -1, -1, 2,  3,  -1, -1,
                                               3, 4,  -1, -1, 3, 4,  -1, -1, 4,  5,  -1, -1, 5,  6,  -1, -1,
                                               6, 7,  -1, -1, 6, 7,  -1, -1, 7,  8,  -1, -1, 8,  9,  -1, -1,
                                               9, 10, -1, -1, 9, 10, -1, -1, 10, 11, -1, -1, 11, 12, -1, -1};
  const __m512i shuf = _mm512_load_si512(kShuf);
  const __m512i shifts = _mm512_setr_epi32(0, 6, 4, 2, 0, 6, 4, 2, 0, 6, 4, 2, 0, 6, 4, 2);
  __m512i v = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)));
  v = _mm512_shuffle_epi8(v, shuf);
  return _mm512_and_si512(_mm512_srlv_epi32(v, shifts), _mm512_set1_epi32(63));
}

template <DType ST, int GS, int R>
MOECEL_AVX512 void q6_rows(const Slice& s, const float* px, int64_t r, float* y) {
  RowPtrs<R> p(s, r);
  constexpr int64_t gs = GS, gbytes = gs * 6 / 8;
  // The 16-byte loads of the last group could pass the end of the tensor: that group reads from copies.
  alignas(64) uint8_t last[R][96 + 16] = {};
  MOECEL_UNROLL
  for (int i = 0; i < R; ++i) std::memcpy(last[i], p.w[i] + (s.groups - 1) * gbytes, size_t(gbytes));
  __m512 tot[R];
  MOECEL_UNROLL
  for (int i = 0; i < R; ++i) tot[i] = _mm512_setzero_ps();
  alignas(64) float scl[R][16];
  for (int64_t g16 = 0; g16 < s.groups; g16 += 16) {
    const int64_t ng = std::min<int64_t>(16, s.groups - g16);
    load_scales<ST, R>(p, g16, ng, scl);
    for (int64_t gi = 0; gi < ng; ++gi) {
      const int64_t g = g16 + gi, i0 = g * gs;
      const uint8_t* q[R];
      __m512 a[R], b[R];
      MOECEL_UNROLL
      for (int i = 0; i < R; ++i) {
        q[i] = g == s.groups - 1 ? last[i] : p.w[i] + g * gbytes;
        a[i] = b[i] = _mm512_setzero_ps();
        prefetch_ahead(p.w[i] + g * gbytes, R * s.row_bytes);
      }
      for (int64_t k = 0; k < gs; k += 32) {
        const __m512 x0 = _mm512_loadu_ps(px + i0 + k), x1 = _mm512_loadu_ps(px + i0 + k + 16);
        MOECEL_UNROLL
        for (int i = 0; i < R; ++i) {
          const uint8_t* qk = q[i] + k * 6 / 8;
          a[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q6_decode16(qk)), x0, a[i]);
          b[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q6_decode16(qk + 12)), x1, b[i]);
        }
      }
      MOECEL_UNROLL
      for (int i = 0; i < R; ++i)
        tot[i] = _mm512_fmadd_ps(_mm512_set1_ps(scl[i][gi]), _mm512_add_ps(a[i], b[i]), tot[i]);
    }
  }
  MOECEL_UNROLL
  for (int i = 0; i < R; ++i) y[r + i] = _mm512_reduce_add_ps(tot[i]) + bias_term<ST>(p.bi[i], px + s.in, s.groups);
}

// ---- dense ----
template <DType WT, int R>
MOECEL_AVX512 void dense_rows(const Slice& s, const float* px, int64_t r, float* y) {
  const uint8_t* w[R];
  __m512 a[R], b[R];
  MOECEL_UNROLL
  for (int i = 0; i < R; ++i) {
    w[i] = s.w + (r + i) * s.row_bytes;
    a[i] = b[i] = _mm512_setzero_ps();
  }
  int64_t k = 0;
  for (; k + 32 <= s.in; k += 32) {
    const __m512 x0 = _mm512_loadu_ps(px + k), x1 = _mm512_loadu_ps(px + k + 16);
    MOECEL_UNROLL
    for (int i = 0; i < R; ++i) {
      for (int line = 0; line < 32 * kElem<WT>; line += 64)
        prefetch_ahead(w[i] + k * kElem<WT> + line, R * s.row_bytes);
      a[i] = _mm512_fmadd_ps(load16<WT>(w[i] + k * kElem<WT>), x0, a[i]);
      b[i] = _mm512_fmadd_ps(load16<WT>(w[i] + (k + 16) * kElem<WT>), x1, b[i]);
    }
  }
  for (; k < s.in; k += 16) {
    const int64_t n = std::min<int64_t>(16, s.in - k);
    const __m512 xv = _mm512_maskz_loadu_ps(tail_mask(n), px + k);
    MOECEL_UNROLL
    for (int i = 0; i < R; ++i) {
      const uint8_t* src = w[i] + k * kElem<WT>;
      a[i] = _mm512_fmadd_ps(n == 16 ? load16<WT>(src) : load16_partial<WT>(src, n), xv, a[i]);
    }
  }
  MOECEL_UNROLL
  for (int i = 0; i < R; ++i) y[r + i] = _mm512_reduce_add_ps(_mm512_add_ps(a[i], b[i]));
}

template <template <DType, int> class K, DType T>
MOECEL_AVX512 void gemv_rows(const Slice& s, const float* px, int64_t r0, int64_t r1, float* y) {
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4) K<T, 4>::run(s, px, r, y);
  for (; r < r1; ++r) K<T, 1>::run(s, px, r, y);
}

// The same for quantized kernels, which also take the group size as a constant.
template <template <DType, int, int> class K, DType T, int GS>
MOECEL_AVX512 void gemv_rows_q(const Slice& s, const float* px, int64_t r0, int64_t r1, float* y) {
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4) K<T, GS, 4>::run(s, px, r, y);
  for (; r < r1; ++r) K<T, GS, 1>::run(s, px, r, y);
}

template <template <DType, int, int> class K, DType T>
GemvFn gemv_for_group(int group_size) {
  switch (group_size) {
    case 32: return gemv_rows_q<K, T, 32>;
    case 64: return gemv_rows_q<K, T, 64>;
    default: return gemv_rows_q<K, T, 128>;
  }
}

template <DType T, int GS, int R>
struct Q4 {
  MOECEL_AVX512 static void run(const Slice& s, const float* px, int64_t r, float* y) {
    q4_rows<T, GS, R>(s, px, r, y);
  }
};
template <DType T, int GS, int R>
struct Q8 {
  MOECEL_AVX512 static void run(const Slice& s, const float* px, int64_t r, float* y) {
    q8_rows<T, GS, R>(s, px, r, y);
  }
};
template <DType T, int GS, int R>
struct Q6 {
  MOECEL_AVX512 static void run(const Slice& s, const float* px, int64_t r, float* y) {
    q6_rows<T, GS, R>(s, px, r, y);
  }
};
template <DType T, int R>
struct Dense {
  MOECEL_AVX512 static void run(const Slice& s, const float* px, int64_t r, float* y) { dense_rows<T, R>(s, px, r, y); }
};

// ---- dequantization to f32 rows (4 and 8 bits; 6 bits keep the AVX2 decoder) ----
template <DType ST, int BITS, int GS>
MOECEL_AVX512 void dequant_q(const Slice& s, int64_t r0, int64_t r1, float* dst, int64_t ld) {
  constexpr int64_t gbytes = GS * BITS / 8;
  const __m128i low = _mm_set1_epi8(15);
  alignas(64) float scl[1][16], bia[16];
  for (int64_t r = r0; r < r1; ++r) {
    RowPtrs<1> p(s, r);
    float* d = dst + (r - r0) * ld;
    for (int64_t g16 = 0; g16 < s.groups; g16 += 16) {
      const int64_t ng = std::min<int64_t>(16, s.groups - g16);
      load_scales<ST, 1>(p, g16, ng, scl);
      const uint8_t* bsrc = p.bi[0] + g16 * kElem<ST>;
      _mm512_store_ps(bia, !p.bi[0] ? _mm512_setzero_ps() : ng == 16 ? load16<ST>(bsrc) : load16_partial<ST>(bsrc, ng));
      for (int64_t gi = 0; gi < ng; ++gi) {
        const int64_t g = g16 + gi;
        const __m512 sc = _mm512_set1_ps(scl[0][gi]), bi = _mm512_set1_ps(bia[gi]);
        const uint8_t* q = p.w[0] + g * gbytes;
        float* dg = d + g * GS;
        MOECEL_UNROLL
        for (int64_t k = 0; k < GS; k += 32) {
          __m512 f0, f1;
          if constexpr (BITS == 4) {
            // 16 bytes = 32 values; interleave low and high nibbles back into value order.
            __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + k / 2));
            __m128i lo = _mm_and_si128(b, low), hi = _mm_and_si128(_mm_srli_epi16(b, 4), low);
            f0 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi)));
            f1 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpackhi_epi8(lo, hi)));
          } else {
            f0 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + k))));
            f1 =
                _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + k + 16))));
          }
          _mm512_storeu_ps(dg + k, _mm512_fmadd_ps(sc, f0, bi));
          _mm512_storeu_ps(dg + k + 16, _mm512_fmadd_ps(sc, f1, bi));
        }
      }
    }
  }
}

template <DType ST, int BITS>
DequantFn dequant_for_group(int group_size) {
  switch (group_size) {
    case 32: return dequant_q<ST, BITS, 32>;
    case 64: return dequant_q<ST, BITS, 64>;
    default: return dequant_q<ST, BITS, 128>;
  }
}

// ---- f32 micro-kernel: R rows x T tokens of 16-wide accumulators over k ----
// The 4 horizontal sums of a, b, c, d, in that order: 14 shuffles and adds instead of 4 x 8.
MOECEL_AVX512 inline __m128 reduce4(__m512 a, __m512 b, __m512 c, __m512 d) {
  // 256-bit halves: [a0+a2, a1+a3, b0+b2, b1+b3] in 128-bit chunks.
  __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xee));
  __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, 0x44), _mm512_shuffle_f32x4(c, d, 0xee));
  // Chunk j holds 4 partial sums of the j-th vector.
  __m512 v = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xdd));
  v = _mm512_add_ps(v, _mm512_shuffle_ps(v, v, 0x4e));
  v = _mm512_add_ps(v, _mm512_shuffle_ps(v, v, 0xb1));
  return _mm512_castps512_ps128(
      _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), v));
}

template <int R, int T>
MOECEL_AVX512 inline __attribute__((always_inline)) void micro_step(__m512 (&c)[R][T], const float* const (&wr)[R],
                                                                    const float* const (&xt)[T], int64_t k,
                                                                    __mmask16 m) {
  __m512 wv[R];
  MOECEL_UNROLL
  for (int i = 0; i < R; ++i) wv[i] = _mm512_maskz_loadu_ps(m, wr[i] + k);
  MOECEL_UNROLL
  for (int t = 0; t < T; ++t) {
    const __m512 xv = _mm512_maskz_loadu_ps(m, xt[t] + k);
    MOECEL_UNROLL
    for (int i = 0; i < R; ++i) c[i][t] = _mm512_fmadd_ps(wv[i], xv, c[i][t]);
  }
}

template <int R, int T>
MOECEL_AVX512 void micro(const float* w, int64_t ldw, const float* const* x, int64_t k0, int64_t kc, float* const* y,
                         int64_t y_off, bool accumulate) {
  __m512 c[R][T];
  const float* wr[R];
  const float* xt[T];
  MOECEL_UNROLL
  for (int i = 0; i < R; ++i) {
    wr[i] = w + i * ldw + k0;
    MOECEL_UNROLL
    for (int t = 0; t < T; ++t) c[i][t] = _mm512_setzero_ps();
  }
  MOECEL_UNROLL
  for (int t = 0; t < T; ++t) xt[t] = x[t] + k0;
  int64_t k = 0;
  for (; k + 16 <= kc; k += 16) micro_step<R, T>(c, wr, xt, k, __mmask16(0xffff));
  if (k < kc) micro_step<R, T>(c, wr, xt, k, tail_mask(kc - k));
  const __mmask8 rows = __mmask8((1u << R) - 1u);
  MOECEL_UNROLL
  for (int t = 0; t < T; ++t) {
    const __m512 z = _mm512_setzero_ps();
    __m128 v = reduce4(c[0][t], R > 1 ? c[R > 1 ? 1 : 0][t] : z, R > 2 ? c[R > 2 ? 2 : 0][t] : z,
                       R > 3 ? c[R > 3 ? 3 : 0][t] : z);
    float* dst = y[t] + y_off;
    if (accumulate) v = _mm_add_ps(v, _mm_maskz_loadu_ps(rows, dst));
    _mm_mask_storeu_ps(dst, rows, v);
  }
}

using MicroFn = void (*)(const float*, int64_t, const float* const*, int64_t, int64_t, float* const*, int64_t, bool);
constexpr int kMr = 4, kNr = 6;
template <int R>
constexpr MicroFn kRow[kNr] = {micro<R, 1>, micro<R, 2>, micro<R, 3>, micro<R, 4>, micro<R, 5>, micro<R, 6>};
constexpr const MicroFn* kMicro[kMr] = {kRow<1>, kRow<2>, kRow<3>, kRow<4>};

MOECEL_AVX512 void gemm(const float* w, int64_t ldw, int64_t n_rows, const float* const* x, int64_t n_tok, int64_t k0,
                        int64_t kc, float* const* y, int64_t y_off, bool accumulate) {
  for (int64_t t0 = 0; t0 < n_tok; t0 += kNr) {
    const int64_t nt = std::min<int64_t>(kNr, n_tok - t0);
    for (int64_t i0 = 0; i0 < n_rows; i0 += kMr) {
      const int64_t nr = std::min<int64_t>(kMr, n_rows - i0);
      kMicro[nr - 1][nt - 1](w + i0 * ldw, ldw, x + t0, k0, kc, y + t0, y_off + i0, accumulate);
    }
  }
}

template <DType T>
void pick_quant(const Slice& s, Kernels& k) {
  switch (s.bits) {
    case 4:
      k.prep = prep_q4;
      k.gemv = gemv_for_group<Q4, T>(s.group_size);
      k.dequant = dequant_for_group<T, 4>(s.group_size);
      break;
    case 6: k.gemv = gemv_for_group<Q6, T>(s.group_size); break;
    case 8:
      k.gemv = gemv_for_group<Q8, T>(s.group_size);
      k.dequant = dequant_for_group<T, 8>(s.group_size);
      break;
    default: break;
  }
}

}  // namespace

void avx512_kernels(const Slice& s, Kernels& k) {
  k.gemm = gemm;
  if (s.bits) {
    switch (s.sdtype) {
      case DType::kF32: pick_quant<DType::kF32>(s, k); break;
      case DType::kF16: pick_quant<DType::kF16>(s, k); break;
      case DType::kBF16: pick_quant<DType::kBF16>(s, k); break;
      default: break;
    }
    return;
  }
  switch (s.wdtype) {
    case DType::kF32: k.gemv = gemv_rows<Dense, DType::kF32>; break;
    case DType::kF16: k.gemv = gemv_rows<Dense, DType::kF16>; break;
    case DType::kBF16: k.gemv = gemv_rows<Dense, DType::kBF16>; break;
    default: break;
  }
}

}  // namespace moecel::cpu::detail
#endif  // __x86_64__
