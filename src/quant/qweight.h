// LinearWeight: the one validated type for a linear layer's weight, dense or MLX-affine quantized,
// optionally stacked over experts. Built only through the checked factories below.
#pragma once
#include <optional>
#include <string>

#include "core/tensor.h"

namespace moecel {

// MLX affine quantization parameters (DESIGN.md section 3).
struct QuantSpec {
  int bits = 0;        // 2, 3, 4, 5, 6 or 8
  int group_size = 0;  // 32, 64 or 128
};

bool valid_bits(int bits);
bool valid_group_size(int group_size);

struct LinearWeight {
  std::string name;  // module path, e.g. "model.layers.0.mlp.switch_mlp.up_proj" (for messages)
  // Dense:     weight (n_stack?, out, in), F32/F16/BF16.
  // Quantized: weight U32 packed (n_stack?, out, in * bits / 32);
  //            scales, biases (n_stack?, out, in / group_size), F32/F16/BF16 (same dtype).
  Tensor weight, scales, biases;
  int bits = 0;  // 0 = dense
  int group_size = 0;
  int64_t n_stack = 0;  // 0 = a plain 2-D linear; else the leading experts axis
  int64_t out = 0, in = 0;

  bool quantized() const { return bits != 0; }
  // Bytes read from memory by one matrix-vector product over one stacked slice (or the whole weight).
  size_t bytes_per_slice() const;
  size_t total_bytes() const;

  // Checked factories. `expected` is the config's spec for this module; bits are inferred from the
  // shapes (packed_cols * 32 == bits * in, in = scales_cols * group_size) and must agree with it.
  // `stacked` says whether a leading experts axis is expected.
  static LinearWeight quantized_from(std::string name, Tensor weight, Tensor scales, Tensor biases,
                                     QuantSpec expected, bool stacked);
  static LinearWeight dense_from(std::string name, Tensor weight, bool stacked);
};

}  // namespace moecel
