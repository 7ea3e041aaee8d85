// The router of a MoE block from the shares its preceding output projection computed (RouterShare, qmatmul.cuh):
// one block per token sums the parts in block order, applies the norm's one factor, writes xn and the logits and
// runs the block top-k. It replaces the router's own matrix-vector launch on the decode step's chain.
// Used by: CudaBackend::linear_residual_norm_router.
#include <cstdint>

#include "backend/cuda/moe.cuh"
#include "backend/cuda/qmatmul.cuh"

namespace moecel::cuda {
namespace {

constexpr int kYRegs = 8;   // y and norm values per thread held in registers: a 2048-wide row
constexpr int kBatch = 32;  // parts loaded at once per thread

// Preconditions (launch_router_reduce_topk): blockDim.x == kRankThreads; 1 <= n_experts <= 32 * kPerLane <= 256;
// 1 <= k <= min(n_experts, 32).
template <int kPerLane>
__global__ void __launch_bounds__(kRankThreads) router_reduce_topk_kernel(RouterReduce r) {
  __shared__ RouterRankSmem rank;
  __shared__ float red[32];
  __shared__ float sums[kRankThreads];
  __shared__ float logit[32 * kPerLane];
  const int64_t t = blockIdx.x, d = r.d;
  const int tid = threadIdx.x, n_e = r.n_experts;
  float nw[kYRegs];
#pragma unroll
  for (int j = 0; j < kYRegs; ++j) {
    const int64_t i = tid + int64_t(j) * kRankThreads;
    nw[j] = i < d ? load_float(r.norm_w, r.norm_type, i) : 0.0f;
  }
  pdl_enter();
  float y[kYRegs];  // loaded first: in flight with the parts
#pragma unroll
  for (int j = 0; j < kYRegs; ++j) {
    const int64_t i = tid + int64_t(j) * kRankThreads;
    y[j] = i < d ? r.y[t * d + i] : 0.0f;
  }
  float ss = 0.0f;
  for (int b = tid; b < r.blocks; b += kRankThreads) ss += r.sumsq[t * r.blocks + b];
  // Thread (q, e) sums blocks q, q + n_q, ... of expert e in order, its loads issued kBatch at a time (a warp's
  // loads are consecutive experts of one block: coalesced; OLMoE: 128 blocks, 32 per thread, one round trip); the
  // n_q sums are added in q order below.
  const int n_q = kRankThreads / n_e, e = tid % n_e, q = tid / n_e;
  const float* parts = r.parts + t * int64_t(r.blocks) * n_e + e;
  float s = 0.0f;
  if (q < n_q) {
    for (int b0 = q; b0 < r.blocks; b0 += kBatch * n_q) {
      float v[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int b = b0 + j * n_q;
        v[j] = b < r.blocks ? parts[int64_t(b) * n_e] : 0.0f;
      }
#pragma unroll
      for (int j = 0; j < kBatch; ++j) s += v[j];
    }
  }
  sums[tid] = s;
  ss = block_sum(ss, red);  // ends with the block synchronized: sums is complete
  const float inv = 1.0f / sqrtf(ss / float(d) + r.eps);
  if (tid < n_e) {
    float l = 0.0f;
    for (int j = 0; j < n_q; ++j) l += sums[j * n_e + tid];
    logit[tid] = l * inv;  // the top-k below reads them after its first barrier
    r.logits[t * n_e + tid] = l * inv;
  }
#pragma unroll
  for (int j = 0; j < kYRegs; ++j) {
    const int64_t i = tid + int64_t(j) * kRankThreads;
    if (i < d) r.xn[t * d + i] = y[j] * inv * nw[j];
  }
  for (int64_t i = tid + int64_t(kYRegs) * kRankThreads; i < d; i += kRankThreads) {
    r.xn[t * d + i] = r.y[t * d + i] * inv * load_float(r.norm_w, r.norm_type, i);
  }
  block_router_topk_n<kPerLane, true>(logit, n_e, r.k, r.topk_softmax, r.renormalize, r.indices + t * r.k,
                                      r.weights + t * r.k, rank);
}

}  // namespace

void launch_router_reduce_topk(const Ctx& ctx, const RouterReduce& r, int64_t n_tokens) {
  if (n_tokens == 0) return;
  CUDA_REQUIRE(r.n_experts >= 1 && r.n_experts <= kWarpRouterExperts && r.k >= 1 && r.k <= r.n_experts && r.k <= 32,
               "router_reduce_topk: 1 to 256 experts and k <= min(n_experts, 32)");
  CUDA_REQUIRE(r.blocks >= 1 && r.d >= 1 && n_tokens < (int64_t(1) << 31), "router_reduce_topk: bad shape");
  auto kernel = r.n_experts <= 64    ? router_reduce_topk_kernel<2>
                : r.n_experts <= 128 ? router_reduce_topk_kernel<4>
                                     : router_reduce_topk_kernel<kWarpRouterExperts / 32>;
  launch_k(ctx, kernel, unsigned(n_tokens), kRankThreads, 0, r);
}

}  // namespace moecel::cuda
