// The CPU fused single-token decode-MoE path: the same structure as the CUDA kernels (one parallel pass over
// the selected experts' gate/up rows with the activation, one over the down rows with the routing-weighted
// sum), f32 throughout, so the dispatch logic is exercised where there is no GPU.
// Used by: CpuBackend::fused_moe.
#pragma once
#include <cstdint>

#include "backend/backend.h"

namespace moecel::cpu {

// act(g) for a GLU: the value multiplied by the up projection.
inline float glu_activation(Activation act, float g);

// out (hidden,) = sum_j weights[j] * down[e_j] @ act(gate[e_j] @ x, up[e_j] @ x), e_j = indices[j], j < k.
// gate, up (n_experts, ffn, hidden) and down (n_experts, hidden, ffn) quantized with one group size;
// x (hidden,). Each output is the sum over j in order 0..k-1 of whole dot products: results do not depend on
// the thread count. Throws moecel::Error for an index outside [0, n_experts).
void fused_moe_decode(const LinearWeight& gate, const LinearWeight& up, const LinearWeight& down, Activation act,
                      const float* x, const int32_t* indices, const float* weights, int64_t k, float* out);

}  // namespace moecel::cpu

#include <cmath>

namespace moecel::cpu {

inline float glu_activation(Activation act, float g) {
  switch (act) {
    case Activation::kSiLU: return g / (1.0f + std::exp(-g));
    case Activation::kGeLU:  // tanh approximation (gelu_pytorch_tanh), as GeGLU families use
      return 0.5f * g * (1.0f + std::tanh(0.7978845608f * (g + 0.044715f * g * g * g)));
    case Activation::kReLU2: return g > 0 ? g * g : 0.0f;
  }
  return 0.0f;
}

}  // namespace moecel::cpu
