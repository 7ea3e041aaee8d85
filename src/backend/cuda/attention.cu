// Attention: one block of W warps per (head, token) (W = 16 for decode, 4 for prefill). Warp w takes cache rows
// first + w, first + w + W, ...;
// each lane holds head_dim / 32 dims (lane + 32 j: coalesced rows), the warp reduces q . k with shuffles and
// keeps its own online-softmax state (max, sum, weighted V); the W states are merged through shared memory.
// Decode uses it; prefill takes the tiled kernel (attention_prefill.cu) and falls back to this one (grid.y = tokens)
// for head sizes that kernel does not take. Split-K for long contexts is a later step.
#include "backend/cuda/attention.cuh"

namespace moecel::cuda {
namespace {

// Decode has one block per head only: 16 warps each walk a sixteenth of the cache rows, so the chain of dependent
// row loads per warp stays short. Prefill has a block per (head, token) and keeps 4.
constexpr int kDecodeWarps = 16;
constexpr int kPrefillWarps = 4;

// Preconditions: blockDim.x == 32 * kWarps; grid (n_heads, n_tokens); head_dim <= 32 * VPL <= kMaxHeadDim;
// n_heads % n_kv_heads == 0; cache rows [0, pos0 + n_tokens) exist.
template <int VPL, int kWarps>
__global__ void __launch_bounds__(kWarps * 32)
    attention_kernel(const float* q, const float* kc, const float* vc, int64_t pos0, const int64_t* step_pos,
                     int n_heads, int n_kv_heads, int head_dim, float scale, int window, float* out) {
  constexpr int kThreads = kWarps * 32;
  if (step_pos) pos0 = *step_pos;  // written before the graph's replay, never by a kernel: read before the wait
  pdl_enter();
  __shared__ float s_m[kWarps], s_l[kWarps];
  __shared__ float s_acc[kWarps][kMaxHeadDim];
  const int h = blockIdx.x;
  const int64_t t = blockIdx.y;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t q_width = int64_t(n_heads) * head_dim, kv_width = int64_t(n_kv_heads) * head_dim;
  const int64_t kv_off = int64_t(h / (n_heads / n_kv_heads)) * head_dim;
  const int64_t last = pos0 + t;
  const int64_t first = window > 0 ? max(int64_t(0), last - window + 1) : 0;

  float qv[VPL], acc[VPL];
  const float* qr = q + t * q_width + int64_t(h) * head_dim;
#pragma unroll
  for (int j = 0; j < VPL; ++j) {
    const int d = lane + 32 * j;
    qv[j] = d < head_dim ? qr[d] : 0.0f;
    acc[j] = 0.0f;
  }
  // A warp's rows are taken kBatch at a time, their K and V loads all issued before any is used: row by row, each
  // row's loads waited for the previous row's softmax step, a chain of memory round trips that made decode
  // attention ~6 us of each OLMoE layer. The rows are still folded in the same order (same results).
  constexpr int kBatch = 4;
  float m = -INFINITY, l = 0.0f;
  for (int64_t p0 = first + warp; p0 <= last; p0 += int64_t(kWarps) * kBatch) {
    float kv[kBatch][VPL], vv[kBatch][VPL];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int64_t p = p0 + int64_t(b) * kWarps;
      const float* kr = kc + p * kv_width + kv_off;
      const float* vr = vc + p * kv_width + kv_off;
#pragma unroll
      for (int j = 0; j < VPL; ++j) {
        const int d = lane + 32 * j;
        const bool ok = p <= last && d < head_dim;
        kv[b][j] = ok ? kr[d] : 0.0f;
        vv[b][j] = ok ? vr[d] : 0.0f;
      }
    }
    float sb[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      float dot = 0.0f;
#pragma unroll
      for (int j = 0; j < VPL; ++j) {
        const int d = lane + 32 * j;
        if (d < head_dim) dot = fmaf(qv[j], kv[b][j], dot);
      }
      sb[b] = warp_sum(dot) * scale;
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      if (p0 + int64_t(b) * kWarps > last) break;  // uniform over the warp
      const float s = sb[b];
      const float m_new = fmaxf(m, s);
      const float corr = m == -INFINITY ? 0.0f : expf(m - m_new);  // rescales the old state to the new max
      const float pw = expf(s - m_new);
      l = l * corr + pw;
#pragma unroll
      for (int j = 0; j < VPL; ++j) acc[j] = fmaf(pw, vv[b][j], acc[j] * corr);
      m = m_new;
    }
  }
  if (lane == 0) {
    s_m[warp] = m;
    s_l[warp] = l;
  }
#pragma unroll
  for (int j = 0; j < VPL; ++j) {
    const int d = lane + 32 * j;
    if (d < head_dim) s_acc[warp][d] = acc[j];
  }
  __syncthreads();
  // Merge: the global max is finite (row `last` is always attended); a warp that saw no row has m = -inf, l = 0.
  float mx = -INFINITY;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, s_m[w]);
  float wgt[kWarps], sum = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    wgt[w] = s_m[w] == -INFINITY ? 0.0f : expf(s_m[w] - mx);
    sum = fmaf(s_l[w], wgt[w], sum);
  }
  const float inv = 1.0f / sum;
  float* o = out + t * q_width + int64_t(h) * head_dim;
  for (int d = threadIdx.x; d < head_dim; d += kThreads) {
    float v = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) v = fmaf(s_acc[w][d], wgt[w], v);
    o[d] = v * inv;
  }
}

template <int VPL>
void launch_vpl(const Ctx& ctx, dim3 grid, const float* q, const float* kc, const float* vc, int64_t pos0, int n_heads,
                int n_kv_heads, int head_dim, float scale, int window, float* out) {
  if (grid.y == 1) {
    launch_k(ctx, attention_kernel<VPL, kDecodeWarps>, grid, kDecodeWarps * 32, 0, q, kc, vc, pos0, ctx.step_pos,
             n_heads, n_kv_heads, head_dim, scale, window, out);
  } else {
    launch_k(ctx, attention_kernel<VPL, kPrefillWarps>, grid, kPrefillWarps * 32, 0, q, kc, vc, pos0, ctx.step_pos,
             n_heads, n_kv_heads, head_dim, scale, window, out);
  }
}

}  // namespace

void launch_attention(const Ctx& ctx, const float* q, const float* k_cache, const float* v_cache, int64_t pos0,
                      int64_t n_tokens, int n_heads, int n_kv_heads, int head_dim, float scale, int window,
                      float* out) {
  if (n_tokens == 0 || n_heads == 0) return;
  CUDA_REQUIRE(head_dim > 0 && head_dim <= kMaxHeadDim, "attention: head_dim must be in [1, 256]");
  CUDA_REQUIRE(n_kv_heads > 0 && n_heads % n_kv_heads == 0, "attention: n_heads must be a multiple of n_kv_heads");
  CUDA_REQUIRE(pos0 >= 0 && n_tokens <= 65535, "attention: bad pos0 / token count");
  if (launch_attention_prefill(ctx, q, k_cache, v_cache, pos0, n_tokens, n_heads, n_kv_heads, head_dim, scale, window,
                               out)) {
    return;
  }
  const dim3 grid{unsigned(n_heads), unsigned(n_tokens)};
  switch ((head_dim + 31) / 32) {
#define MOECEL_ATTN_CASE(V) \
  case V: launch_vpl<V>(ctx, grid, q, k_cache, v_cache, pos0, n_heads, n_kv_heads, head_dim, scale, window, out); break;
    MOECEL_ATTN_CASE(1)
    MOECEL_ATTN_CASE(2)
    MOECEL_ATTN_CASE(3)
    MOECEL_ATTN_CASE(4)
    MOECEL_ATTN_CASE(5)
    MOECEL_ATTN_CASE(6)
    MOECEL_ATTN_CASE(7)
    MOECEL_ATTN_CASE(8)
#undef MOECEL_ATTN_CASE
  }
}

}  // namespace moecel::cuda
