// Backend selection and the helpers shared by all backends.
#include "backend/backend.h"

#include <algorithm>

#include "backend/cpu/cpu_backend.h"
#ifdef MOECEL_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif
#include "core/error.h"

namespace moecel {

LinearWeight Backend::to_device(const LinearWeight& w) {
  LinearWeight d = w;
  d.weight = to_device(w.weight);
  if (w.quantized()) {
    d.scales = to_device(w.scales);
    d.biases = to_device(w.biases);
  }
  return d;
}

std::unique_ptr<Backend> make_backend(std::string_view name) {
  if (name == "cpu") return std::make_unique<CpuBackend>();
#ifdef MOECEL_HAVE_CUDA
  if (name == "cuda") return std::make_unique<CudaBackend>();  // throws when no CUDA device is found
#else
  if (name == "cuda")
    fail("--backend cuda: this build has no CUDA backend (nvcc was not found at configure time); use --backend cpu");
#endif
  fail("unknown backend '{}': expected 'cpu' or 'cuda'", name);
}

}  // namespace moecel

namespace moecel {

void Backend::gather_glu(const LinearWeight& gate, const LinearWeight& up, Activation act, const Tensor& x,
                         const Tensor& indices, Tensor& out) {
  Tensor u = scratch(DType::kF32, out.shape);  // fully written below, hence scratch
  gather_linear(gate, x, indices, out);
  gather_linear(up, x, indices, u);
  glu(act, out, u, out);
}

void Backend::moe_weighted_sum_add(const Tensor& y, const Tensor& weights, Tensor& residual) {
  Tensor out = scratch(DType::kF32, residual.shape);
  moe_weighted_sum(y, weights, out);
  add(residual, out, residual);
}

void Backend::fused_moe(const LinearWeight&, const LinearWeight&, const LinearWeight&, Activation, const Tensor&,
                        const Tensor&, const Tensor&, Tensor&) {
  fail("backend '{}' has no fused decode-MoE path", name());
}

void Backend::fused_moe_add(const LinearWeight& gate, const LinearWeight& up, const LinearWeight& down, Activation act,
                            const Tensor& x, const Tensor& indices, const Tensor& weights, Tensor& residual) {
  Tensor out = scratch(DType::kF32, residual.shape);
  fused_moe(gate, up, down, act, x, indices, weights, out);
  add(residual, out, residual);
}

// Decode-step fusions: the named ops in sequence (a backend overrides them to save launches, not to change results
// beyond the rounding of its own reductions).
void Backend::rms_norm_linears(const Tensor& x, const Tensor& norm_weight, float eps,
                               std::span<const LinearWeight* const> ws, std::span<Tensor* const> ys, Tensor* xn_out) {
  MOECEL_CHECK(ws.size() == ys.size(), "rms_norm_linears: {} weights but {} outputs", ws.size(), ys.size());
  Tensor xn = xn_out ? *xn_out : scratch(DType::kF32, x.shape);
  rms_norm(x, norm_weight, eps, xn);
  for (size_t i = 0; i < ws.size(); ++i) linear(*ws[i], xn, *ys[i]);
}

void Backend::linear_residual(const LinearWeight& w, const Tensor& x, Tensor& residual) {
  Tensor y = scratch(DType::kF32, residual.shape);
  linear(w, x, y);
  add(residual, y, residual);
}

void Backend::rms_norm_router(const Tensor& x, const Tensor& norm_weight, float eps, const LinearWeight& router,
                              RouterScoring scoring, int k, bool renormalize, Tensor& xn, Tensor& logits,
                              Tensor& indices, Tensor& weights) {
  rms_norm(x, norm_weight, eps, xn);
  linear(router, xn, logits);
  router_topk(logits, scoring, k, renormalize, indices, weights);
}

void Backend::linear_residual_norm_router(const LinearWeight& w, const Tensor& x, Tensor& residual,
                                          const Tensor& norm_weight, float eps, const LinearWeight& router,
                                          RouterScoring scoring, int k, bool renormalize, Tensor& xn, Tensor& logits,
                                          Tensor& indices, Tensor& weights) {
  linear_residual(w, x, residual);
  rms_norm_router(residual, norm_weight, eps, router, scoring, k, renormalize, xn, logits, indices, weights);
}

void Backend::linear_residual_router_fused_moe_add(const LinearWeight& w, const Tensor& x, Tensor& residual,
                                                   const Tensor& norm_weight, float eps, const LinearWeight& router,
                                                   RouterScoring scoring, int k, bool renormalize,
                                                   const LinearWeight& gate, const LinearWeight& up,
                                                   const LinearWeight& down, Activation act, Tensor& indices,
                                                   Tensor& weights) {
  Tensor xn = scratch(DType::kF32, residual.shape);
  Tensor logits = scratch(DType::kF32, {residual.numel() / std::max<int64_t>(1, router.in), router.out});
  linear_residual_norm_router(w, x, residual, norm_weight, eps, router, scoring, k, renormalize, xn, logits, indices,
                              weights);
  fused_moe_add(gate, up, down, act, xn, indices, weights, residual);
}

}  // namespace moecel

namespace moecel {

// Family ops a backend may lack: a clear error instead of a wrong result.
void Backend::add_bias(Tensor&, const Tensor&) {
  fail("backend '{}' has no add_bias op (needed by qwen2_moe attention biases)", name());
}

void Backend::add_sigmoid_gated(const Tensor&, const Tensor&, const Tensor&, Tensor&) {
  fail("backend '{}' has no add_sigmoid_gated op (needed by qwen2_moe shared experts)", name());
}

void Backend::router_grouped_topk(const Tensor&, const Tensor&, int, int, int, bool, float, Tensor&, Tensor&) {
  fail("backend '{}' has no router_grouped_topk op (needed by dots1 routing)", name());
}

}  // namespace moecel
