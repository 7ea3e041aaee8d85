// MoE pieces on the device: router softmax + top-k, the weighted sum of expert outputs, and GLU activations.
// Used by: CudaBackend::router_topk, moe_weighted_sum, glu (switch_glu's gather path).
#pragma once
#include <cstdint>

#include "backend/cuda/cuda_common.cuh"

namespace moecel::cuda {

constexpr int kMaxTopK = 64;
constexpr int kMaxRouterExperts = 8192;
constexpr int kWarpRouterExperts = 256;  // the block top-k (block_router_topk) takes up to this many

// logits (n_tokens, n_experts) -> indices (n_tokens, k), weights (n_tokens, k). topk_softmax: softmax over the
// k selected logits only (else softmax over all experts first, then top-k of the probabilities); renormalize:
// divide the k weights by their sum. Highest score first, the lower expert index wins a tie.
void launch_router_topk(const Ctx& ctx, const float* logits, int64_t n_tokens, int n_experts, int k, bool topk_softmax,
                        bool renormalize, int32_t* indices, float* weights);

// y (n_tokens, k, hidden), weights (n_tokens, k) -> out (n_tokens, hidden) = sum_j weights[t, j] * y[t, j]; with
// add, out += that sum instead (one rounding of the sum, then the add).
void launch_moe_weighted_sum(const Ctx& ctx, const float* y, const float* weights, int64_t n_tokens, int64_t k,
                             int64_t hidden, bool add, float* out);

// out = act(gate) * up over n elements (out may alias either input). act: 0 SiLU, 1 GeLU (tanh), 2 ReLU^2.
enum class GluAct : int { kSiLU = 0, kGeLU = 1, kReLU2 = 2 };
void launch_glu(const Ctx& ctx, GluAct act, const float* gate, const float* up, int64_t n, float* out);

#ifdef __CUDACC__
// Router top-k pieces (launch_router_topk's semantics) for block_router_topk below.

// A score's rank key: a larger key ranks first (NaN below every number, -0 equal to +0); equal keys rank the lower
// expert index first. router_score inverts it, and the weights come from it: it changes only -0 (to +0: a raw logit
// with top-k softmax, which takes exp(score - max) of it) and a NaN's payload.
__device__ __forceinline__ uint32_t router_key(float v) {
  const uint32_t u = __float_as_uint(v + 0.0f);  // -0 + 0 = +0
  return isnan(v) ? 0u : (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float router_score(uint32_t key) {
  return key == 0u ? __int_as_float(0x7fc00000) : __uint_as_float((key & 0x80000000u) ? key & 0x7fffffffu : ~key);
}

// warp_router_scores on logits already in registers (sc[i]: expert lane + 32 i, -inf past n_experts).
template <int kPerLane>
__device__ __forceinline__ void warp_router_scores_regs(int n_experts, bool topk_softmax, float (&sc)[kPerLane],
                                                        uint32_t* keys) {
  const int lane = threadIdx.x & 31;
  if (!topk_softmax) {
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) mx = fmaxf(mx, sc[i]);
    mx = warp_max(mx);
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int e = lane + 32 * i;
      sc[i] = e < n_experts ? expf(sc[i] - mx) : 0.0f;
      sum += sc[i];
    }
    sum = warp_sum(sum);
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) sc[i] /= sum;
  }
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + 32 * i;
    if (e < n_experts) keys[e] = router_key(sc[i]);
  }
}

// The scores of one token by one warp: lane + 32 i holds expert lane + 32 i (n_experts <= 32 * kPerLane); softmax
// over all experts in f32 unless topk_softmax (then the raw logits). `l` is read through L2 (__ldcg), so the last
// block of the kernel that wrote it may call this. Also stores their rank keys (router_key) to keys[0..n_experts)
// (shared memory).
template <int kPerLane>
__device__ __forceinline__ void warp_router_scores(const float* l, int n_experts, bool topk_softmax,
                                                   float (&sc)[kPerLane], uint32_t* keys) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + 32 * i;
    sc[i] = e < n_experts ? __ldcg(l + e) : -INFINITY;
  }
  warp_router_scores_regs<kPerLane>(n_experts, topk_softmax, sc, keys);
}

// The k selected scores (by rank) become the routing weights, by one thread: k values, sequential, in the CPU
// backend's order.
__device__ __forceinline__ void warp_router_weights(float* ws, int k, bool topk_softmax, bool renormalize) {
  if (topk_softmax) {
    const float mx = ws[0];
    float sum = 0.0f;
    for (int j = 0; j < k; ++j) sum += (ws[j] = expf(ws[j] - mx));
    for (int j = 0; j < k; ++j) ws[j] /= sum;
  }
  if (renormalize) {
    float sum = 0.0f;
    for (int j = 0; j < k; ++j) sum += ws[j];
    for (int j = 0; j < k; ++j) ws[j] /= sum;
  }
}

constexpr int kRankThreads = 256;  // block_router_topk's block size

// Shared memory of block_router_topk.
struct RouterRankSmem {
  uint32_t key[kWarpRouterExperts];  // router_key of each expert's score
  float sel_w[32];
  int sel_i[32];
};

// block_router_topk_n's ranking and writes, once sm.key holds every expert's key and the block is synchronized.
template <int kPerLane>
__device__ __forceinline__ void block_router_rank(int n_experts, int k, bool topk_softmax, bool renormalize,
                                                  int32_t* idx, float* w, RouterRankSmem& sm) {
  constexpr int kG = kRankThreads / (32 * kPerLane);  // threads per expert
  const int e = threadIdx.x / kG, part = threadIdx.x % kG;
  const uint32_t mine = e < n_experts ? sm.key[e] : 0u;
  const float v = router_score(mine);
  int r = 0;
  if (e < n_experts) {
    for (int e2 = part; e2 < n_experts; e2 += kG) {
      const uint32_t o = sm.key[e2];
      r += o > mine || (o == mine && e2 < e);
    }
  }
#pragma unroll
  for (int o = 1; o < kG; o <<= 1) r += __shfl_xor_sync(0xffffffffu, r, o);
  if (!topk_softmax && !renormalize) {  // the selected scores are the weights: written by the ranking threads
    if (part == 0 && e < n_experts && r < k) {
      idx[r] = e;
      w[r] = v;
    }
    return;
  }
  if (part == 0 && e < n_experts && r < k) {
    sm.sel_i[r] = e;
    sm.sel_w[r] = v;
  }
  __syncthreads();
  if (threadIdx.x == 0) warp_router_weights(sm.sel_w, k, topk_softmax, renormalize);
  __syncthreads();
  if (threadIdx.x < k) {
    idx[threadIdx.x] = sm.sel_i[threadIdx.x];
    w[threadIdx.x] = sm.sel_w[threadIdx.x];
  }
}

// Router top-k of one token by a kRankThreads-thread block, up to 32 * kPerLane <= 256 experts and k <= 32: warp 0
// computes the scores (warp_router_scores); then every thread ranks its expert against a share of the others
// (kRankThreads / (32 * kPerLane) threads per expert, partial counts added by shuffles), so OLMoE's 64 x 64
// comparisons take 16 steps per thread instead of 128 in one warp (the one-warp version cost ~9 us of each decode
// layer as a kernel of its own: one warp's dependent instructions, not the work). Every thread of the block calls
// it; it starts with a barrier and ends with one unless the selected scores are the weights (no softmax over the
// selected, no renormalization), which the ranking threads then write themselves.
template <int kPerLane>
__device__ __forceinline__ void block_router_topk_n(const float* l, int n_experts, int k, bool topk_softmax,
                                                    bool renormalize, int32_t* idx, float* w, RouterRankSmem& sm) {
  __syncthreads();  // sm may still be read by a previous call
  if (threadIdx.x < 32) {
    float sc[kPerLane];
    warp_router_scores<kPerLane>(l, n_experts, topk_softmax, sc, sm.key);
  }
  __syncthreads();
  block_router_rank<kPerLane>(n_experts, k, topk_softmax, renormalize, idx, w, sm);
}

__device__ __forceinline__ void block_router_topk(const float* l, int n_experts, int k, bool topk_softmax,
                                                  bool renormalize, int32_t* idx, float* w, RouterRankSmem& sm) {
  if (n_experts <= 64) {
    block_router_topk_n<2>(l, n_experts, k, topk_softmax, renormalize, idx, w, sm);
  } else if (n_experts <= 128) {
    block_router_topk_n<4>(l, n_experts, k, topk_softmax, renormalize, idx, w, sm);
  } else {
    block_router_topk_n<kWarpRouterExperts / 32>(l, n_experts, k, topk_softmax, renormalize, idx, w, sm);
  }
}

// act(g) * u, the one definition the gather path's glu kernel and the fused path both use.
template <GluAct kAct>
__device__ __forceinline__ float glu_value(float g, float u) {
  float a;
  if constexpr (kAct == GluAct::kSiLU) {
    a = g / (1.0f + expf(-g));
  } else if constexpr (kAct == GluAct::kGeLU) {  // tanh approximation (gelu_pytorch_tanh)
    a = 0.5f * g * (1.0f + tanhf(0.7978845608f * (g + 0.044715f * g * g * g)));
  } else {
    a = g > 0.0f ? g * g : 0.0f;
  }
  return a * u;
}

__device__ __forceinline__ float glu_value_of(GluAct act, float g, float u) {
  switch (act) {
    case GluAct::kSiLU: return glu_value<GluAct::kSiLU>(g, u);
    case GluAct::kGeLU: return glu_value<GluAct::kGeLU>(g, u);
    default: return glu_value<GluAct::kReLU2>(g, u);
  }
}
#endif

}  // namespace moecel::cuda
