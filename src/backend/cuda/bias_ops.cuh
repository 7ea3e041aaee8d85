// Elementwise ops of the qwen2_moe / qwen3_moe / dots1 blocks on the device: a linear layer's bias broadcast over
// rows, and the shared expert's sigmoid-gated add. The CPU spec is cpu/bias_router_ops.cpp.
// Used by: CudaBackend::add_bias, add_sigmoid_gated.
#pragma once
#include <cstdint>

#include "backend/cuda/cuda_common.cuh"

namespace moecel::cuda {

// x (n_rows, d) += bias (d,) of type bias_type, in place.
void launch_add_bias(const Ctx& ctx, float* x, int64_t n_rows, int64_t d, const void* bias, FloatType bias_type);

// out (n_rows, d) = a + sigmoid(gate[row]) * b, gate (n_rows,); out may alias a or b (elementwise).
void launch_add_sigmoid_gated(const Ctx& ctx, const float* a, const float* gate, const float* b, int64_t n_rows,
                              int64_t d, float* out);

}  // namespace moecel::cuda
