// RMSNorm (one block per row, f32 sum of squares) and NeoX rotary embedding (one block per token; the angle
// is float(pos) * inv_freq in f32, as the CPU backend and transformers compute it).
#include "backend/cuda/norm_rope.cuh"

namespace moecel::cuda {
namespace {

constexpr int kThreads = 256;

// Preconditions: blockDim.x == kThreads; one block per row. x and y may alias: every element is read by the
// thread that writes it, and the sum of squares is complete (block_sum barrier) before any write.
__global__ void __launch_bounds__(kThreads)
    rms_norm_kernel(const float* x, const void* weight, FloatType wtype, int64_t d, float eps, float* y) {
  __shared__ float red[32];
  const float* xr = x + int64_t(blockIdx.x) * d;
  float* yr = y + int64_t(blockIdx.x) * d;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < d; i += kThreads) ss = fmaf(xr[i], xr[i], ss);
  ss = block_sum(ss, red);
  const float inv = 1.0f / sqrtf(ss / float(d) + eps);
  for (int64_t i = threadIdx.x; i < d; i += kThreads) yr[i] = xr[i] * inv * load_float(weight, wtype, i);
}

// Preconditions: one block per token; half <= kMaxRopeHalf; 2 * half <= head_dim.
__global__ void __launch_bounds__(kThreads)
    rope_kernel(float* x, int64_t pos0, int n_heads, int head_dim, int half, RopeFreqs freqs) {
  const int64_t t = blockIdx.x;
  float* xt = x + t * int64_t(n_heads) * head_dim;
  const float pos = float(pos0 + t);
  for (int idx = threadIdx.x; idx < n_heads * half; idx += kThreads) {
    const int h = idx / half, i = idx % half;
    const float ang = pos * freqs.inv_freq[i];
    float s, c;
    sincosf(ang, &s, &c);
    float* v = xt + int64_t(h) * head_dim;
    const float a = v[i], b = v[i + half];
    v[i] = a * c - b * s;
    v[i + half] = b * c + a * s;
  }
}

}  // namespace

void launch_rms_norm(const Ctx& ctx, const float* x, const void* weight, FloatType wtype, int64_t n_rows, int64_t d,
                     float eps, float* y) {
  if (n_rows == 0 || d == 0) return;
  CUDA_REQUIRE(n_rows < (int64_t(1) << 31), "rms_norm: too many rows");
  rms_norm_kernel<<<unsigned(n_rows), kThreads, 0, ctx.stream>>>(x, weight, wtype, d, eps, y);
  CUDA_CHECK_LAUNCH();
}

void launch_rope(const Ctx& ctx, float* x, int64_t n_tokens, int64_t pos0, int n_heads, int head_dim, int half,
                 const RopeFreqs& freqs) {
  if (n_tokens == 0 || half == 0 || n_heads == 0) return;
  CUDA_REQUIRE(half > 0 && half <= kMaxRopeHalf && 2 * half <= head_dim, "rope: bad rotary dims");
  CUDA_REQUIRE(n_tokens < (int64_t(1) << 31), "rope: too many tokens");
  rope_kernel<<<unsigned(n_tokens), kThreads, 0, ctx.stream>>>(x, pos0, n_heads, head_dim, half, freqs);
  CUDA_CHECK_LAUNCH();
}

}  // namespace moecel::cuda
