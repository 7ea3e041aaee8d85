// RMSNorm (one block per row, f32 sum of squares) and NeoX rotary embedding (one block per token; the angle
// is float(pos) * inv_freq in f32, as the CPU backend and transformers compute it).
#include "backend/cuda/norm_rope.cuh"

namespace moecel::cuda {
namespace {

constexpr int kThreads = 256;
// The fused decode kernels run one block per row: 1024 threads keep each thread's chain of dependent loads
// short (2 per 2048-wide row), which is what their latency is made of.
constexpr int kRowThreads = kQkNormThreads;

// Preconditions: blockDim.x == kThreads; one block per row. x and y may alias: every element is read by the
// thread that writes it, and the sum of squares is complete (block_sum barrier) before any write.
__global__ void __launch_bounds__(kThreads)
    rms_norm_kernel(const float* x, const void* weight, FloatType wtype, int64_t d, float eps, float* y) {
  __shared__ float red[32];
  pdl_enter();
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
    rope_kernel(float* x, int64_t pos0, const int64_t* step_pos, int n_heads, int head_dim, int half, RopeFreqs freqs) {
  if (step_pos) pos0 = *step_pos;  // written before the graph's replay, never by a kernel: read before the wait
  pdl_enter();
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

// launch_add then launch_rms_norm, one row per block; every element is added, stored and squared by the same
// thread, so aliasing sum with a or b is safe.
__global__ void __launch_bounds__(kRowThreads)
    add_rms_norm_kernel(const float* a, const float* b, float* sum, const void* weight, FloatType wtype, int64_t d,
                        float eps, float* y) {
  __shared__ float red[32];
  pdl_enter();
  const int64_t off = int64_t(blockIdx.x) * d;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < d; i += kRowThreads) {
    const float s = a[off + i] + b[off + i];
    sum[off + i] = s;
    ss = fmaf(s, s, ss);
  }
  ss = block_sum(ss, red);
  const float inv = 1.0f / sqrtf(ss / float(d) + eps);
  for (int64_t i = threadIdx.x; i < d; i += kRowThreads) y[off + i] = sum[off + i] * inv * load_float(weight, wtype, i);
}

// The decode attention prologue on one row (q or k of one token): RMSNorm over the whole row, then NeoX rotary of
// every head, written back in place (and to the cache row for k). The row and its norm weights are held in registers
// and shared memory, not re-read from global memory between the steps (each re-read is a memory round trip on the
// decode step's critical path); the norm weights are loaded before pdl_wait. Element e = threadIdx.x + j * blockDim.
constexpr int kRowPer = kQkNormPer;  // elements per thread: rows up to 4096 wide

// Preconditions: blockDim.x == kRowThreads; grid (n_tokens, 2); half > 0; widths <= kRowThreads * kRowPer.
__global__ void __launch_bounds__(kRowThreads)
    qk_norm_rope_store_kernel(float* q, float* k, const float* v, const void* q_norm, FloatType q_wtype,
                              const void* k_norm, FloatType k_wtype, float eps, int n_heads, int n_kv_heads,
                              int head_dim, int half, RopeFreqs freqs, int64_t pos0, const int64_t* step_pos,
                              int64_t capacity, float* kc, float* vc) {
  __shared__ float red[32];
  __shared__ float row[kRowThreads * kRowPer];
  const bool is_k = blockIdx.y == 1;
  const int heads = is_k ? n_kv_heads : n_heads;
  const int64_t width = int64_t(heads) * head_dim;
  const void* nw_ptr = is_k ? k_norm : q_norm;
  const FloatType nw_type = is_k ? k_wtype : q_wtype;
  float nw[kRowPer];
#pragma unroll
  for (int j = 0; j < kRowPer; ++j) {
    const int64_t e = threadIdx.x + int64_t(j) * kRowThreads;
    nw[j] = e < width ? load_float(nw_ptr, nw_type, e) : 0.0f;
  }
  if (step_pos) pos0 = *step_pos;  // written before the graph's replay, never by a kernel: read before the wait
  pdl_enter();
  const int64_t t = blockIdx.x;
  float* xr = (is_k ? k : q) + t * width;
  float xv[kRowPer];
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < kRowPer; ++j) {
    const int64_t e = threadIdx.x + int64_t(j) * kRowThreads;
    xv[j] = e < width ? xr[e] : 0.0f;
  }
#pragma unroll
  for (int j = 0; j < kRowPer; ++j) ss = fmaf(xv[j], xv[j], ss);  // the order rms_norm_kernel's threads use
  ss = block_sum(ss, red);
  const float inv = 1.0f / sqrtf(ss / float(width) + eps);
#pragma unroll
  for (int j = 0; j < kRowPer; ++j) {
    const int64_t e = threadIdx.x + int64_t(j) * kRowThreads;
    if (e < width) row[e] = xv[j] * inv * nw[j];
  }
  __syncthreads();
  const int64_t cache_row = pos0 + t;
  const bool store = is_k && cache_row >= 0 && cache_row < capacity;
  const float pos = float(pos0 + t);
#pragma unroll
  for (int j = 0; j < kRowPer; ++j) {
    const int64_t e = threadIdx.x + int64_t(j) * kRowThreads;
    if (e >= width) break;
    const int c = int(e % head_dim);
    const int64_t base = e - c;  // the head's first element
    const float out = c < 2 * half ? rope_value(row + base, c, half, pos, freqs) : row[e];
    xr[e] = out;
    if (store) {
      kc[cache_row * width + e] = out;
      vc[cache_row * width + e] = v[t * width + e];
    }
  }
}

}  // namespace

void launch_add_rms_norm(const Ctx& ctx, const float* a, const float* b, float* sum, const void* weight,
                         FloatType wtype, int64_t n_rows, int64_t d, float eps, float* y) {
  if (n_rows == 0 || d == 0) return;
  CUDA_REQUIRE(n_rows < (int64_t(1) << 31), "add_rms_norm: too many rows");
  launch_k(ctx, add_rms_norm_kernel, unsigned(n_rows), kRowThreads, 0, a, b, sum, weight, wtype, d, eps, y);
}

void launch_qk_norm_rope_store(const Ctx& ctx, float* q, float* k, const float* v, const void* q_norm,
                               FloatType q_wtype, const void* k_norm, FloatType k_wtype, float eps, int64_t n_tokens,
                               int n_heads, int n_kv_heads, int head_dim, int half, const RopeFreqs& freqs,
                               int64_t pos0, int64_t capacity, float* k_cache, float* v_cache) {
  if (n_tokens == 0) return;
  CUDA_REQUIRE(half > 0 && half <= kMaxRopeHalf && 2 * half <= head_dim, "qk_norm_rope_store: bad rotary dims");
  CUDA_REQUIRE(n_tokens <= 65535, "qk_norm_rope_store: too many tokens");
  CUDA_REQUIRE(int64_t(n_heads) * head_dim <= 4096 && int64_t(n_kv_heads) * head_dim <= 4096,
               "qk_norm_rope_store: q and k rows up to 4096 wide");
  const dim3 grid{unsigned(n_tokens), 2u};
  launch_k(ctx, qk_norm_rope_store_kernel, grid, kRowThreads, 0, q, k, v, q_norm, q_wtype, k_norm, k_wtype, eps,
           n_heads, n_kv_heads, head_dim, half, freqs, pos0, ctx.step_pos, capacity, k_cache, v_cache);
}

void launch_rms_norm(const Ctx& ctx, const float* x, const void* weight, FloatType wtype, int64_t n_rows, int64_t d,
                     float eps, float* y) {
  if (n_rows == 0 || d == 0) return;
  CUDA_REQUIRE(n_rows < (int64_t(1) << 31), "rms_norm: too many rows");
  launch_k(ctx, rms_norm_kernel, unsigned(n_rows), kThreads, 0, x, weight, wtype, d, eps, y);
}

void launch_rope(const Ctx& ctx, float* x, int64_t n_tokens, int64_t pos0, int n_heads, int head_dim, int half,
                 const RopeFreqs& freqs) {
  if (n_tokens == 0 || half == 0 || n_heads == 0) return;
  CUDA_REQUIRE(half > 0 && half <= kMaxRopeHalf && 2 * half <= head_dim, "rope: bad rotary dims");
  CUDA_REQUIRE(n_tokens < (int64_t(1) << 31), "rope: too many tokens");
  launch_k(ctx, rope_kernel, unsigned(n_tokens), kThreads, 0, x, pos0, ctx.step_pos, n_heads, head_dim, half, freqs);
}

}  // namespace moecel::cuda
