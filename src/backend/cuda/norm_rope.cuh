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

// sum = a + b (sum may alias a or b), y = rms_norm(sum) per row of d: launch_add then launch_rms_norm in one
// launch (1024 threads per row, so the sum of squares is added in another order). y must not overlap a, b or sum.
void launch_add_rms_norm(const Ctx& ctx, const float* a, const float* b, float* sum, const void* weight,
                         FloatType wtype, int64_t n_rows, int64_t d, float eps, float* y);

// The attention prologue in one launch, grid (n_tokens, 2): block y = 0 takes the q row, 1 the k row. Each is
// normalized in place over its full width (q_width = n_heads * head_dim, kv_width = n_kv_heads * head_dim) like
// launch_rms_norm (1024 threads per row), then roped as launch_rope does; the k block then writes the k and v rows to
// cache row pos0 + t (pos0 from ctx.step_pos when set; rows past capacity are skipped).
void launch_qk_norm_rope_store(const Ctx& ctx, float* q, float* k, const float* v, const void* q_norm,
                               FloatType q_wtype, const void* k_norm, FloatType k_wtype, float eps, int64_t n_tokens,
                               int n_heads, int n_kv_heads, int head_dim, int half, const RopeFreqs& freqs,
                               int64_t pos0, int64_t capacity, float* k_cache, float* v_cache);

// The full-width q/k norm of launch_qk_norm_rope_store: kQkNormThreads threads per row, element e of the row summed
// by thread e % kQkNormThreads (kQkNormPer elements each: rows up to 4096 wide), then block_sum. The fused decode
// attention block (attention.cu) adds its squares in the same order, so both give the same bits.
constexpr int kQkNormThreads = 1024;
constexpr int kQkNormPer = 4;

#ifdef __CUDACC__
// The rotary angle's sine and cosine for element c (< 2 * half) at position pos.
__device__ __forceinline__ void rope_angle(int c, int half, float pos, const RopeFreqs& f, float& sn, float& cs) {
  sincosf(pos * f.inv_freq[c < half ? c : c - half], &sn, &cs);
}

// Element c (< 2 * half) of a normalized head after NeoX rotary by the angle (sn, cs): pairs (i, i + half).
__device__ __forceinline__ float rope_rotate(const float* head, int c, int half, float sn, float cs) {
  const int i = c < half ? c : c - half;
  const float a = head[i], b = head[i + half];
  return c < half ? a * cs - b * sn : b * cs + a * sn;
}

// Element c (< 2 * half) of a normalized head after NeoX rotary at position pos.
__device__ __forceinline__ float rope_value(const float* head, int c, int half, float pos, const RopeFreqs& f) {
  float sn, cs;
  rope_angle(c, half, pos, f, sn, cs);
  return rope_rotate(head, c, half, sn, cs);
}
#endif

}  // namespace moecel::cuda
