// RMSNorm and NeoX rotary embedding on the device.
// Used by: CudaBackend::rms_norm, CudaBackend::rope.
#pragma once
#include <cstdint>

#include "backend/cuda/cuda_common.cuh"

namespace moecel::cuda {

// x, y (n_rows, d), may alias; weight (d,) of type wtype. y = x / sqrt(mean(x^2) + eps) * weight.
void launch_rms_norm(const Ctx& ctx, const float* x, const void* weight, FloatType wtype, int64_t n_rows, int64_t d,
                     float eps, float* y);

// Rotary frequencies as f32, computed on the host in double exactly like the CPU backend (passed by value).
constexpr int kMaxRopeHalf = 256;  // rot_dims <= 512
struct RopeFreqs {
  float inv_freq[kMaxRopeHalf];
};

// x (n_tokens, n_heads * head_dim) in place; token t has position pos0 + t; rotates the first 2 * half dims
// of each head ("rotate half": pairs (i, i + half)).
void launch_rope(const Ctx& ctx, float* x, int64_t n_tokens, int64_t pos0, int n_heads, int head_dim, int half,
                 const RopeFreqs& freqs);

}  // namespace moecel::cuda
