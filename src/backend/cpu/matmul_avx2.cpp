// AVX2/FMA/F16C matmul kernels, compiled per function with target attributes and chosen at run time.
// Matrix-vector: 4-, 6- and 8-bit affine weights decoded in registers (scales F32/F16/BF16), dense F32/F16/BF16.
// Prefill: dequantize rows to f32, then a 3-row x 4-token register-blocked f32 kernel.
// 2-, 3- and 5-bit weights keep the scalar decoders (rare formats).
#if defined(__x86_64__)
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "backend/cpu/matmul_internal.h"

#define MOECEL_AVX2 __attribute__((target("avx2,fma,f16c")))
// Loops over the R rows / T tokens of a register block must be unrolled for the accumulators to stay in registers.
#define MOECEL_UNROLL _Pragma("GCC unroll 16")

namespace moecel::cpu::detail {
namespace {

template <DType T>
constexpr int kElem = T == DType::kF32 ? 4 : 2;

// 8 consecutive F32/F16/BF16 values as f32.
template <DType T>
MOECEL_AVX2 inline __m256 load8(const uint8_t* p) {
  if constexpr (T == DType::kF32) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
  } else if constexpr (T == DType::kF16) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  } else {
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
  }
}

// The first n (< 8) values, zeros after: never reads past them.
template <DType T>
MOECEL_AVX2 inline __m256 load8_partial(const uint8_t* p, int64_t n) {
  alignas(32) uint8_t tmp[32] = {};
  std::memcpy(tmp, p, size_t(n) * kElem<T>);
  return load8<T>(tmp);
}

MOECEL_AVX2 inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Mask of the first n (0..8) lanes.
MOECEL_AVX2 inline __m256i tail_mask(int64_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(int(n)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// Rows are streamed R at a time, each only a few cache lines long; prefetching the same spot of the next
// block of R rows keeps enough reads in flight to approach memory bandwidth.
MOECEL_AVX2 inline void prefetch_next(const uint8_t* p, int64_t ahead) {
  _mm_prefetch(reinterpret_cast<const char*>(p + ahead), _MM_HINT_T0);
}

// Per-row scale and bias pointers of R consecutive rows starting at r.
template <int R>
struct RowPtrs {
  const uint8_t* w[R];
  const uint8_t* sc[R];
  const uint8_t* bi[R];
  int64_t es, sb;  // bytes of one scale, of one row of scales
  // Prefetches the scales and biases of group g8 for the rows `rows` ahead.
  MOECEL_AVX2 void prefetch_params(int64_t g8, int64_t rows) const {
    const int64_t off = g8 * es + rows * sb;
    MOECEL_UNROLL
    for (int i = 0; i < R; ++i) {
      prefetch_next(sc[i], off);
      if (bi[i]) prefetch_next(bi[i], off);
    }
  }
  RowPtrs(const Slice& s, int64_t r) {
    es = int64_t(dtype_size(s.sdtype));
    sb = s.groups * es;
    MOECEL_UNROLL
    for (int i = 0; i < R; ++i) {
      w[i] = s.w + (r + i) * s.row_bytes;
      sc[i] = s.scales + (r + i) * sb;
      bi[i] = s.biases ? s.biases + (r + i) * sb : nullptr;
    }
  }
};

// Converts 8 group scales (groups g8.. of each row) to f32 in scl[i][0..8).
template <DType ST, int R>
MOECEL_AVX2 inline void load_scales(const RowPtrs<R>& p, int64_t g8, int64_t ng, float (*scl)[8]) {
  MOECEL_UNROLL
  for (int i = 0; i < R; ++i) {
    const uint8_t* src = p.sc[i] + g8 * kElem<ST>;
    _mm256_store_ps(scl[i], ng == 8 ? load8<ST>(src) : load8_partial<ST>(src, ng));
  }
}

// sum_g bias[g] * sum(x_g) for one row; sums are zero-padded to a multiple of 8 groups.
template <DType ST>
MOECEL_AVX2 inline float bias_term(const uint8_t* bi, const float* sums, int64_t groups) {
  if (!bi) return 0.0f;
  __m256 acc = _mm256_setzero_ps();
  for (int64_t g = 0; g < groups; g += 8) {
    __m256 b = groups - g >= 8 ? load8<ST>(bi + g * kElem<ST>) : load8_partial<ST>(bi + g * kElem<ST>, groups - g);
    acc = _mm256_fmadd_ps(b, _mm256_loadu_ps(sums + g), acc);
  }
  return hsum(acc);
}

// ---- 4-bit ----
// Byte j of a 16-value block holds value 2j (low nibble) and 2j+1 (high nibble). With lo = byte & 15 and the
// whole byte B = lo + 16 hi: lo*xe + hi*xo = lo*(xe - xo/16) + B*(xo/16). prep_q4 stores, per block of 16,
// xe - xo/16 (8 floats) then xo/16 (8 floats), so each block costs one zero-extending load, one AND, two
// conversions and two FMAs.
MOECEL_AVX2 void prep_q4(const Slice& s, const float* x, float* px) {
  prep_plain(s, x, px);
  const __m256i even = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
  const __m256 sixteenth = _mm256_set1_ps(1.0f / 16.0f);
  for (int64_t i = 0; i < s.in; i += 16) {
    // a = x[i..i+8), b = x[i+8..i+16) -> even/odd elements.
    __m256 a = _mm256_permutevar8x32_ps(_mm256_loadu_ps(x + i), even);
    __m256 b = _mm256_permutevar8x32_ps(_mm256_loadu_ps(x + i + 8), even);
    __m256 xe = _mm256_permute2f128_ps(a, b, 0x20), xo = _mm256_permute2f128_ps(a, b, 0x31);
    __m256 xo16 = _mm256_mul_ps(xo, sixteenth);
    _mm256_storeu_ps(px + i, _mm256_sub_ps(xe, xo16));
    _mm256_storeu_ps(px + i + 8, xo16);
  }
}

template <DType ST, int GS, int R>
MOECEL_AVX2 void q4_rows(const Slice& s, const float* px, int64_t r, float* y) {
  RowPtrs<R> p(s, r);
  constexpr int64_t gs = GS, nb = gs / 16;
  const __m256i low = _mm256_set1_epi32(15);
  __m256 tot[R];
  MOECEL_UNROLL
  for (int i = 0; i < R; ++i) tot[i] = _mm256_setzero_ps();
  alignas(32) float scl[R][8];
  for (int64_t g8 = 0; g8 < s.groups; g8 += 8) {
    const int64_t ng = std::min<int64_t>(8, s.groups - g8);
    load_scales<ST, R>(p, g8, ng, scl);
    p.prefetch_params(g8, R);
    for (int64_t gi = 0; gi < ng; ++gi) {
      const int64_t i0 = (g8 + gi) * gs;
      __m256 a[R], b[R];
      MOECEL_UNROLL
      for (int i = 0; i < R; ++i) a[i] = b[i] = _mm256_setzero_ps();
      MOECEL_UNROLL
      for (int i = 0; i < R; ++i) prefetch_next(p.w[i] + i0 / 2, R * s.row_bytes);
      MOECEL_UNROLL
      for (int64_t blk = 0; blk < nb; ++blk) {
        const __m256 xe = _mm256_loadu_ps(px + i0 + 16 * blk), xo = _mm256_loadu_ps(px + i0 + 16 * blk + 8);
        MOECEL_UNROLL
        for (int i = 0; i < R; ++i) {
          __m256i v =
              _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p.w[i] + i0 / 2 + 8 * blk)));
          a[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(v, low)), xe, a[i]);
          b[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(v), xo, b[i]);
        }
      }
      MOECEL_UNROLL
      for (int i = 0; i < R; ++i)
        tot[i] = _mm256_fmadd_ps(_mm256_broadcast_ss(&scl[i][gi]), _mm256_add_ps(a[i], b[i]), tot[i]);
    }
  }
  MOECEL_UNROLL
  for (int i = 0; i < R; ++i) y[r + i] = hsum(tot[i]) + bias_term<ST>(p.bi[i], px + s.in, s.groups);
}

// ---- 8-bit ----
template <DType ST, int GS, int R>
MOECEL_AVX2 void q8_rows(const Slice& s, const float* px, int64_t r, float* y) {
  RowPtrs<R> p(s, r);
  constexpr int64_t gs = GS;
  __m256 tot[R];
  MOECEL_UNROLL
  for (int i = 0; i < R; ++i) tot[i] = _mm256_setzero_ps();
  alignas(32) float scl[R][8];
  for (int64_t g8 = 0; g8 < s.groups; g8 += 8) {
    const int64_t ng = std::min<int64_t>(8, s.groups - g8);
    load_scales<ST, R>(p, g8, ng, scl);
    p.prefetch_params(g8, R);
    for (int64_t gi = 0; gi < ng; ++gi) {
      const int64_t i0 = (g8 + gi) * gs;
      __m256 a[R], b[R];
      MOECEL_UNROLL
      for (int i = 0; i < R; ++i) {
        a[i] = b[i] = _mm256_setzero_ps();
        prefetch_next(p.w[i] + i0, R * s.row_bytes);
      }
      MOECEL_UNROLL
      for (int64_t k = 0; k < gs; k += 16) {
        const __m256 x0 = _mm256_loadu_ps(px + i0 + k), x1 = _mm256_loadu_ps(px + i0 + k + 8);
        MOECEL_UNROLL
        for (int i = 0; i < R; ++i) {
          const uint8_t* q = p.w[i] + i0 + k;
          __m256i v0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q)));
          __m256i v1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + 8)));
          a[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(v0), x0, a[i]);
          b[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(v1), x1, b[i]);
        }
      }
      MOECEL_UNROLL
      for (int i = 0; i < R; ++i)
        tot[i] = _mm256_fmadd_ps(_mm256_broadcast_ss(&scl[i][gi]), _mm256_add_ps(a[i], b[i]), tot[i]);
    }
  }
  MOECEL_UNROLL
  for (int i = 0; i < R; ++i) y[r + i] = hsum(tot[i]) + bias_term<ST>(p.bi[i], px + s.in, s.groups);
}

// ---- 6-bit ----
// 8 values live in 6 bytes; value j at bit 6j. The 8 bytes loaded are broadcast to both 128-bit lanes and
// shuffled so dword j holds the 2 bytes that contain value j, then shifted and masked.
MOECEL_AVX2 inline __m256i q6_decode8(const uint8_t* q) {
  const __m256i shuf = _mm256_setr_epi8(0, 1, -1, -1, 0, 1, -1, -1, 1, 2, -1, -1, 2, 3, -1, -1,  //
                                        3, 4, -1, -1, 3, 4, -1, -1, 4, 5, -1, -1, 5, 6, -1, -1);
  const __m256i shifts = _mm256_setr_epi32(0, 6, 4, 2, 0, 6, 4, 2);
  int64_t bytes;
  std::memcpy(&bytes, q, 8);
  __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi64x(bytes), shuf);
  return _mm256_and_si256(_mm256_srlv_epi32(v, shifts), _mm256_set1_epi32(63));
}

template <DType ST, int GS, int R>
MOECEL_AVX2 void q6_rows(const Slice& s, const float* px, int64_t r, float* y) {
  RowPtrs<R> p(s, r);
  constexpr int64_t gs = GS;
  // The 8-byte loads of the last group could pass the end of the tensor: that group reads from copies.
  const int64_t last_off = (s.groups - 1) * gs * 6 / 8, last_bytes = gs * 6 / 8;
  alignas(32) uint8_t last[R][96 + 8] = {};
  MOECEL_UNROLL
  for (int i = 0; i < R; ++i) std::memcpy(last[i], p.w[i] + last_off, size_t(last_bytes));
  __m256 tot[R];
  MOECEL_UNROLL
  for (int i = 0; i < R; ++i) tot[i] = _mm256_setzero_ps();
  alignas(32) float scl[R][8];
  for (int64_t g8 = 0; g8 < s.groups; g8 += 8) {
    const int64_t ng = std::min<int64_t>(8, s.groups - g8);
    load_scales<ST, R>(p, g8, ng, scl);
    p.prefetch_params(g8, R);
    for (int64_t gi = 0; gi < ng; ++gi) {
      const int64_t g = g8 + gi, i0 = g * gs;
      const uint8_t* q[R];
      MOECEL_UNROLL
      for (int i = 0; i < R; ++i) q[i] = g == s.groups - 1 ? last[i] : p.w[i] + g * last_bytes;
      __m256 a[R], b[R];
      MOECEL_UNROLL
      for (int i = 0; i < R; ++i) {
        a[i] = b[i] = _mm256_setzero_ps();
        prefetch_next(p.w[i] + g * last_bytes, R * s.row_bytes);
      }
      MOECEL_UNROLL
      for (int64_t k = 0; k < gs; k += 16) {
        const __m256 x0 = _mm256_loadu_ps(px + i0 + k), x1 = _mm256_loadu_ps(px + i0 + k + 8);
        MOECEL_UNROLL
        for (int i = 0; i < R; ++i) {
          const uint8_t* qk = q[i] + k * 6 / 8;
          a[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q6_decode8(qk)), x0, a[i]);
          b[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q6_decode8(qk + 6)), x1, b[i]);
        }
      }
      MOECEL_UNROLL
      for (int i = 0; i < R; ++i)
        tot[i] = _mm256_fmadd_ps(_mm256_broadcast_ss(&scl[i][gi]), _mm256_add_ps(a[i], b[i]), tot[i]);
    }
  }
  MOECEL_UNROLL
  for (int i = 0; i < R; ++i) y[r + i] = hsum(tot[i]) + bias_term<ST>(p.bi[i], px + s.in, s.groups);
}

// ---- dense ----
template <DType WT, int R>
MOECEL_AVX2 void dense_rows(const Slice& s, const float* px, int64_t r, float* y) {
  const uint8_t* w[R];
  MOECEL_UNROLL
  for (int i = 0; i < R; ++i) w[i] = s.w + (r + i) * s.row_bytes;
  __m256 a[R], b[R];
  MOECEL_UNROLL
  for (int i = 0; i < R; ++i) a[i] = b[i] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= s.in; k += 16) {
    const __m256 x0 = _mm256_loadu_ps(px + k), x1 = _mm256_loadu_ps(px + k + 8);
    MOECEL_UNROLL
    for (int i = 0; i < R; ++i) {
      if (k % (64 / kElem<WT>) == 0) prefetch_next(w[i] + k * kElem<WT>, R * s.row_bytes);
      a[i] = _mm256_fmadd_ps(load8<WT>(w[i] + k * kElem<WT>), x0, a[i]);
      b[i] = _mm256_fmadd_ps(load8<WT>(w[i] + (k + 8) * kElem<WT>), x1, b[i]);
    }
  }
  for (; k < s.in; k += 8) {
    const int64_t n = std::min<int64_t>(8, s.in - k);
    const __m256 xv = _mm256_maskload_ps(px + k, tail_mask(n));
    MOECEL_UNROLL
    for (int i = 0; i < R; ++i) {
      const uint8_t* src = w[i] + k * kElem<WT>;
      a[i] = _mm256_fmadd_ps(n == 8 ? load8<WT>(src) : load8_partial<WT>(src, n), xv, a[i]);
    }
  }
  MOECEL_UNROLL
  for (int i = 0; i < R; ++i) y[r + i] = hsum(_mm256_add_ps(a[i], b[i]));
}

// Rows [r0, r1) in blocks of 4, then single rows; a row's arithmetic does not depend on its block.
template <template <DType, int> class K, DType T>
MOECEL_AVX2 void gemv_rows(const Slice& s, const float* px, int64_t r0, int64_t r1, float* y) {
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4) K<T, 4>::run(s, px, r, y);
  for (; r < r1; ++r) K<T, 1>::run(s, px, r, y);
}

// The same for quantized kernels, which also take the group size as a constant.
template <template <DType, int, int> class K, DType T, int GS>
MOECEL_AVX2 void gemv_rows_q(const Slice& s, const float* px, int64_t r0, int64_t r1, float* y) {
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
  MOECEL_AVX2 static void run(const Slice& s, const float* px, int64_t r, float* y) { q4_rows<T, GS, R>(s, px, r, y); }
};
template <DType T, int GS, int R>
struct Q8 {
  MOECEL_AVX2 static void run(const Slice& s, const float* px, int64_t r, float* y) { q8_rows<T, GS, R>(s, px, r, y); }
};
template <DType T, int GS, int R>
struct Q6 {
  MOECEL_AVX2 static void run(const Slice& s, const float* px, int64_t r, float* y) { q6_rows<T, GS, R>(s, px, r, y); }
};
template <DType T, int R>
struct Dense {
  MOECEL_AVX2 static void run(const Slice& s, const float* px, int64_t r, float* y) { dense_rows<T, R>(s, px, r, y); }
};

// ---- dequantization to f32 rows ----
// Scales and biases are converted 8 groups at a time; each group is then decoded to f32 and stored.
template <DType ST, int BITS, int GS>
MOECEL_AVX2 void dequant_q(const Slice& s, int64_t r0, int64_t r1, float* dst, int64_t ld) {
  constexpr int64_t gbytes = GS * BITS / 8;
  const __m128i low = _mm_set1_epi8(15);
  alignas(32) float scl[1][8], bia[8];
  for (int64_t r = r0; r < r1; ++r) {
    RowPtrs<1> p(s, r);
    float* d = dst + (r - r0) * ld;
    alignas(32) uint8_t last[96 + 8] = {};  // 6-bit: the last group's 8-byte loads read from this copy
    if constexpr (BITS == 6) std::memcpy(last, p.w[0] + (s.groups - 1) * gbytes, size_t(gbytes));
    for (int64_t g8 = 0; g8 < s.groups; g8 += 8) {
      const int64_t ng = std::min<int64_t>(8, s.groups - g8);
      load_scales<ST, 1>(p, g8, ng, scl);
      const uint8_t* bsrc = p.bi[0] + g8 * kElem<ST>;
      _mm256_store_ps(bia, !p.bi[0] ? _mm256_setzero_ps() : ng == 8 ? load8<ST>(bsrc) : load8_partial<ST>(bsrc, ng));
      for (int64_t gi = 0; gi < ng; ++gi) {
        const int64_t g = g8 + gi;
        const __m256 sc = _mm256_broadcast_ss(&scl[0][gi]), bi = _mm256_broadcast_ss(&bia[gi]);
        const uint8_t* q = p.w[0] + g * gbytes;
        float* dg = d + g * GS;
        if constexpr (BITS == 4) {
          MOECEL_UNROLL
          for (int64_t k = 0; k < GS; k += 16) {
            __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + k / 2));
            __m128i v = _mm_unpacklo_epi8(_mm_and_si128(b, low), _mm_and_si128(_mm_srli_epi16(b, 4), low));
            __m256 f0 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v));
            __m256 f1 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(v, 8)));
            _mm256_storeu_ps(dg + k, _mm256_fmadd_ps(sc, f0, bi));
            _mm256_storeu_ps(dg + k + 8, _mm256_fmadd_ps(sc, f1, bi));
          }
        } else if constexpr (BITS == 8) {
          MOECEL_UNROLL
          for (int64_t k = 0; k < GS; k += 8) {
            __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + k)));
            _mm256_storeu_ps(dg + k, _mm256_fmadd_ps(sc, _mm256_cvtepi32_ps(v), bi));
          }
        } else {
          if (g == s.groups - 1) q = last;
          MOECEL_UNROLL
          for (int64_t k = 0; k < GS; k += 8)
            _mm256_storeu_ps(dg + k, _mm256_fmadd_ps(sc, _mm256_cvtepi32_ps(q6_decode8(q + k * 6 / 8)), bi));
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

template <DType WT>
MOECEL_AVX2 void dequant_dense(const Slice& s, int64_t r0, int64_t r1, float* dst, int64_t ld) {
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* w = s.w + r * s.row_bytes;
    float* d = dst + (r - r0) * ld;
    int64_t k = 0;
    for (; k + 8 <= s.in; k += 8) _mm256_storeu_ps(d + k, load8<WT>(w + k * kElem<WT>));
    if (k < s.in) _mm256_maskstore_ps(d + k, tail_mask(s.in - k), load8_partial<WT>(w + k * kElem<WT>, s.in - k));
  }
}

// ---- f32 micro-kernel: R rows x T tokens of 8-wide accumulators over k ----
template <int R, int T>
MOECEL_AVX2 void micro(const float* w, int64_t ldw, const float* const* x, int64_t k0, int64_t kc, float* const* y,
                       int64_t y_off, bool accumulate) {
  __m256 c[R][T];
  MOECEL_UNROLL
  for (int i = 0; i < R; ++i) MOECEL_UNROLL
  for (int t = 0; t < T; ++t) c[i][t] = _mm256_setzero_ps();
  const float* wr[R];
  const float* xt[T];
  MOECEL_UNROLL
  for (int i = 0; i < R; ++i) wr[i] = w + i * ldw + k0;
  MOECEL_UNROLL
  for (int t = 0; t < T; ++t) xt[t] = x[t] + k0;
  int64_t k = 0;
  for (; k + 8 <= kc; k += 8) {
    __m256 wv[R];
    MOECEL_UNROLL
    for (int i = 0; i < R; ++i) wv[i] = _mm256_loadu_ps(wr[i] + k);
    MOECEL_UNROLL
    for (int t = 0; t < T; ++t) {
      const __m256 xv = _mm256_loadu_ps(xt[t] + k);
      MOECEL_UNROLL
      for (int i = 0; i < R; ++i) c[i][t] = _mm256_fmadd_ps(wv[i], xv, c[i][t]);
    }
  }
  if (k < kc) {
    const __m256i m = tail_mask(kc - k);
    __m256 wv[R];
    MOECEL_UNROLL
    for (int i = 0; i < R; ++i) wv[i] = _mm256_maskload_ps(wr[i] + k, m);
    MOECEL_UNROLL
    for (int t = 0; t < T; ++t) {
      const __m256 xv = _mm256_maskload_ps(xt[t] + k, m);
      MOECEL_UNROLL
      for (int i = 0; i < R; ++i) c[i][t] = _mm256_fmadd_ps(wv[i], xv, c[i][t]);
    }
  }
  MOECEL_UNROLL
  for (int t = 0; t < T; ++t) MOECEL_UNROLL
  for (int i = 0; i < R; ++i) {
    float v = hsum(c[i][t]);
    float* dst = y[t] + y_off + i;
    *dst = accumulate ? *dst + v : v;
  }
}

using MicroFn = void (*)(const float*, int64_t, const float* const*, int64_t, int64_t, float* const*, int64_t, bool);
constexpr int kMr = 3, kNr = 4;
constexpr MicroFn kMicro[kMr][kNr] = {
    {micro<1, 1>, micro<1, 2>, micro<1, 3>, micro<1, 4>},
    {micro<2, 1>, micro<2, 2>, micro<2, 3>, micro<2, 4>},
    {micro<3, 1>, micro<3, 2>, micro<3, 3>, micro<3, 4>},
};

MOECEL_AVX2 void gemm(const float* w, int64_t ldw, int64_t n_rows, const float* const* x, int64_t n_tok, int64_t k0,
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
    case 6:
      k.gemv = gemv_for_group<Q6, T>(s.group_size);
      k.dequant = dequant_for_group<T, 6>(s.group_size);
      break;
    case 8:
      k.gemv = gemv_for_group<Q8, T>(s.group_size);
      k.dequant = dequant_for_group<T, 8>(s.group_size);
      break;
    default: break;  // 2, 3, 5 bits: scalar decoders
  }
}

}  // namespace

void avx2_kernels(const Slice& s, Kernels& k) {
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
    case DType::kF16:
      k.gemv = gemv_rows<Dense, DType::kF16>;
      k.dequant = dequant_dense<DType::kF16>;
      break;
    case DType::kBF16:
      k.gemv = gemv_rows<Dense, DType::kBF16>;
      k.dequant = dequant_dense<DType::kBF16>;
      break;
    default: break;
  }
}

}  // namespace moecel::cpu::detail
#endif  // __x86_64__
