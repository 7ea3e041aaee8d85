// The router inside kernels A and B (FusedMoeArgs::route, fused_moe.cuh): kernel A's blocks read the o projection's
// fixed-point router sums, rank them and stage x; block (0, 0) publishes the routing; kernel B's blocks poll it.
// Internal to fused_moe_bulk_mma.cu.
#pragma once
#include <cstdint>

#include "backend/cuda/fused_moe_bulk.cuh"
#include "backend/cuda/gemv_mma.cuh"

namespace moecel::cuda::bulk {

struct RouteSmem {
  unsigned long long key[kRouteMaxExperts];  // larger ranks first: a sum's bits with the sign flipped, or router_key
  float score[kRouteMaxExperts];             // block (0, 0): the scores the weights come from
  uint32_t key32[kRouteMaxExperts];          // warp_router_scores_regs's keys (unused here)
  int sel[kMaxSlots];                        // the expert of each slot
  float sel_w[kMaxSlots];
  float red[32];
  int flagged;
};

__device__ __forceinline__ unsigned long long ld_relaxed_u64(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_relaxed_u64(unsigned long long* p, unsigned long long v) {
  asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// After kernel A's wait, every thread: the words into rs.key (and the flag into rs.flagged), and y's octet
// o = threadIdx.x into yv (zeros past hidden). Ends with the block synchronized.
__device__ __forceinline__ void route_load(const FusedRoute& r, int64_t hidden, float (&yv)[8], RouteSmem& rs) {
  const int tid = threadIdx.x, n_e = r.n_experts;
  const unsigned long long w = tid <= n_e ? __ldcg(r.words + tid) : 0ull;
#pragma unroll
  for (int i = 0; i < 8; ++i) yv[i] = 0.0f;
  if (tid < hidden / 8) load8_global(r.y + tid * 8, true, yv);
  if (tid < n_e) rs.key[tid] = w ^ (1ull << 63);  // signed order as unsigned
  if (tid == n_e) rs.flagged = w != 0ull;
  __syncthreads();
}

// rms_norm's factor over all of y (yv: route_load's octet; the octets past kThreads loaded here). Every thread calls
// it; ends with the block synchronized.
__device__ __forceinline__ float route_inv(const FusedRoute& r, int64_t hidden, const float (&yv)[8], RouteSmem& rs) {
  float ss = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) ss = fmaf(yv[i], yv[i], ss);
  for (int64_t o = threadIdx.x + kThreads; o < hidden / 8; o += kThreads) {
    float v[8];
    load8_global(r.y + o * 8, true, v);
#pragma unroll
    for (int i = 0; i < 8; ++i) ss = fmaf(v[i], v[i], ss);
  }
  ss = block_sum(ss, rs.red);
  return 1.0f / sqrtf(ss / float(hidden) + r.eps);
}

// A raised flag (uniform over the block): the logits from the float parts, summed in block order, ranked by their
// router_key (NaN after every number). Ends with the block synchronized.
__device__ __forceinline__ void route_fallback(const FusedRoute& r, float inv, RouteSmem& rs) {
  const int e = threadIdx.x;
  if (e < r.n_experts) {
    float l = 0.0f;
    for (int b = 0; b < r.blocks; ++b) l += __ldcg(r.parts + int64_t(b) * r.n_experts + e);
    l *= inv;
    rs.score[e] = l;
    rs.key[e] = router_key(l);
  }
  __syncthreads();
}

// Each expert's rank by four threads (OLMoE's 64 x 64 comparisons in 16 steps each); rs.sel[slot] for the k first.
// Ends with the block synchronized.
__device__ __forceinline__ void route_rank(int n_e, int k, RouteSmem& rs) {
  constexpr int kG = kThreads / kRouteMaxExperts;
  const int e = threadIdx.x / kG, part = threadIdx.x % kG;
  const unsigned long long mine = e < n_e ? rs.key[e] : 0ull;
  int rank = 0;
  if (e < n_e) {
    for (int e2 = part; e2 < n_e; e2 += kG) {
      const unsigned long long o = rs.key[e2];
      rank += o > mine || (o == mine && e2 < e);
    }
  }
#pragma unroll
  for (int o = 1; o < kG; o <<= 1) rank += __shfl_xor_sync(0xffffffffu, rank, o);
  if (part == 0 && e < n_e && rank < k) rs.sel[rank] = e;
  __syncthreads();
}

// Block (0, 0), warp 0 (no block barrier): the scores (softmax over all experts unless topk_softmax), the weights of
// the selected (warp_router_weights), then indices, weights and each slot's word.
__device__ __forceinline__ void route_publish(const FusedRoute& r, int k, float inv, int32_t* indices, float* weights,
                                              RouteSmem& rs) {
  const int lane = threadIdx.x;
  constexpr int kPerLane = kRouteMaxExperts / 32;
  float sc[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + 32 * i;
    const float fixed = float(static_cast<long long>(rs.key[e < r.n_experts ? e : 0] ^ (1ull << 63))) * 0x1p-32f;
    sc[i] = e >= r.n_experts ? -INFINITY : rs.flagged ? rs.score[e] : fixed * inv;
  }
  warp_router_scores_regs<kPerLane>(r.n_experts, r.topk_softmax, sc, rs.key32);
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    if (lane + 32 * i < r.n_experts) rs.score[lane + 32 * i] = sc[i];
  }
  __syncwarp();
  if (lane == 0) {
    for (int j = 0; j < k; ++j) rs.sel_w[j] = rs.score[rs.sel[j]];
    warp_router_weights(rs.sel_w, k, r.topk_softmax, r.renormalize);
  }
  __syncwarp();
  if (lane < k) {
    const int e = rs.sel[lane];
    const float w = rs.sel_w[lane];
    indices[lane] = e;
    weights[lane] = w;
    st_relaxed_u64(r.slots + lane, (static_cast<unsigned long long>(__float_as_uint(w)) << 32) | unsigned(e));
  }
}

// Kernel B, one thread per block, before its wait: the k slots once all are published (kernel A's block (0, 0) writes
// them after its ranking; a pause between polls, since a thousand threads spinning on one line slow its L2 slice and
// with it the whole GPU: docs/benchmarks.md, forty-ninth session). A slot still empty after ~2^22 polls (a second or
// more: kernel A cannot have run) becomes expert -1, which kernel B reports as a bad expert index with a NaN output
// instead of hanging.
__device__ __forceinline__ void route_poll(const FusedRoute& r, int k, int32_t* experts, float* weights) {
  constexpr int kMaxPolls = 1 << 22;
  for (int sl = 0, polls = 0; sl < k;) {
    const unsigned long long v = ld_relaxed_u64(r.slots + sl);
    if (uint32_t(v) == uint32_t(kRouteSlotEmpty) && ++polls < kMaxPolls) {
      __nanosleep(256);
      continue;
    }
    experts[sl] = int32_t(uint32_t(v));
    weights[sl] = __uint_as_float(uint32_t(v >> 32));
    ++sl;
  }
}

}  // namespace moecel::cuda::bulk
