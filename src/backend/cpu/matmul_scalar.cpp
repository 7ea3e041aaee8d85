// Portable scalar matmul kernels: every bit width, group size and dtype. They are the fallback on CPUs
// without AVX2 (and for formats the SIMD files skip), and an independent path the tests compare against.
#include <cstring>

#include "backend/cpu/matmul_internal.h"
#include "core/half.h"

namespace moecel::cpu::detail {
namespace {

inline float load_elem(const uint8_t* base, DType t, int64_t i) {
  switch (t) {
    case DType::kF32: {
      float f;
      std::memcpy(&f, base + 4 * i, 4);
      return f;
    }
    case DType::kF16: {
      uint16_t h;
      std::memcpy(&h, base + 2 * i, 2);
      return f16_to_f32(h);
    }
    case DType::kBF16: {
      uint16_t h;
      std::memcpy(&h, base + 2 * i, 2);
      return bf16_to_f32(h);
    }
    default: return 0.0f;
  }
}

}  // namespace

void prep_plain(const Slice& s, const float* x, float* px) {
  std::memcpy(px, x, sizeof(float) * size_t(s.in));
  float* sums = px + s.in;
  const int64_t padded = sums_floats(s);
  for (int64_t g = 0; g < padded; ++g) sums[g] = 0.0f;
  for (int64_t g = 0; g < s.groups; ++g) {
    double acc = 0.0;
    for (int64_t i = 0; i < s.group_size; ++i) acc += x[g * s.group_size + i];
    sums[g] = float(acc);
  }
}

namespace {

// Uses dot(s*q + b, x_g) = s * dot(q, x_g) + b * sum(x_g).
void gemv_quant(const Slice& s, const float* px, int64_t r0, int64_t r1, float* y) {
  const size_t sb = dtype_size(s.sdtype);
  const float* sums = px + s.in;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = s.w + r * s.row_bytes;
    const uint8_t* sc = s.scales + size_t(r * s.groups) * sb;
    const uint8_t* bi = s.biases ? s.biases + size_t(r * s.groups) * sb : nullptr;
    float total = 0.0f;
    for (int64_t g = 0; g < s.groups; ++g) {
      float acc = 0.0f;
      int64_t i0 = g * s.group_size;
      for (int64_t i = i0; i < i0 + s.group_size; ++i) acc += float(unpack_value(row, i, s.bits)) * px[i];
      total += load_elem(sc, s.sdtype, g) * acc;
      if (bi) total += load_elem(bi, s.sdtype, g) * sums[g];
    }
    y[r] = total;
  }
}

void gemv_dense(const Slice& s, const float* px, int64_t r0, int64_t r1, float* y) {
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = s.w + r * s.row_bytes;
    float acc = 0.0f;
    for (int64_t i = 0; i < s.in; ++i) acc += load_elem(row, s.wdtype, i) * px[i];
    y[r] = acc;
  }
}

void dequant_quant(const Slice& s, int64_t r0, int64_t r1, float* dst, int64_t ld) {
  const size_t sb = dtype_size(s.sdtype);
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = s.w + r * s.row_bytes;
    const uint8_t* sc = s.scales + size_t(r * s.groups) * sb;
    const uint8_t* bi = s.biases ? s.biases + size_t(r * s.groups) * sb : nullptr;
    float* d = dst + (r - r0) * ld;
    for (int64_t g = 0; g < s.groups; ++g) {
      float scale = load_elem(sc, s.sdtype, g), bias = bi ? load_elem(bi, s.sdtype, g) : 0.0f;
      for (int64_t i = g * s.group_size; i < (g + 1) * s.group_size; ++i)
        d[i] = scale * float(unpack_value(row, i, s.bits)) + bias;
    }
  }
}

void dequant_dense(const Slice& s, int64_t r0, int64_t r1, float* dst, int64_t ld) {
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = s.w + r * s.row_bytes;
    float* d = dst + (r - r0) * ld;
    for (int64_t i = 0; i < s.in; ++i) d[i] = load_elem(row, s.wdtype, i);
  }
}

void gemm(const float* w, int64_t ldw, int64_t n_rows, const float* const* x, int64_t n_tok, int64_t k0, int64_t kc,
          float* const* y, int64_t y_off, bool accumulate) {
  for (int64_t t = 0; t < n_tok; ++t) {
    const float* xt = x[t] + k0;
    for (int64_t i = 0; i < n_rows; ++i) {
      const float* wi = w + i * ldw + k0;
      float acc = 0.0f;
      for (int64_t k = 0; k < kc; ++k) acc += wi[k] * xt[k];
      float* dst = y[t] + y_off + i;
      *dst = accumulate ? *dst + acc : acc;
    }
  }
}

}  // namespace

void scalar_kernels(const Slice& s, Kernels& k) {
  k.prep = prep_plain;
  k.gemv = s.bits ? gemv_quant : gemv_dense;
  k.dequant = s.bits ? dequant_quant : dequant_dense;
  k.gemm = gemm;
}

}  // namespace moecel::cpu::detail
