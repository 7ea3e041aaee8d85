// MLX affine quantization reference (scalar). Rows are little-endian bit streams of `bits`-wide values, so
// 3-, 5- and 6-bit values may straddle two uint32 words. quantize_row reproduces mx.quantize bit for bit
// (checked against MLX goldens in tests/golden/quant), so checkpoints written here match mlx-lm's.
#include "quant/affine.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/half.h"

// MLX rounds scale * q and then + bias separately; a fused multiply-add (which compilers emit on their own when
// FMA is available, even in ISO mode) would differ in the last bit, so contraction is off for this file.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace moecel {

int64_t packed_words(int64_t in, int bits) {
  MOECEL_CHECK(valid_bits(bits), "unsupported bits {} (expected 2, 3, 4, 5, 6 or 8)", bits);
  MOECEL_CHECK(in >= 0 && (in * bits) % 32 == 0, "row length {} x {} bits is not a whole number of 32-bit words", in,
               bits);
  return in * bits / 32;
}

void pack_row(const uint8_t* q, int64_t in, int bits, uint32_t* packed) {
  const int64_t words = packed_words(in, bits);
  std::fill(packed, packed + words, 0u);
  const uint32_t max_q = (1u << bits) - 1;
  for (int64_t i = 0; i < in; ++i) {
    const uint32_t v = q[i];
    MOECEL_CHECK(v <= max_q, "pack_row: value {} at index {} does not fit in {} bits", v, i, bits);
    const int64_t bit = i * bits;
    const int64_t word = bit / 32;
    const int shift = int(bit % 32);
    packed[word] |= v << shift;
    if (shift + bits > 32) packed[word + 1] |= v >> (32 - shift);  // the high part spills into the next word
  }
}

void unpack_row(const uint32_t* packed, int64_t in, int bits, uint8_t* q) {
  const int64_t words = packed_words(in, bits);
  const uint32_t mask = (1u << bits) - 1;
  for (int64_t i = 0; i < in; ++i) {
    const int64_t bit = i * bits;
    const int64_t word = bit / 32;
    const int shift = int(bit % 32);
    uint64_t pair = packed[word];
    if (shift + bits > 32 && word + 1 < words) pair |= uint64_t(packed[word + 1]) << 32;
    q[i] = uint8_t((pair >> shift) & mask);
  }
}

// MLX's affine quantizer (mlx/ops.cpp): the group's extreme with the larger magnitude ("edge") becomes the
// bias and is hit exactly by q = 0; the scale is nudged so that w = 0 is also exactly representable.
// All arithmetic in f32, in MLX's order, so scales, biases and codes match MLX bit for bit.
void quantize_row(const float* w, int64_t in, int bits, int group_size, uint32_t* packed, float* scales,
                  float* biases) {
  MOECEL_CHECK(valid_group_size(group_size), "unsupported group_size {} (expected 32, 64 or 128)", group_size);
  MOECEL_CHECK(in % group_size == 0, "row length {} is not a multiple of group_size {}", in, group_size);
  packed_words(in, bits);  // validates bits and the packed width
  const float n_bins = float((1 << bits) - 1);
  const float eps = 1e-7f;
  std::vector<uint8_t> q(static_cast<size_t>(in));
  for (int64_t g = 0; g < in / group_size; ++g) {
    const float* x = w + g * group_size;
    float w_min = x[0], w_max = x[0];
    for (int i = 0; i < group_size; ++i) {
      MOECEL_CHECK(std::isfinite(x[i]), "quantize_row: non-finite value {} at index {}", x[i], g * group_size + i);
      w_min = std::min(w_min, x[i]);
      w_max = std::max(w_max, x[i]);
    }
    const bool min_is_edge = std::fabs(w_min) > std::fabs(w_max);
    float scale = std::max((w_max - w_min) / n_bins, eps);
    scale = min_is_edge ? scale : -scale;
    const float edge = min_is_edge ? w_min : w_max;
    const float q0 = std::nearbyint(edge / scale);
    float bias = 0.0f;
    if (q0 != 0.0f) {
      scale = edge / q0;
      bias = edge;
    }
    for (int i = 0; i < group_size; ++i) {
      const float v = std::nearbyint((x[i] - bias) / scale);
      q[size_t(g * group_size + i)] = uint8_t(std::clamp(v, 0.0f, n_bins));
    }
    scales[g] = scale;
    biases[g] = bias;
  }
  pack_row(q.data(), in, bits, packed);
}

float load_float(const void* data, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kF32: return static_cast<const float*>(data)[i];
    case DType::kF16: return f16_to_f32(static_cast<const uint16_t*>(data)[i]);
    case DType::kBF16: return bf16_to_f32(static_cast<const uint16_t*>(data)[i]);
    default: fail("load_float: dtype {} is not a float type", dtype_name(dtype));
  }
}

void dequantize_row(const LinearWeight& w, int64_t expert, int64_t row, float* out) {
  const int64_t n_slices = w.n_stack > 0 ? w.n_stack : 1;
  MOECEL_CHECK(expert >= 0 && expert < n_slices && row >= 0 && row < w.out,
               "dequantize_row {}: expert {} row {} out of range ({} slices of {} rows)", w.name, expert, row, n_slices,
               w.out);
  MOECEL_CHECK(w.weight.device == Device::kCpu, "dequantize_row {}: weight is not on the host", w.name);
  const int64_t r = expert * w.out + row;  // row index in the flattened (n_stack * out, ...) view
  if (!w.quantized()) {
    for (int64_t i = 0; i < w.in; ++i) out[i] = load_float(w.weight.data, w.weight.dtype, r * w.in + i);
    return;
  }
  const int64_t words = packed_words(w.in, w.bits);
  const int64_t n_groups = w.in / w.group_size;
  std::vector<uint8_t> q(static_cast<size_t>(w.in));
  unpack_row(w.weight.ptr<const uint32_t>() + r * words, w.in, w.bits, q.data());
  for (int64_t g = 0; g < n_groups; ++g) {
    const float s = load_float(w.scales.data, w.scales.dtype, r * n_groups + g);
    const float b = load_float(w.biases.data, w.biases.dtype, r * n_groups + g);
    // Two roundings (see the fp-contract note above), exactly as mx.dequantize computes it.
    for (int64_t i = g * w.group_size; i < (g + 1) * w.group_size; ++i) {
      const float sq = s * float(q[size_t(i)]);
      out[i] = sq + b;
    }
  }
}

}  // namespace moecel
