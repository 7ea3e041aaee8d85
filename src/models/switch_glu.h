// The shared MoE expert module: stacked gated-MLP experts and the paths that run them.
// Every MoE family binds its routed experts here (never a private expert struct), so all of them reach
// the same gather path and, for single-token decode, the same fused path.
// Used by: olmoe
#pragma once
#include "backend/backend.h"
#include "models/weights.h"

namespace moecel {

class SwitchGLU {
 public:
  SwitchGLU() = default;
  SwitchGLU(SwitchWeights w, Activation act) : w_(std::move(w)), act_(act) {}

  int64_t n_experts() const { return w_.gate.n_stack; }
  int64_t hidden_size() const { return w_.gate.in; }
  int64_t ffn_size() const { return w_.gate.out; }
  const SwitchWeights& weights() const { return w_; }
  // Bytes of one expert's three projections (what one selected expert costs a decode step).
  size_t bytes_per_expert() const;

  // The gather path (reference and fallback): per (token, expert) products, activation, down product,
  // then the weighted sum.
  // x (n_tokens, hidden_size); indices I32 (n_tokens, k); weights F32 (n_tokens, k) -> (n_tokens, hidden_size)
  Tensor forward(Backend& be, const Tensor& x, const Tensor& indices, const Tensor& weights) const;

 private:
  SwitchWeights w_;
  Activation act_ = Activation::kSiLU;
};

}  // namespace moecel
