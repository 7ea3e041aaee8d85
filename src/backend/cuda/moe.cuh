// MoE pieces on the device: router softmax + top-k, the weighted sum of expert outputs, and GLU activations.
// Used by: CudaBackend::router_topk, moe_weighted_sum, glu (switch_glu's gather path).
#pragma once
#include <cstdint>

#include "backend/cuda/cuda_common.cuh"

namespace moecel::cuda {

constexpr int kMaxTopK = 64;
constexpr int kMaxRouterExperts = 8192;

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
