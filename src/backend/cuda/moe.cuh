// MoE pieces on the device: router softmax + top-k, the weighted sum of expert outputs, and GLU activations.
// Used by: CudaBackend::router_topk, moe_weighted_sum, glu (switch_glu's gather path).
#pragma once
#include <cstdint>

#include "backend/cuda/cuda_common.cuh"

namespace moecel::cuda {

constexpr int kMaxTopK = 64;
constexpr int kMaxRouterExperts = 8192;
constexpr int kWarpRouterExperts = 256;  // the one-warp top-k (warp_router_topk) takes up to this many

// logits (n_tokens, n_experts) -> indices (n_tokens, k), weights (n_tokens, k). topk_softmax: softmax over the
// k selected logits only (else softmax over all experts first, then top-k of the probabilities); renormalize:
// divide the k weights by their sum. Highest score first, the lower expert index wins a tie.
void launch_router_topk(const Ctx& ctx, const float* logits, int64_t n_tokens, int n_experts, int k, bool topk_softmax,
                        bool renormalize, int32_t* indices, float* weights);

// y (n_tokens, k, hidden), weights (n_tokens, k) -> out (n_tokens, hidden) = sum_j weights[t, j] * y[t, j].
void launch_moe_weighted_sum(const Ctx& ctx, const float* y, const float* weights, int64_t n_tokens, int64_t k,
                             int64_t hidden, float* out);

// out = act(gate) * up over n elements (out may alias either input). act: 0 SiLU, 1 GeLU (tanh), 2 ReLU^2.
enum class GluAct : int { kSiLU = 0, kGeLU = 1, kReLU2 = 2 };
void launch_glu(const Ctx& ctx, GluAct act, const float* gate, const float* up, int64_t n, float* out);

#ifdef __CUDACC__
// Router top-k pieces (launch_router_topk's semantics), shared by the one-warp selection below and the block
// kernel of moe.cu so that both give the same scores, order and weights.

// The scores of one token by one warp: lane + 32 i holds expert lane + 32 i (n_experts <= 32 * kPerLane); softmax
// over all experts in f32 unless topk_softmax (then the raw logits). `l` is read through L2 (__ldcg), so the last
// block of the kernel that wrote it may call this. Also stores them to ps[0..n_experts) (shared memory).
template <int kPerLane>
__device__ __forceinline__ void warp_router_scores(const float* l, int n_experts, bool topk_softmax,
                                                   float (&sc)[kPerLane], float* ps) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + 32 * i;
    sc[i] = e < n_experts ? __ldcg(l + e) : -INFINITY;
  }
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
    if (e < n_experts) ps[e] = sc[i];
  }
}

// Whether expert e2 (score u) ranks before expert e (score v): larger score first, the lower index on a tie, NaN
// after every number. An expert's rank is the number of experts ranked before it.
__device__ __forceinline__ int warp_router_rank_before(float u, int e2, float v, int e) {
  const bool u_nan = isnan(u);
  return isnan(v) ? (!u_nan || e2 < e) : (!u_nan && (u > v || (u == v && e2 < e)));
}

// The k selected scores (by rank) become the routing weights, by one thread: k <= 32 values, sequential, in the
// CPU backend's order.
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

// Router top-k of one token by one warp, for up to kWarpRouterExperts experts and k <= 32: each lane ranks its own
// experts against all others. Writes idx[0..k) and w[0..k); `ws` is kWarpRouterExperts floats of this warp's
// shared memory. kPerLane (experts per lane, n_experts <= 32 * kPerLane) is a template argument so that small
// routers run small code. One warp's dependent instructions are slow (~9 us per OLMoE layer as a kernel of its
// own): the standalone top-k uses the block kernel of moe.cu; this serves the router's last-block epilogue.
template <int kPerLane>
__device__ __forceinline__ void warp_router_topk_n(const float* l, int n_experts, int k, bool topk_softmax,
                                                   bool renormalize, int32_t* idx, float* w, float* ws) {
  const int lane = threadIdx.x & 31;
  float sc[kPerLane];
  warp_router_scores<kPerLane>(l, n_experts, topk_softmax, sc, ws);
  __syncwarp();
  int rank[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) rank[i] = kMaxTopK;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    if (32 * i >= n_experts) break;  // uniform over the warp
    const int e = lane + 32 * i;
    int r = 0;
#pragma unroll 4
    for (int e2 = 0; e2 < n_experts; ++e2) r += warp_router_rank_before(ws[e2], e2, sc[i], e);  // ws[e2]: broadcast
    if (e < n_experts) rank[i] = r;
  }
  __syncwarp();  // every lane has read the scores; ws now holds the selected weights by rank
#pragma unroll
  for (int i = 0; i < kPerLane; ++i)
    if (rank[i] < k) ws[rank[i]] = sc[i];
  __syncwarp();
  if (lane == 0) warp_router_weights(ws, k, topk_softmax, renormalize);
  __syncwarp();
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    if (rank[i] < k) {
      idx[rank[i]] = lane + 32 * i;
      w[rank[i]] = ws[rank[i]];
    }
  }
}

__device__ __forceinline__ void warp_router_topk(const float* l, int n_experts, int k, bool topk_softmax,
                                                 bool renormalize, int32_t* idx, float* w, float* ws) {
  if (n_experts <= 64) {
    warp_router_topk_n<2>(l, n_experts, k, topk_softmax, renormalize, idx, w, ws);
  } else if (n_experts <= 128) {
    warp_router_topk_n<4>(l, n_experts, k, topk_softmax, renormalize, idx, w, ws);
  } else {
    warp_router_topk_n<kWarpRouterExperts / 32>(l, n_experts, k, topk_softmax, renormalize, idx, w, ws);
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
#endif

}  // namespace moecel::cuda
