// CudaBackend, decode side: the fused decode-MoE entry points, the decode-step fusions (one matrix-vector launch
// each where they apply, else the Backend defaults), argmax on the device, and the ops of the qwen2_moe / qwen3_moe /
// dots1 blocks. Validation as in cuda_backend.cpp, then one launcher call.
// (src/backend/**/*.cpp is globbed into moecel_lib even without CUDA, hence the guard.)
#if defined(MOECEL_HAVE_CUDA)
#include <string_view>

#include "backend/cuda/bias_ops.cuh"
#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/fused_moe.cuh"
#include "backend/cuda/misc.cuh"
#include "backend/cuda/moe.cuh"
#include "backend/cuda/router_grouped.cuh"

namespace moecel {

using cuda::FloatType;
using namespace cuda_host;

namespace {

// The arguments of fused_moe, and of fused_moe_add when residual is set (then out is the residual, updated in
// place), checked; act_buf and staged hold the scratch they point to until the kernels are launched.
cuda::FusedMoeArgs fused_args(CudaBackend& be, CudaBackend::Impl& im, const LinearWeight& gate, const LinearWeight& up,
                              const LinearWeight& down, Activation act, const Tensor& x, const Tensor& indices,
                              const Tensor& weights, Tensor& out, bool residual, Tensor& act_buf, Tensor& staged) {
  check_f32(x, "fused_moe input");
  check_f32(out, "fused_moe output");
  check_f32(weights, "fused_moe weights");
  check_dev(indices, "fused_moe indices");
  cuda::FusedMoeArgs a;
  a.gate = weight_view(gate, "fused_moe");
  a.up = weight_view(up, "fused_moe");
  a.down = weight_view(down, "fused_moe");
  MOECEL_CHECK(gate.quantized() && gate.n_stack > 0, "fused_moe: {} must be quantized experts", gate.name);
  const int64_t k = indices.numel();
  MOECEL_CHECK(indices.dtype == DType::kI32 && weights.numel() == k && k >= 1,
               "fused_moe: indices must be I32 (1, k) with k >= 1 and weights (1, k)");
  check_rows(x, 1, gate.in, "fused_moe input");
  check_rows(out, 1, gate.in, "fused_moe output");
  if (x.data != out.data) check_no_overlap(x, out, "fused_moe");  // the route's x is y itself, read by kernel A only
  act_buf = be.scratch(DType::kF32, {k, gate.out});               // (k, ffn)
  a.x = x.ptr<float>();
  a.indices = indices.ptr<int32_t>();
  a.weights = weights.ptr<float>();
  a.act = act_buf.ptr<float>();
  if (im.ctx.decode_mma == 1) {  // kernel A hands kernel B its operand already staged
    const size_t bytes = cuda::fused_act_bytes(gate.out, int(k));
    staged = be.scratch(DType::kF32, {int64_t((bytes + 3) / 4)});
    a.act_staged = static_cast<unsigned char*>(staged.data);
  }
  a.out = out.ptr<float>();
  a.residual = residual ? out.ptr<float>() : nullptr;
  a.k = int(k);
  a.glu = act == Activation::kSiLU   ? cuda::GluAct::kSiLU
          : act == Activation::kGeLU ? cuda::GluAct::kGeLU
                                     : cuda::GluAct::kReLU2;
  a.rows_per_warp = im.fused_rows_per_warp;
  a.down_rows_per_warp = im.fused_down_rows_per_warp;
  a.max_slot_batch = im.fused_slot_batch;
  a.b_prefetch = im.fused_b_prefetch;
  a.b_early = (im.ctx.pdl_early & 1) != 0;
  a.bulk = im.fused_bulk;
  // MOECEL_CUDA_DECODE_MMA=1 promises fused == gather bit for bit: its own tensor-core kernels take what the gather
  // path runs on tensor cores, and the bulk kernels stay on CUDA cores like the gather path's other products.
  a.mma = im.ctx.decode_mma == 1 ? 0 : im.fused_mma;
  a.l2_down = im.fused_l2_down;
  a.rotate = im.fused_rotate;
  a.imma = im.fused_imma;
  a.smem_fill = im.fused_smem_fill;
  return a;
}

void run_fused_moe(CudaBackend& be, CudaBackend::Impl& im, const LinearWeight& gate, const LinearWeight& up,
                   const LinearWeight& down, Activation act, const Tensor& x, const Tensor& indices,
                   const Tensor& weights, Tensor& out, bool residual) {
  Tensor act_buf, staged;
  const cuda::FusedMoeArgs a =
      fused_args(be, im, gate, up, down, act, x, indices, weights, out, residual, act_buf, staged);
  cuda::launch_fused_moe(im.ctx, a);
}

}  // namespace

void CudaBackend::fused_moe(const LinearWeight& gate, const LinearWeight& up, const LinearWeight& down, Activation act,
                            const Tensor& x, const Tensor& indices, const Tensor& weights, Tensor& out) {
  run_fused_moe(*this, *impl_, gate, up, down, act, x, indices, weights, out, false);
}

void CudaBackend::fused_moe_add(const LinearWeight& gate, const LinearWeight& up, const LinearWeight& down,
                                Activation act, const Tensor& x, const Tensor& indices, const Tensor& weights,
                                Tensor& residual) {
  run_fused_moe(*this, *impl_, gate, up, down, act, x, indices, weights, residual, true);
}

// ---- decode-step fusions: one matrix-vector launch (qmatmul.cuh, launch_gemv_fused) where it applies, else the
// Backend defaults (the ops one by one) ----

namespace {

// The weights of one fused launch: quantized, sharing in, bits, group size and scale type.
bool fusable(std::span<const LinearWeight* const> ws, int64_t in) {
  if (ws.empty() || ws.size() > size_t(cuda::kMaxGemvParts)) return false;
  for (const LinearWeight* w : ws) {
    if (!w->quantized() || w->n_stack != 0 || w->in != in || w->bits != ws[0]->bits ||
        w->group_size != ws[0]->group_size || w->scales.dtype != ws[0]->scales.dtype) {
      return false;
    }
  }
  return true;
}

cuda::GemvFusion norm_fusion(const Tensor& norm_weight, float eps, int64_t d) {
  check_dev(norm_weight, "rms_norm weight");
  MOECEL_CHECK(norm_weight.numel() == d, "rms_norm: weight of {} elements for rows of {}", norm_weight.numel(), d);
  cuda::GemvFusion f;
  f.norm_w = norm_weight.data;
  f.norm_type = float_type(norm_weight.dtype, "rms_norm weight");
  f.eps = eps;
  return f;
}

// The outputs of a router launch for n tokens of width d: xn (n, d), logits (n, n_experts) F32 and the top-k's
// indices (I32) and weights (n, k) on the device.
void check_router_outputs(int64_t n, int64_t d, int64_t n_experts, int k, const Tensor& xn, const Tensor& logits,
                          const Tensor& indices, const Tensor& weights) {
  check_f32(xn, "router normalized input");
  check_f32(logits, "router logits");
  check_f32(weights, "router weights");
  check_dev(indices, "router indices");
  MOECEL_CHECK(indices.dtype == DType::kI32, "router: indices must be I32, got {}", dtype_name(indices.dtype));
  check_rows(xn, n, d, "router normalized input");
  check_rows(logits, n, n_experts, "router logits");
  check_rows(indices, n, k, "router indices");
  check_rows(weights, n, k, "router weights");
}

// The device views of a fused launch's weights and outputs, checked: ys[i] (n, ws[i]->out), not overlapping `input`.
void linear_views(std::span<const LinearWeight* const> ws, std::span<Tensor* const> ys, int64_t n, const Tensor& input,
                  cuda::WeightView* views, float** outs) {
  for (size_t i = 0; i < ws.size(); ++i) {
    views[i] = weight_view(*ws[i], "rms_norm_linears");
    check_f32(*ys[i], "rms_norm_linears output");
    check_rows(*ys[i], n, ws[i]->out, ws[i]->name.c_str());
    check_no_overlap(input, *ys[i], "rms_norm_linears");
    outs[i] = ys[i]->ptr<float>();
  }
}

// Many tokens: the norm, then the products of all the weights in one launch of the tensor-core kernel (OLMoE's q, k
// and v at 512 tokens were three launches of 128 blocks, one per SM); the products one by one where it declines.
void norm_linears_prefill(CudaBackend& be, const cuda::Ctx& ctx, const Tensor& x, const Tensor& norm_weight, float eps,
                          std::span<const LinearWeight* const> ws, std::span<Tensor* const> ys, Tensor* xn_out) {
  const int64_t n = x.numel() / norm_weight.numel();
  Tensor xn = xn_out ? *xn_out : be.scratch(DType::kF32, x.shape);
  be.rms_norm(x, norm_weight, eps, xn);
  cuda::WeightView views[cuda::kMaxGemvParts];
  float* outs[cuda::kMaxGemvParts];
  linear_views(ws, ys, n, xn, views, outs);
  const Tensor scratch = be.scratch(DType::kF32, {int64_t(cuda::linear_scratch_bytes(views[0], n) + 3) / 4});
  if (cuda::launch_gemm_parts(ctx, std::span(views, ws.size()), std::span(outs, ws.size()), xn.ptr<float>(), n,
                              scratch.ptr<float>())) {
    return;
  }
  for (size_t i = 0; i < ws.size(); ++i) be.linear(*ws[i], xn, *ys[i]);
}

}  // namespace

void CudaBackend::rms_norm_linears(const Tensor& x, const Tensor& norm_weight, float eps,
                                   std::span<const LinearWeight* const> ws, std::span<Tensor* const> ys,
                                   Tensor* xn_out) {
  MOECEL_CHECK(ws.size() == ys.size(), "rms_norm_linears: {} weights but {} outputs", ws.size(), ys.size());
  const int64_t d = norm_weight.numel();
  if (!(impl_->fusions & 1) || d == 0 || !fusable(ws, d) || x.numel() % d != 0) {
    return Backend::rms_norm_linears(x, norm_weight, eps, ws, ys, xn_out);
  }
  check_f32(x, "rms_norm_linears input");
  const int64_t n = x.numel() / d;
  if (n > cuda::kGemvMaxTokens) return norm_linears_prefill(*this, impl_->ctx, x, norm_weight, eps, ws, ys, xn_out);
  cuda::WeightView views[cuda::kMaxGemvParts];
  float* outs[cuda::kMaxGemvParts];
  linear_views(ws, ys, n, x, views, outs);
  cuda::GemvFusion f = norm_fusion(norm_weight, eps, d);
  if (xn_out) {
    check_f32(*xn_out, "rms_norm_linears normalized output");
    check_rows(*xn_out, n, d, "rms_norm_linears normalized output");
    check_no_overlap(x, *xn_out, "rms_norm_linears");
    f.xn_out = xn_out->ptr<float>();
  }
  if (!cuda::launch_gemv_fused(impl_->ctx, std::span(views, ws.size()), std::span(outs, ws.size()), x.ptr<float>(), n,
                               f)) {
    Backend::rms_norm_linears(x, norm_weight, eps, ws, ys, xn_out);
  }
}

void CudaBackend::linear_residual(const LinearWeight& w, const Tensor& x, Tensor& residual) {
  const LinearWeight* ws[] = {&w};
  const int64_t n = x.numel() / std::max<int64_t>(1, w.in);
  if (!(impl_->fusions & 2) || !fusable(ws, w.in) || n > cuda::kGemvMaxTokens)
    return Backend::linear_residual(w, x, residual);
  check_f32(x, "linear input");
  check_f32(residual, "linear residual");
  check_rows(x, n, w.in, w.name.c_str());
  check_rows(residual, n, w.out, w.name.c_str());
  check_no_overlap(x, residual, "linear_residual");
  const cuda::WeightView v = weight_view(w, "linear");
  float* y = residual.ptr<float>();
  cuda::GemvFusion f;
  f.residual = y;
  if (!cuda::launch_gemv_fused(impl_->ctx, std::span(&v, 1), std::span(&y, 1), x.ptr<float>(), n, f)) {
    Backend::linear_residual(w, x, residual);
  }
}

void CudaBackend::rms_norm_router(const Tensor& x, const Tensor& norm_weight, float eps, const LinearWeight& router,
                                  RouterScoring scoring, int k, bool renormalize, Tensor& xn, Tensor& logits,
                                  Tensor& indices, Tensor& weights) {
  const LinearWeight* ws[] = {&router};
  const int64_t d = norm_weight.numel(), n_experts = router.out;
  const bool fits = d > 0 && x.numel() % d == 0 && x.numel() / d <= cuda::kGemvMaxTokens && k >= 1 && k <= n_experts;
  if (!(impl_->fusions & 4) || !fits || !fusable(ws, d)) {
    return Backend::rms_norm_router(x, norm_weight, eps, router, scoring, k, renormalize, xn, logits, indices, weights);
  }
  const int64_t n = x.numel() / d;
  check_f32(x, "router input");
  check_router_outputs(n, d, n_experts, k, xn, logits, indices, weights);
  check_no_overlap(x, xn, "rms_norm_router");
  check_no_overlap(x, logits, "rms_norm_router");
  const cuda::WeightView v = weight_view(router, "router");
  cuda::GemvFusion f = norm_fusion(norm_weight, eps, d);
  f.xn_out = xn.ptr<float>();
  // The top-k in the launch's last block (bit 8 of MOECEL_CUDA_FUSIONS) measured slower on the H200 than a
  // separate one-warp kernel started early by PDL (OLMoE tg128 852 vs 872 tok/s), so by default it is separate.
  const bool epilogue = (impl_->fusions & 8) && k <= 32 && n_experts <= cuda::kWarpRouterExperts;
  if (epilogue) {
    f.router.k = k;
    f.router.topk_softmax = scoring == RouterScoring::kTopKSoftmax;
    f.router.renormalize = renormalize;
    f.router.indices = indices.ptr<int32_t>();
    f.router.weights = weights.ptr<float>();
    f.counter = impl_->ctx.block_counter;
  }
  float* y = logits.ptr<float>();
  if (!cuda::launch_gemv_fused(impl_->ctx, std::span(&v, 1), std::span(&y, 1), x.ptr<float>(), n, f)) {
    return Backend::rms_norm_router(x, norm_weight, eps, router, scoring, k, renormalize, xn, logits, indices, weights);
  }
  if (!epilogue) router_topk(logits, scoring, k, renormalize, indices, weights);
}

namespace {

// Whether the o projection's blocks can compute the router's share (RouterShare) for these shapes.
bool share_fits(const CudaBackend::Impl& im, const LinearWeight& w, const Tensor& x, const Tensor& norm_weight,
                const LinearWeight& router, int k) {
  const LinearWeight* ows[] = {&w};
  const LinearWeight* rws[] = {&router};
  const int64_t d = w.out, n_experts = router.out, rows = cuda::share_rows(w.in);
  const int64_t n = x.numel() / std::max<int64_t>(1, w.in);
  const auto four_or_eight = [](const LinearWeight& l) { return l.bits == 4 || l.bits == 8; };
  return im.router_share && (im.fusions & 6) == 6 && fusable(ows, w.in) && fusable(rws, d) && four_or_eight(w) &&
         four_or_eight(router) && d % rows == 0 && router.group_size % rows == 0 &&
         n_experts <= cuda::kWarpRouterExperts && d / rows * n_experts <= cuda::kMaxShareParts && k >= 1 &&
         k <= std::min<int64_t>(32, n_experts) && n >= 1 && n <= cuda::kGemvMaxTokens && x.numel() == n * w.in &&
         norm_weight.numel() == d && !cuda::decode_mma_applies(im.ctx, weight_view(w, "linear"));
}

// The o projection's fusion with the router's share into parts (n, d / rows, n_experts + 1 floats: the parts, then
// the sums of squares), its inputs checked.
cuda::GemvFusion share_fusion(const LinearWeight& w, const Tensor& x, Tensor& residual, const Tensor& norm_weight,
                              const LinearWeight& router, float* parts) {
  const int64_t d = w.out, n_experts = router.out, rows = cuda::share_rows(w.in);
  const int64_t n = x.numel() / std::max<int64_t>(1, w.in), blocks = d / rows;
  check_f32(x, "linear input");
  check_f32(residual, "linear residual");
  check_rows(residual, n, d, w.name.c_str());
  check_no_overlap(x, residual, "linear_residual_norm_router");
  check_dev(norm_weight, "rms_norm weight");  // the norm belongs to the router here, not to the projection's input
  cuda::GemvFusion f;
  f.residual = residual.ptr<float>();
  f.share.w = weight_view(router, "router");
  f.share.norm_w = norm_weight.data;
  f.share.norm_type = float_type(norm_weight.dtype, "rms_norm weight");
  f.share.parts = parts;
  f.share.sumsq = parts + n * blocks * n_experts;
  f.share.rows = int(rows);
  return f;
}

}  // namespace

void CudaBackend::linear_residual_norm_router(const LinearWeight& w, const Tensor& x, Tensor& residual,
                                              const Tensor& norm_weight, float eps, const LinearWeight& router,
                                              RouterScoring scoring, int k, bool renormalize, Tensor& xn,
                                              Tensor& logits, Tensor& indices, Tensor& weights) {
  const int64_t d = w.out, n_experts = router.out, rows = cuda::share_rows(w.in);
  const int64_t n = x.numel() / std::max<int64_t>(1, w.in);
  const auto unfused = [&] {
    Backend::linear_residual_norm_router(w, x, residual, norm_weight, eps, router, scoring, k, renormalize, xn, logits,
                                         indices, weights);
  };
  if (!share_fits(*impl_, w, x, norm_weight, router, k)) return unfused();
  check_router_outputs(n, d, n_experts, k, xn, logits, indices, weights);
  check_no_overlap(residual, xn, "linear_residual_norm_router");
  check_no_overlap(residual, logits, "linear_residual_norm_router");
  const std::shared_ptr<void> buf = impl_->scratch(size_t(n * d / rows * (n_experts + 1)) * sizeof(float));
  cuda::GemvFusion f = share_fusion(w, x, residual, norm_weight, router, static_cast<float*>(buf.get()));
  const cuda::WeightView ov = weight_view(w, "linear");
  float* y = residual.ptr<float>();
  if (!cuda::launch_gemv_fused(impl_->ctx, std::span(&ov, 1), std::span(&y, 1), x.ptr<float>(), n, f)) {
    return unfused();
  }
  cuda::RouterReduce r;
  r.parts = f.share.parts;
  r.sumsq = f.share.sumsq;
  r.blocks = int(d / rows);
  r.y = residual.ptr<float>();
  r.norm_w = norm_weight.data;
  r.norm_type = f.share.norm_type;
  r.eps = eps;
  r.d = d;
  r.n_experts = int(n_experts);
  r.k = k;
  r.topk_softmax = scoring == RouterScoring::kTopKSoftmax;
  r.renormalize = renormalize;
  r.xn = xn.ptr<float>();
  r.logits = logits.ptr<float>();
  r.indices = indices.ptr<int32_t>();
  r.weights = weights.ptr<float>();
  cuda::launch_router_reduce_topk(impl_->ctx, r, n);
}

void CudaBackend::linear_residual_router_fused_moe_add(const LinearWeight& w, const Tensor& x, Tensor& residual,
                                                       const Tensor& norm_weight, float eps, const LinearWeight& router,
                                                       RouterScoring scoring, int k, bool renormalize,
                                                       const LinearWeight& gate, const LinearWeight& up,
                                                       const LinearWeight& down, Activation act, Tensor& indices,
                                                       Tensor& weights) {
  Impl& im = *impl_;
  const int64_t d = w.out, n_experts = router.out, rows = cuda::share_rows(w.in);
  const auto unrouted = [&] {
    Backend::linear_residual_router_fused_moe_add(w, x, residual, norm_weight, eps, router, scoring, k, renormalize,
                                                  gate, up, down, act, indices, weights);
  };
  // One token, 16-row parts (the o projection's int8 kernel with its route variant), up to kRouteMaxExperts experts.
  // Not with launches skipped for measurement (MOECEL_CUDA_SKIP other than "list"): kernel B would wait for a
  // skipped kernel A's slots forever.
  const bool skipping = im.ctx.skip && std::string_view(im.ctx.skip) != "list";
  if (!im.fused_route || skipping || x.numel() != w.in || rows != 16 || n_experts > cuda::kRouteMaxExperts ||
      n_experts != gate.n_stack || d != gate.in || !share_fits(im, w, x, norm_weight, router, k)) {
    return unrouted();
  }
  check_rows(indices, 1, k, "router indices");  // dtypes and devices: fused_args below
  check_rows(weights, 1, k, "router weights");
  const int64_t blocks = d / rows;
  const std::shared_ptr<void> buf = im.scratch(size_t(blocks * (n_experts + 1)) * sizeof(float));
  cuda::GemvFusion f = share_fusion(w, x, residual, norm_weight, router, static_cast<float*>(buf.get()));
  Tensor act_buf, staged;
  cuda::FusedMoeArgs a =
      fused_args(*this, im, gate, up, down, act, residual, indices, weights, residual, true, act_buf, staged);
  cuda::FusedRoute& rt = a.route;
  rt.words = im.route_dev;
  rt.slots = im.route_dev + kRouteSlotsAt;
  rt.parts = f.share.parts;
  rt.blocks = int(blocks);
  rt.n_experts = int(n_experts);
  rt.y = residual.ptr<float>();
  rt.norm_w = f.share.norm_w;
  rt.norm_type = f.share.norm_type;
  rt.eps = eps;
  rt.topk_softmax = scoring == RouterScoring::kTopKSoftmax;
  rt.renormalize = renormalize;
  rt.indices = indices.ptr<int32_t>();
  rt.weights = weights.ptr<float>();
  if (!cuda::launch_fused_moe_routed(im.ctx, a, true)) return unrouted();
  f.share.route.words = rt.words;
  f.share.route.slots = rt.slots;
  f.share.route.k = k;
  f.share.route.limit = float(int64_t(1) << 31) / float(blocks);  // the words' sum stays below 2^63
  const cuda::WeightView ov = weight_view(w, "linear");
  float* y = residual.ptr<float>();
  if (!cuda::launch_gemv_fused(im.ctx, std::span(&ov, 1), std::span(&y, 1), x.ptr<float>(), 1, f)) return unrouted();
  CUDA_REQUIRE(cuda::launch_fused_moe_routed(im.ctx, a, false),
               "fused_moe: the routed kernels declined after a dry run");
}

std::vector<int32_t> CudaBackend::argmax(const Tensor& logits) {
  check_f32(logits, "argmax");
  MOECEL_CHECK(logits.ndim() >= 1 && logits.dim(-1) > 0, "argmax: empty rows in {}", shape_str(logits.shape));
  const int64_t v = logits.dim(-1), n = logits.numel() / v;
  std::vector<int32_t> out(static_cast<size_t>(n));
  if (n == 0) return out;
  const std::shared_ptr<void> buf = impl_->scratch(size_t(n) * sizeof(int32_t));
  const std::shared_ptr<void> part = impl_->scratch(cuda::argmax_scratch_bytes(n));
  cuda::launch_argmax(impl_->ctx, logits.ptr<float>(), n, v, static_cast<int32_t*>(buf.get()), part.get());
  CUDA_CHECK(
      cudaMemcpyAsync(out.data(), buf.get(), size_t(n) * sizeof(int32_t), cudaMemcpyDeviceToHost, impl_->ctx.stream));
  impl_->sync();
  return out;
}

void CudaBackend::argmax_to(const Tensor& logits, Tensor& ids) {
  check_f32(logits, "argmax");
  check_dev(ids, "argmax ids");
  MOECEL_CHECK(logits.ndim() >= 1 && logits.dim(-1) > 0, "argmax: empty rows in {}", shape_str(logits.shape));
  const int64_t v = logits.dim(-1), n = logits.numel() / v;
  MOECEL_CHECK(ids.dtype == DType::kI32 && ids.numel() == n, "argmax: ids must be I32 with {} elements, got {} {}", n,
               dtype_name(ids.dtype), shape_str(ids.shape));
  const std::shared_ptr<void> part = impl_->scratch(cuda::argmax_scratch_bytes(n));
  // Recording decode steps: each step's argmax also advances the step position and writes its id to the host, so
  // that replays need no copies for either (CudaDecodeGraph::launch).
  Impl& im = *impl_;
  MOECEL_CHECK(!im.capturing || n == 1, "decode graph: argmax_to of {} rows while recording single-token steps", n);
  int64_t* advance = im.capturing ? im.step_pos_dev : nullptr;
  im.graph_steps += advance ? 1 : 0;
  cuda::launch_argmax(im.ctx, logits.ptr<float>(), n, v, ids.ptr<int32_t>(), part.get(), advance, im.next_mapped);
}

// The streaming vocabulary projection with the argmax in its last block (Impl::argmax_tail): one launch per greedy step
// fewer. The logits are rms_norm_linears' bit for bit; where the streaming kernel does not apply, the two ops.
void CudaBackend::rms_norm_linear_argmax(const Tensor& x, const Tensor& norm_weight, float eps, const LinearWeight& w,
                                         Tensor& logits, Tensor& ids) {
  const LinearWeight* ws[] = {&w};
  const int64_t d = norm_weight.numel();
  Impl& im = *impl_;
  if (!im.argmax_tail || !(im.fusions & 1) || d == 0 || x.numel() != d || !fusable(ws, d)) {
    return Backend::rms_norm_linear_argmax(x, norm_weight, eps, w, logits, ids);
  }
  check_f32(x, "rms_norm_linear_argmax input");
  check_dev(ids, "argmax ids");
  MOECEL_CHECK(ids.dtype == DType::kI32 && ids.numel() == 1, "argmax: ids must be I32 with 1 element, got {} {}",
               dtype_name(ids.dtype), shape_str(ids.shape));
  cuda::WeightView view;
  float* out = nullptr;
  Tensor* ys[] = {&logits};
  linear_views(ws, ys, 1, x, &view, &out);
  cuda::GemvFusion f = norm_fusion(norm_weight, eps, d);
  constexpr int kParts = 4096;  // at least the streaming kernel's resident blocks
  const std::shared_ptr<void> part = im.scratch(size_t(kParts) * (sizeof(float) + sizeof(int)));
  // As argmax_to: while recording, the step position advances and the id goes to the host words.
  int64_t* advance = im.capturing ? im.step_pos_dev : nullptr;
  cuda::ArgmaxTail tail;
  tail.out = ids.ptr<int32_t>();
  tail.part_v = static_cast<float*>(part.get());
  tail.part_i = reinterpret_cast<int*>(tail.part_v + kParts);
  tail.max_parts = kParts;
  tail.counter = im.ctx.block_counter;
  tail.advance = advance;
  tail.host_out = advance ? im.next_mapped : nullptr;
  if (!cuda::launch_gemv_fused(im.ctx, std::span(&view, 1), std::span(&out, 1), x.ptr<float>(), 1, f, &tail)) {
    return Backend::rms_norm_linear_argmax(x, norm_weight, eps, w, logits, ids);
  }
  im.graph_steps += advance ? 1 : 0;
}

// ---- ops of the qwen2_moe / qwen3_moe / dots1 blocks (bias_ops.cu, router_grouped.cu) ----

void CudaBackend::add_bias(Tensor& x, const Tensor& bias) {
  check_f32(x, "add_bias input");
  check_dev(bias, "add_bias bias");
  const FloatType bt = float_type(bias.dtype, "add_bias bias");
  MOECEL_CHECK(bias.ndim() == 1, "add_bias: bias must be a vector, got {}", shape_str(bias.shape));
  const int64_t d = bias.numel();
  MOECEL_CHECK(d > 0 && x.numel() % d == 0, "add_bias: input {} is not rows of the bias width {}", shape_str(x.shape),
               d);
  cuda::launch_add_bias(impl_->ctx, x.ptr<float>(), x.numel() / d, d, bias.data, bt);
}

void CudaBackend::add_sigmoid_gated(const Tensor& a, const Tensor& gate, const Tensor& b, Tensor& out) {
  for (const Tensor* t : {&a, &gate, &b, static_cast<const Tensor*>(&out)}) check_dev(*t, "add_sigmoid_gated");
  const int64_t n = check_sigmoid_gated(a, gate, b, out);
  check_no_overlap(gate, out, "add_sigmoid_gated");  // a and b may alias out (elementwise)
  cuda::launch_add_sigmoid_gated(impl_->ctx, a.ptr<float>(), gate.ptr<float>(), b.ptr<float>(), n, a.numel() / n,
                                 out.ptr<float>());
}

void CudaBackend::router_grouped_topk(const Tensor& logits, const Tensor& correction_bias, int n_group, int topk_group,
                                      int k, bool renormalize, float scale, Tensor& indices, Tensor& weights) {
  check_f32(logits, "router logits");
  check_dev(correction_bias, "router correction bias");
  check_dev(indices, "router indices");
  check_f32(weights, "router weights");
  const FloatType bt = float_type(correction_bias.dtype, "router correction bias");
  MOECEL_CHECK(logits.ndim() == 2, "router: logits must be (n_tokens, n_experts), got {}", shape_str(logits.shape));
  MOECEL_CHECK(indices.dtype == DType::kI32, "router: indices must be I32, got {}", dtype_name(indices.dtype));
  const int64_t n = logits.dim(0), n_experts = logits.dim(1);
  MOECEL_CHECK(correction_bias.numel() == n_experts, "router: correction bias must have {} values, got {}", n_experts,
               shape_str(correction_bias.shape));
  MOECEL_CHECK(n_experts <= cuda::kMaxGroupedExperts && n_group >= 1 && n_group <= cuda::kMaxGroups,
               "router: the CUDA backend's grouped router takes <= {} experts in <= {} groups, got {} in {}",
               cuda::kMaxGroupedExperts, cuda::kMaxGroups, n_experts, n_group);
  MOECEL_CHECK(n_experts % n_group == 0, "router: {} experts do not split into {} groups", n_experts, n_group);
  MOECEL_CHECK(topk_group >= 1, "router: topk_group must be at least 1, got {}", topk_group);
  const int64_t kept = std::min(topk_group, n_group) * (n_experts / n_group);
  MOECEL_CHECK(k >= 1 && k <= kept && k <= cuda::kMaxGroupedTopK,
               "router: top-k {} must be in [1, {}] (kept experts; the CUDA backend takes at most {})", k, kept,
               cuda::kMaxGroupedTopK);
  check_rows(indices, n, k, "router indices");
  check_rows(weights, n, k, "router weights");
  cuda::launch_router_grouped_topk(impl_->ctx, logits.ptr<float>(), correction_bias.data, bt, n, int(n_experts),
                                   n_group, topk_group, k, renormalize, scale, indices.ptr<int32_t>(),
                                   weights.ptr<float>());
}

}  // namespace moecel
#endif  // MOECEL_HAVE_CUDA
