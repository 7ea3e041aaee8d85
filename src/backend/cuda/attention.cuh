// Causal attention over the KV cache with GQA and an optional sliding window (f32, online softmax).
// Used by: CudaBackend::attention (decode: attention.cu; prefill: attention_prefill.cu).
#pragma once
#include <cstdint>

#include "backend/cuda/cuda_common.cuh"

namespace moecel::cuda {

constexpr int kMaxHeadDim = 256;

// q (n_tokens, n_heads * head_dim); k_cache, v_cache (>= pos0 + n_tokens rows, n_kv_heads * head_dim);
// out (n_tokens, n_heads * head_dim). Token t (position pos0 + t) attends to cache rows [first, pos0 + t],
// first = window > 0 ? max(0, pos0 + t - window + 1) : 0; query head h reads kv head h / (n_heads / n_kv_heads).
void launch_attention(const Ctx& ctx, const float* q, const float* k_cache, const float* v_cache, int64_t pos0,
                      int64_t n_tokens, int n_heads, int n_kv_heads, int head_dim, float scale, int window, float* out);

// Internal (attention_prefill.cu): the same for n_tokens >= 2 in tiles of queries that share their key rows, where
// head_dim % 4 == 0 and head_dim <= 256; returns false, launching nothing, otherwise.
bool launch_attention_prefill(const Ctx& ctx, const float* q, const float* k_cache, const float* v_cache, int64_t pos0,
                              int64_t n_tokens, int n_heads, int n_kv_heads, int head_dim, float scale, int window,
                              float* out);

struct RopeFreqs;

// The decode attention block of one token with full-width q/k norms: launch_qk_norm_rope_store then
// launch_attention (bit for bit), in one launch of one block per query head; q and k are not written back.
struct QkNormRopeAttention {
  const float *q, *k, *v;  // (1, n_heads * head_dim), (1, kv width) x2
  const void *q_norm, *k_norm;
  FloatType q_wtype, k_wtype;
  float eps;
  int n_heads, n_kv_heads, head_dim, half;
  const RopeFreqs* freqs;
  int64_t pos0, capacity;  // pos0 from ctx.step_pos when set
  float *k_cache, *v_cache;
  float scale;
  int window;
  float* out;  // (1, n_heads * head_dim)
};
// Returns false, launching nothing, for shapes the kernel does not take (wider rows, head_dim > 256, no rotary).
bool launch_qk_norm_rope_attention(const Ctx& ctx, const QkNormRopeAttention& a);

}  // namespace moecel::cuda
