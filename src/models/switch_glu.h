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

  // The MoE block's experts: one token takes the fused path when fused_eligible, anything else the gather
  // path. Each call is one dispatch for the trace (moe_dispatch.h).
  // x (n_tokens, hidden_size); indices I32 (n_tokens, k); weights F32 (n_tokens, k) -> (n_tokens, hidden_size)
  Tensor forward(Backend& be, const Tensor& x, const Tensor& indices, const Tensor& weights) const;
  // residual (n_tokens, hidden_size) += forward(be, x, indices, weights), one dispatch: the fused path adds in its
  // last kernel, the gather path with an add (same rounding).
  void forward_add(Backend& be, const Tensor& x, const Tensor& indices, const Tensor& weights, Tensor& residual) const;
  // The MoE block after an attention output together with it, one dispatch: residual += o_proj(att), the router on
  // rms_norm(residual, post_norm) -> indices, weights, residual += the experts' output. One token takes the fused
  // path as one backend op (Backend::linear_residual_router_fused_moe_add); anything else the router op
  // (linear_residual_norm_router, its normalized input in xn) and the gather path. att (n_tokens, in); residual, xn
  // (n_tokens, hidden_size); indices I32 and weights F32 (n_tokens, k).
  void forward_add_routed(Backend& be, const LinearWeight& o_proj, const Tensor& att, Tensor& residual,
                          const Tensor& post_norm, float eps, const LinearWeight& router, RouterScoring scoring, int k,
                          bool renormalize, Tensor& xn, Tensor& indices, Tensor& weights) const;
  // The gather path (reference and fallback): per (token, expert) products, activation, down product,
  // then the weighted sum. Same shapes as forward.
  Tensor forward_gather(Backend& be, const Tensor& x, const Tensor& indices, const Tensor& weights) const;
  // The fused single-token decode path (DESIGN.md section 5): x (1, hidden_size), indices and weights (1, k).
  Tensor forward_fused(Backend& be, const Tensor& x, const Tensor& indices, const Tensor& weights) const;
  // Whether a single token may take the fused path on `be` with the current settings: the flag on, affine
  // quantized gate/up/down with biases, gate and up bits equal and in {4, 8}, down bits in {4, 6, 8}, one group
  // size and scale dtype for all three, ffn_size <= the max-Dff cap, and ffn_size % 16 == 0 for 6-bit down.
  bool fused_eligible(const Backend& be) const;

 private:
  // The gather path's per (token, expert) products: y (n_tokens, k, hidden_size), before the weighted sum.
  Tensor gather_products(Backend& be, const Tensor& x, const Tensor& indices) const;
  SwitchWeights w_;
  Activation act_ = Activation::kSiLU;
};

}  // namespace moecel
