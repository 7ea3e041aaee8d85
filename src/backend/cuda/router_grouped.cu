// Grouped sigmoid routing: one block per token. Choice scores go to shared memory, one thread per group sums the
// group's top two, thread 0 keeps the best groups (topk_group of at most kMaxGroups, sequential), then k rounds of a
// block argmax pick the experts, and thread 0 writes the weights in the CPU backend's order.
#include <algorithm>

#include "backend/cuda/router_grouped.cuh"

namespace moecel::cuda {
namespace {

__device__ __forceinline__ float sigmoid(float x) {
  return 1.0f / (1.0f + expf(-x));
}

// Preconditions: one block per token; blockDim.x a multiple of 32, <= 1024; dynamic shared memory
// (n_experts + n_group) floats + (n_experts + n_group) bytes; the launcher's checks on n_experts, n_group and k.
__global__ void router_grouped_topk_kernel(const float* logits, const void* bias, FloatType bias_type, int n_experts,
                                           int n_group, int topk_group, int k, bool renormalize, float scale,
                                           int32_t* indices, float* weights) {
  extern __shared__ float grouped_smem[];
  float* choice = grouped_smem;  // (n_experts,): s + bias, NaN as -inf, dropped groups -inf
  float* group_score = choice + n_experts;
  unsigned char* taken = reinterpret_cast<unsigned char*>(group_score + n_group);
  unsigned char* group_kept = taken + n_experts;
  __shared__ float red_v[32];
  __shared__ int red_i[32];
  __shared__ int sel[kMaxGroupedTopK];
  const int64_t t = blockIdx.x;
  const float* l = logits + t * n_experts;
  for (int e = threadIdx.x; e < n_experts; e += blockDim.x) {
    const float c = sigmoid(l[e]) + load_float(bias, bias_type, e);
    choice[e] = isnan(c) ? -INFINITY : c;
    taken[e] = 0;
  }
  __syncthreads();
  if (topk_group < n_group) {
    const int group_size = n_experts / n_group;
    for (int g = threadIdx.x; g < n_group; g += blockDim.x) {  // the sum of the group's two largest choice scores
      float a = -INFINITY, b = -INFINITY;
      for (int i = 0; i < group_size; ++i) {
        const float v = choice[g * group_size + i];
        if (v > a) {
          b = a;
          a = v;
        } else if (v > b) {
          b = v;
        }
      }
      group_score[g] = group_size >= 2 ? a + b : a;
      group_kept[g] = 0;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int j = 0; j < topk_group; ++j) {
        int best = -1;
        float best_v = -INFINITY;
        for (int g = 0; g < n_group; ++g) {
          const float v = isnan(group_score[g]) ? -INFINITY : group_score[g];
          if (!group_kept[g] && (best < 0 || v > best_v)) {
            best = g;
            best_v = v;
          }
        }
        group_kept[best] = 1;
      }
    }
    __syncthreads();
    for (int e = threadIdx.x; e < n_experts; e += blockDim.x) {
      if (!group_kept[e / group_size]) choice[e] = -INFINITY;
    }
    __syncthreads();
  }
  for (int j = 0; j < k; ++j) {
    float bv = 0.0f;
    int bi = -1;
    for (int e = threadIdx.x; e < n_experts; e += blockDim.x) {
      if (!taken[e] && arg_better(choice[e], e, bv, bi)) {
        bv = choice[e];
        bi = e;
      }
    }
    block_argmax(bv, bi, red_v, red_i);
    if (threadIdx.x == 0) {  // bi >= 0: k <= n_experts and no NaN is left in `choice`
      taken[bi] = 1;
      sel[j] = bi;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {  // k <= 64 values: sequential, in the CPU backend's order
    float w[kMaxGroupedTopK];
    float sum = 0.0f;
    for (int j = 0; j < k; ++j) sum += (w[j] = sigmoid(l[sel[j]]));
    for (int j = 0; j < k; ++j) {
      if (renormalize) w[j] /= sum + 1e-20f;
      indices[t * k + j] = sel[j];
      weights[t * k + j] = w[j] * scale;
    }
  }
}

}  // namespace

void launch_router_grouped_topk(const Ctx& ctx, const float* logits, const void* bias, FloatType bias_type,
                                int64_t n_tokens, int n_experts, int n_group, int topk_group, int k, bool renormalize,
                                float scale, int32_t* indices, float* weights) {
  if (n_tokens == 0) return;
  CUDA_REQUIRE(n_experts >= 1 && n_experts <= kMaxGroupedExperts,
               "router_grouped_topk: n_experts must be in [1, 8192]");
  CUDA_REQUIRE(n_group >= 1 && n_group <= kMaxGroups && n_experts % n_group == 0,
               "router_grouped_topk: n_group must divide n_experts and be at most 1024");
  CUDA_REQUIRE(topk_group >= 1, "router_grouped_topk: topk_group must be at least 1");
  const int kept = std::min(topk_group, n_group) * (n_experts / n_group);
  CUDA_REQUIRE(k >= 1 && k <= kept && k <= kMaxGroupedTopK, "router_grouped_topk: k must be in [1, min(kept, 64)]");
  CUDA_REQUIRE(n_tokens < (int64_t(1) << 31), "router_grouped_topk: too many tokens");
  const int threads = std::min(1024, (n_experts + 31) / 32 * 32);
  const size_t smem = size_t(n_experts + n_group) * (sizeof(float) + 1);
  router_grouped_topk_kernel<<<unsigned(n_tokens), threads, smem, ctx.stream>>>(
      logits, bias, bias_type, n_experts, n_group, topk_group, k, renormalize, scale, indices, weights);
  CUDA_CHECK_LAUNCH();
}

}  // namespace moecel::cuda
