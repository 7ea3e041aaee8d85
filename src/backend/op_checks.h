// Input checks shared by the backends: each names the op, the tensor or weight and what was expected, so the CPU
// and CUDA backends reject the same bad input with the same message.
#pragma once
#include <cstdint>

#include "quant/qweight.h"

namespace moecel {

// The tensor is F32.
void check_f32_dtype(const Tensor& t, const char* what);
// The tensor holds rows x cols elements.
void check_rows(const Tensor& t, int64_t rows, int64_t cols, const char* what);
// A linear weight for `op` held on `dev`: dense F32/F16/BF16 (n_stack?, out, in), or MLX affine-quantized with
// U32 packed words (n_stack?, out, in * bits / 32) and scales / biases (n_stack?, out, in / group_size) of one
// float dtype; every tensor on `dev` with data.
void check_linear_weight(const LinearWeight& w, const char* op, Device dev);
// add_sigmoid_gated's shapes (a, b and out alike, one gate per row); returns the number of rows.
int64_t check_sigmoid_gated(const Tensor& a, const Tensor& gate, const Tensor& b, const Tensor& out);

}  // namespace moecel
