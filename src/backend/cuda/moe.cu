// Router top-k (one block per token: up to 256 experts, scores by one warp and ranks by all threads; beyond that
// softmax reductions, then k rounds of an argmax), the MoE weighted
// sum (slots summed in order 0..k-1, like the CPU backend) and the GLU activations (elementwise).
#include <algorithm>

#include "backend/cuda/moe.cuh"

namespace moecel::cuda {
namespace {

// Preconditions: one block per token; blockDim.x a multiple of 32, <= 1024; dynamic shared memory
// n_experts floats + n_experts bytes; 1 <= k <= min(n_experts, kMaxTopK).
__global__ void router_topk_kernel(const float* logits, int n_experts, int k, bool topk_softmax, bool renormalize,
                                   int32_t* indices, float* weights) {
  extern __shared__ float router_smem[];
  float* score = router_smem;
  unsigned char* taken = reinterpret_cast<unsigned char*>(router_smem + n_experts);
  __shared__ float red_v[32];
  __shared__ int red_i[32];
  __shared__ float sel_w[kMaxTopK];
  __shared__ int sel_i[kMaxTopK];
  const int64_t t = blockIdx.x;
  const float* l = logits + t * n_experts;
  for (int e = threadIdx.x; e < n_experts; e += blockDim.x) {
    score[e] = l[e];
    taken[e] = 0;
  }
  __syncthreads();
  if (!topk_softmax) {  // softmax over all experts in f32
    float mx = -INFINITY;
    for (int e = threadIdx.x; e < n_experts; e += blockDim.x) mx = fmaxf(mx, score[e]);
    mx = block_max(mx, red_v);
    float sum = 0.0f;
    for (int e = threadIdx.x; e < n_experts; e += blockDim.x) {
      const float v = expf(score[e] - mx);
      score[e] = v;
      sum += v;
    }
    sum = block_sum(sum, red_v);
    for (int e = threadIdx.x; e < n_experts; e += blockDim.x) score[e] /= sum;
    __syncthreads();
  }
  for (int j = 0; j < k; ++j) {
    float bv = 0.0f;
    int bi = -1;
    for (int e = threadIdx.x; e < n_experts; e += blockDim.x) {
      if (!taken[e] && !isnan(score[e]) && arg_better(score[e], e, bv, bi)) {
        bv = score[e];
        bi = e;
      }
    }
    block_argmax(bv, bi, red_v, red_i);
    if (threadIdx.x == 0) {
      if (bi < 0) {  // only NaN scores left (arg_better never picks them): take the lowest free index
        bi = 0;
        while (taken[bi]) ++bi;
        bv = score[bi];
      }
      taken[bi] = 1;
      sel_i[j] = bi;
      sel_w[j] = bv;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    warp_router_weights(sel_w, k, topk_softmax, renormalize);
    for (int j = 0; j < k; ++j) {
      indices[t * k + j] = sel_i[j];
      weights[t * k + j] = sel_w[j];
    }
  }
}

// One block per token (block_router_topk_n, moe.cuh), one kernel per expert-count class so that each holds only
// its own code. Preconditions: blockDim.x == kRankThreads; n_experts <= 32 * kPerLane; 1 <= k <= min(n_experts, 32).
template <int kPerLane>
__global__ void __launch_bounds__(kRankThreads)
    router_topk_rank_kernel(const float* logits, int n_experts, int k, bool topk_softmax, bool renormalize,
                            int32_t* indices, float* weights) {
  __shared__ RouterRankSmem sm;
  pdl_enter();
  const int64_t t = blockIdx.x;
  block_router_topk_n<kPerLane>(logits + t * n_experts, n_experts, k, topk_softmax, renormalize, indices + t * k,
                                weights + t * k, sm);
}

// Preconditions: grid-stride over n_tokens * hidden elements.
__global__ void moe_weighted_sum_kernel(const float* y, const float* weights, int64_t n_tokens, int64_t k,
                                        int64_t hidden, bool add, float* out, bool early) {
  if (early) pdl_trigger();  // Ctx::pdl_early
  pdl_enter();
  const int64_t n = n_tokens * hidden;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / hidden, d = i % hidden;
    float acc = 0.0f;
    for (int64_t j = 0; j < k; ++j) acc = fmaf(weights[t * k + j], y[(t * k + j) * hidden + d], acc);
    out[i] = add ? out[i] + acc : acc;  // add_kernel's residual + moe
  }
}

template <GluAct kAct>
__global__ void glu_kernel(const float* gate, const float* up, int64_t n, float* out) {
  pdl_enter();
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    out[i] = glu_value<kAct>(gate[i], up[i]);
  }
}

unsigned elementwise_blocks(const Ctx& ctx, int64_t n, int threads) {
  const int64_t want = (n + threads - 1) / threads;
  return unsigned(std::max<int64_t>(1, std::min<int64_t>(want, int64_t(std::max(ctx.sm_count, 1)) * 32)));
}

}  // namespace

void launch_router_topk(const Ctx& ctx, const float* logits, int64_t n_tokens, int n_experts, int k, bool topk_softmax,
                        bool renormalize, int32_t* indices, float* weights) {
  if (n_tokens == 0) return;
  CUDA_REQUIRE(n_experts >= 1 && n_experts <= kMaxRouterExperts, "router_topk: n_experts must be in [1, 8192]");
  CUDA_REQUIRE(k >= 1 && k <= n_experts && k <= kMaxTopK, "router_topk: k must be in [1, min(n_experts, 64)]");
  CUDA_REQUIRE(n_tokens < (int64_t(1) << 31), "router_topk: too many tokens");
  if (n_experts <= kWarpRouterExperts && k <= 32) {
    auto kernel = n_experts <= 64    ? router_topk_rank_kernel<2>
                  : n_experts <= 128 ? router_topk_rank_kernel<4>
                                     : router_topk_rank_kernel<kWarpRouterExperts / 32>;
    launch_k(ctx, kernel, unsigned(n_tokens), kRankThreads, 0, logits, n_experts, k, topk_softmax, renormalize, indices,
             weights);
    return;
  }
  const int threads = std::min(1024, (n_experts + 31) / 32 * 32);
  const size_t smem = size_t(n_experts) * (sizeof(float) + 1);
  router_topk_kernel<<<unsigned(n_tokens), threads, smem, ctx.stream>>>(logits, n_experts, k, topk_softmax, renormalize,
                                                                        indices, weights);
  CUDA_CHECK_LAUNCH();
}

void launch_moe_weighted_sum(const Ctx& ctx, const float* y, const float* weights, int64_t n_tokens, int64_t k,
                             int64_t hidden, bool add, float* out) {
  const int64_t n = n_tokens * hidden;
  if (n == 0) return;
  // Launched with PDL like the decode kernels around it (the gather path's decode step).
  launch_k(ctx, moe_weighted_sum_kernel, elementwise_blocks(ctx, n, 256), 256, 0, y, weights, n_tokens, k, hidden, add,
           out, (ctx.pdl_early & 2) != 0);
}

void launch_glu(const Ctx& ctx, GluAct act, const float* gate, const float* up, int64_t n, float* out) {
  if (n == 0) return;
  const unsigned blocks = elementwise_blocks(ctx, n, 256);
  switch (act) {
    case GluAct::kSiLU: launch_k(ctx, glu_kernel<GluAct::kSiLU>, blocks, 256, 0, gate, up, n, out); break;
    case GluAct::kGeLU: launch_k(ctx, glu_kernel<GluAct::kGeLU>, blocks, 256, 0, gate, up, n, out); break;
    case GluAct::kReLU2: launch_k(ctx, glu_kernel<GluAct::kReLU2>, blocks, 256, 0, gate, up, n, out); break;
  }
}

}  // namespace moecel::cuda
