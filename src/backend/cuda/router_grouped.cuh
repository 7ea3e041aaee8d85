// Grouped sigmoid routing with a selection-only correction bias on the device (dots1, DeepSeek-V3's "noaux_tc").
// The CPU spec is CpuBackend::router_grouped_topk (cpu/bias_router_ops.cpp).
// Used by: CudaBackend::router_grouped_topk.
#pragma once
#include <cstdint>

#include "backend/cuda/cuda_common.cuh"

namespace moecel::cuda {

constexpr int kMaxGroupedExperts = 8192;  // the choice scores and taken flags live in shared memory
constexpr int kMaxGroupedTopK = 64;
constexpr int kMaxGroups = 1024;

// logits (n_tokens, n_experts), bias (n_experts,) of type bias_type -> indices, weights (n_tokens, k):
// s = sigmoid(logit), c = s + bias; groups of n_experts / n_group experts scored by the sum of their two largest c,
// the topk_group best kept (all when topk_group >= n_group); the k largest c of kept experts, highest first, the
// lower index winning ties (NaN ranks as -inf); weights = s, / (sum + 1e-20) when renormalize, then * scale.
// Preconditions (checked): n_experts <= kMaxGroupedExperts, n_group <= kMaxGroups, n_experts % n_group == 0,
// 1 <= k <= min(kMaxGroupedTopK, kept experts).
void launch_router_grouped_topk(const Ctx& ctx, const float* logits, const void* bias, FloatType bias_type,
                                int64_t n_tokens, int n_experts, int n_group, int topk_group, int k, bool renormalize,
                                float scale, int32_t* indices, float* weights);

}  // namespace moecel::cuda
