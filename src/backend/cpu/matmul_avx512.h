// Helpers shared by the AVX-512 kernel files (matmul_avx512.cpp, matmul_avx512_vnni.cpp): loads of 16 scales
// or values in any float dtype, prefetches, row pointers, a row's bias term. x86-64 only; include after
// checking __x86_64__.
#pragma once
#include <immintrin.h>

#include <cstring>

#include "backend/cpu/matmul_internal.h"

// GCC 12 flags the _mm*_undefined_* values inside its AVX-512 intrinsics as uninitialized (a false positive).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#define MOECEL_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
// Loops over the R rows / T tokens of a register block must be unrolled for the accumulators to stay in registers.
#define MOECEL_UNROLL _Pragma("GCC unroll 16")

namespace moecel::cpu::detail::avx512 {
template <DType T>
constexpr int kElem = T == DType::kF32 ? 4 : 2;

// 16 consecutive F32/F16/BF16 values as f32.
template <DType T>
MOECEL_AVX512 inline __m512 load16(const uint8_t* p) {
  if constexpr (T == DType::kF32) {
    return _mm512_loadu_ps(p);
  } else if constexpr (T == DType::kF16) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  } else {
    __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
  }
}

// The first n (< 16) values, zeros after: never reads past them.
template <DType T>
MOECEL_AVX512 inline __m512 load16_partial(const uint8_t* p, int64_t n) {
  alignas(64) uint8_t tmp[64] = {};
  std::memcpy(tmp, p, size_t(n) * kElem<T>);
  return load16<T>(tmp);
}

MOECEL_AVX512 inline __mmask16 tail_mask(int64_t n) {
  return __mmask16((1u << n) - 1u);
}

MOECEL_AVX512 inline void prefetch_ahead(const uint8_t* p, int64_t ahead) {
  _mm_prefetch(reinterpret_cast<const char*>(p + ahead), _MM_HINT_T0);
}

// Row pointers of R consecutive rows starting at r (see the AVX2 file).
template <int R>
struct RowPtrs {
  const uint8_t* w[R];
  const uint8_t* sc[R];
  const uint8_t* bi[R];
  int64_t es, sb;
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

// sum_g bias[g] * sum(x_g) for one row; sums are zero-padded to a multiple of 16 groups.
template <DType ST>
MOECEL_AVX512 inline float bias_term(const uint8_t* bi, const float* sums, int64_t groups) {
  if (!bi) return 0.0f;
  __m512 acc = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; g += 16) {
    const uint8_t* src = bi + g * kElem<ST>;
    __m512 b = groups - g >= 16 ? load16<ST>(src) : load16_partial<ST>(src, groups - g);
    acc = _mm512_fmadd_ps(b, _mm512_loadu_ps(sums + g), acc);
  }
  return _mm512_reduce_add_ps(acc);
}

}  // namespace moecel::cpu::detail::avx512
