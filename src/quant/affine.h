// MLX affine quantization reference: packing, unpacking, quantizing and dequantizing rows.
// Value i of a row sits at bit i * bits of the row's little-endian bit stream (rows are whole uint32 words);
// w = scale[g] * q + bias[g] with g = i / group_size. Plain scalar code: the oracle the kernels are tested against.
#pragma once
#include <cstdint>

#include "core/dtype.h"
#include "quant/qweight.h"

namespace moecel {

// Words per packed row: in * bits / 32 (in * bits must be a multiple of 32).
int64_t packed_words(int64_t in, int bits);

// q (in,) values in [0, 2^bits) -> packed (packed_words(in, bits),)
void pack_row(const uint8_t* q, int64_t in, int bits, uint32_t* packed);
// packed -> q (in,)
void unpack_row(const uint32_t* packed, int64_t in, int bits, uint8_t* q);

// Quantizes one row of floats (in,) exactly as mx.quantize does (affine mode): per group, the extreme with the
// larger magnitude becomes the bias (q = 0 hits it exactly), scale = +-(max - min) / (2^bits - 1) nudged so that
// 0.0 is exactly representable (the scale may be negative), q = clamp(round((w - bias) / scale), 0, 2^bits - 1).
// scales/biases get in / group_size values. Non-finite input is an error.
void quantize_row(const float* w, int64_t in, int bits, int group_size, uint32_t* packed, float* scales, float* biases);

// Reads element i of a float tensor of dtype F32/F16/BF16.
float load_float(const void* data, DType dtype, int64_t i);

// Dequantizes (or converts, for dense weights) row `row` of slice `expert` (0 for 2-D weights) to f32 (in,).
void dequantize_row(const LinearWeight& w, int64_t expert, int64_t row, float* out);

}  // namespace moecel
