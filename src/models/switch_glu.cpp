// SwitchGLU paths. The gather path mirrors MLX's SwitchGLU: gather_qmm for gate and up, the activation,
// gather_qmm for down, then the routing-weighted sum.
#include "models/switch_glu.h"

#include "core/error.h"
#include "models/moe_dispatch.h"

namespace moecel {

size_t SwitchGLU::bytes_per_expert() const {
  return w_.gate.bytes_per_slice() + w_.up.bytes_per_slice() + w_.down.bytes_per_slice();
}

bool SwitchGLU::fused_eligible(const Backend& be) const {
  const FusedMoeSettings s = fused_moe_settings();
  if (!s.enabled) return false;
  const int64_t backend_cap = be.fused_moe_default_max_dff();
  const int64_t cap = s.max_dff >= 0 ? s.max_dff : backend_cap;
  if (backend_cap <= 0 || ffn_size() > cap) return false;
  const LinearWeight &g = w_.gate, &u = w_.up, &d = w_.down;
  for (const LinearWeight* p : {&g, &u, &d}) {
    if (!p->quantized() || p->biases.data == nullptr) return false;
  }
  if (g.bits != u.bits || (g.bits != 4 && g.bits != 8)) return false;
  if (d.bits != 4 && d.bits != 6 && d.bits != 8) return false;
  if (g.group_size != u.group_size || g.group_size != d.group_size) return false;
  if (g.scales.dtype != u.scales.dtype || g.scales.dtype != d.scales.dtype) return false;
  if (d.bits == 6 && ffn_size() % 16 != 0) return false;
  return true;
}

Tensor SwitchGLU::forward(Backend& be, const Tensor& x, const Tensor& indices, const Tensor& weights) const {
  const bool fused = indices.dim(0) == 1 && fused_eligible(be);
  moe_trace::dispatch(fused);
  return fused ? forward_fused(be, x, indices, weights) : forward_gather(be, x, indices, weights);
}

void SwitchGLU::forward_add(Backend& be, const Tensor& x, const Tensor& indices, const Tensor& weights,
                            Tensor& residual) const {
  const bool fused = indices.dim(0) == 1 && fused_eligible(be);
  moe_trace::dispatch(fused);
  if (fused) {
    be.fused_moe_add(w_.gate, w_.up, w_.down, act_, x, indices, weights, residual);
    return;
  }
  be.moe_weighted_sum_add(gather_products(be, x, indices), weights, residual);
}

void SwitchGLU::forward_add_routed(Backend& be, const LinearWeight& o_proj, const Tensor& att, Tensor& residual,
                                   const Tensor& post_norm, float eps, const LinearWeight& router,
                                   RouterScoring scoring, int k, bool renormalize, Tensor& xn, Tensor& indices,
                                   Tensor& weights) const {
  const bool fused = indices.dim(0) == 1 && fused_eligible(be);
  moe_trace::dispatch(fused);
  if (fused) {
    be.linear_residual_router_fused_moe_add(o_proj, att, residual, post_norm, eps, router, scoring, k, renormalize,
                                            w_.gate, w_.up, w_.down, act_, indices, weights);
    return;
  }
  Tensor logits = be.scratch(DType::kF32, {indices.dim(0), router.out});
  be.linear_residual_norm_router(o_proj, att, residual, post_norm, eps, router, scoring, k, renormalize, xn, logits,
                                 indices, weights);
  be.moe_weighted_sum_add(gather_products(be, xn, indices), weights, residual);
}

Tensor SwitchGLU::forward_fused(Backend& be, const Tensor& x, const Tensor& indices, const Tensor& weights) const {
  MOECEL_CHECK(indices.dim(0) == 1 && x.dim(0) == 1, "fused decode-MoE path: expected one token, got {}",
               indices.dim(0));
  Tensor out = be.scratch(DType::kF32, {1, hidden_size()});
  be.fused_moe(w_.gate, w_.up, w_.down, act_, x, indices, weights, out);
  return out;
}

// Every output below is fully written by its op, hence scratch (no memset).
Tensor SwitchGLU::gather_products(Backend& be, const Tensor& x, const Tensor& indices) const {
  const int64_t n = indices.dim(0), k = indices.dim(1);
  const int64_t ffn = ffn_size(), hidden = hidden_size();
  Tensor act = be.scratch(DType::kF32, {n, k, ffn});
  be.gather_glu(w_.gate, w_.up, act_, x, indices, act);
  Tensor y = be.scratch(DType::kF32, {n, k, hidden});
  be.gather_linear(w_.down, act, indices, y);
  return y;
}

Tensor SwitchGLU::forward_gather(Backend& be, const Tensor& x, const Tensor& indices, const Tensor& weights) const {
  Tensor out = be.scratch(DType::kF32, {indices.dim(0), hidden_size()});
  be.moe_weighted_sum(gather_products(be, x, indices), weights, out);
  return out;
}

}  // namespace moecel
