// The op interface that models call. Models never touch a device API: they allocate activations and
// run ops through a Backend. The CPU backend is the plain f32 oracle; the CUDA backend implements the same
// ops (plus fused entry points) and must agree with it.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "quant/qweight.h"

namespace moecel {

enum class Activation { kSiLU, kGeLU, kReLU2 };  // GLU variants: act(gate) * up

// How router logits become (expert index, weight) pairs.
enum class RouterScoring {
  kSoftmax,      // softmax over all experts in f32, then top-k of the probabilities (olmoe, qwen)
  kTopKSoftmax,  // top-k of the logits, then softmax over those k (mixtral)
};

// Recorded single-token decode steps (see Backend::capture_decode), replayed at any position of their KV cache: one
// step, or steps() steps at positions pos, pos + 1, ..., each fed the greedy token of the step before on the device.
class DecodeGraph {
 public:
  virtual ~DecodeGraph() = default;
  // Enqueues one replay without waiting for it: its first input id is `id` or, with `chain`, the last output of the
  // replay enqueued just before (copied on the device, so the host need not know it yet); `pos` goes to the device
  // step position. Two replays may be in flight, on slots 0 and 1: `slot` holds this replay's outputs until
  // wait(slot).
  virtual void launch(int32_t id, bool chain, int64_t pos, int slot) = 0;
  // Waits for the replay enqueued on `slot` and returns the token id its last step wrote (the greedy next token).
  virtual int32_t wait(int slot) = 0;
  // Decode steps per replay.
  virtual int steps() const { return 1; }
  // After wait(slot): the token id step i (< steps()) of that replay wrote.
  virtual int32_t output(int slot, int i) = 0;
  // One step, waited for.
  int32_t run(int32_t id, int64_t pos) {
    launch(id, false, pos, 0);
    return wait(0);
  }
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;
  virtual Device device() const = 0;

  // ---- memory ----
  virtual Tensor alloc(DType dtype, Shape shape) = 0;  // zero-initialized, on this device
  // Like alloc, contents undefined: for outputs that an op overwrites completely.
  virtual Tensor scratch(DType dtype, Shape shape) { return alloc(dtype, std::move(shape)); }
  virtual Tensor to_device(const Tensor& host) = 0;          // a host tensor (e.g. mmap'd weight) on this device
  virtual void to_host(const Tensor& src, void* dst) = 0;    // copies src.nbytes() bytes
  virtual void from_host(const void* src, Tensor& dst) = 0;  // copies dst.nbytes() bytes
  LinearWeight to_device(const LinearWeight& w);

  // ---- ops; activations are F32, row-major, outermost first ----
  // ids I32 (n_tokens,); table (vocab_size, hidden_size); out (n_tokens, hidden_size)
  virtual void embedding(const LinearWeight& table, const Tensor& ids, Tensor& out) = 0;
  // x (n_tokens, in); y (n_tokens, out) = x @ w^T (w 2-D)
  virtual void linear(const LinearWeight& w, const Tensor& x, Tensor& y) = 0;
  // The gather path (like MLX's gather_qmm): w (n_experts, out, in); indices I32 (n_tokens, k);
  // x (n_tokens, in) shared by the k slots, or (n_tokens, k, in) one row per slot;
  // y (n_tokens, k, out): y[t, j] = w[indices[t, j]] @ x[t (, j)]
  virtual void gather_linear(const LinearWeight& w, const Tensor& x, const Tensor& indices, Tensor& y) = 0;
  // x, y (n_tokens, d) (may alias); weight (d,) F32/F16/BF16
  virtual void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& y) = 0;
  // x (n_tokens, n_heads * head_dim), in place; NeoX "rotate half" rotary over the first rot_dims of each
  // head; token i has position pos0 + i.
  virtual void rope(Tensor& x, int64_t pos0, int n_heads, int head_dim, int rot_dims, float theta) = 0;
  // Writes k, v (n_tokens, n_kv_heads * head_dim) into cache rows [pos0, pos0 + n_tokens).
  // k_cache, v_cache (max_positions, n_kv_heads * head_dim)
  virtual void kv_store(const Tensor& k, const Tensor& v, Tensor& k_cache, Tensor& v_cache, int64_t pos0) = 0;
  // Causal attention of q (n_tokens, n_heads * head_dim) over cache rows [0, pos0 + i] for token i
  // (only the last `window` rows when window > 0); GQA when n_kv_heads < n_heads.
  // out (n_tokens, n_heads * head_dim)
  virtual void attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, int64_t pos0, int n_heads,
                         int n_kv_heads, int head_dim, float scale, int window, Tensor& out) = 0;
  // out = act(gate) * up, all (n, width)
  virtual void glu(Activation act, const Tensor& gate, const Tensor& up, Tensor& out) = 0;
  // The first half of the gather path of a GLU expert block: out (n_tokens, k, ffn) = act(gate[e] @ x[t]) *
  // (up[e] @ x[t]), e = indices[t, j]; gate, up (n_experts, ffn, in); x (n_tokens, in). Default: gather_linear of
  // gate and of up, then glu (a backend may fuse them, not change the results).
  virtual void gather_glu(const LinearWeight& gate, const LinearWeight& up, Activation act, const Tensor& x,
                          const Tensor& indices, Tensor& out);
  // out = a + b (same shape; out may alias either)
  virtual void add(const Tensor& a, const Tensor& b, Tensor& out) = 0;
  // x = clamp(x, -limit, limit), in place
  virtual void clamp(Tensor& x, float limit) = 0;
  // logits (n_tokens, n_experts) -> indices I32 (n_tokens, k), weights F32 (n_tokens, k), in f32.
  // renormalize: divide the k weights by their sum.
  virtual void router_topk(const Tensor& logits, RouterScoring scoring, int k, bool renormalize, Tensor& indices,
                           Tensor& weights) = 0;
  // y (n_tokens, k, hidden), weights (n_tokens, k) -> out (n_tokens, hidden) = sum_j weights[t, j] * y[t, j]
  virtual void moe_weighted_sum(const Tensor& y, const Tensor& weights, Tensor& out) = 0;
  // residual (n_tokens, hidden) += moe_weighted_sum(y, weights), rounded exactly as moe_weighted_sum then add.
  virtual void moe_weighted_sum_add(const Tensor& y, const Tensor& weights, Tensor& residual);
  // logits (n_tokens, vocab) -> the argmax of each row (lowest index on ties)
  virtual std::vector<int32_t> argmax(const Tensor& logits) = 0;
  // ---- fused entry points: the same results as the ops they name, in sequence (defaults do exactly that) ----
  // sum = a + b (sum may alias a or b), then y = rms_norm(sum) (y must not alias them).
  virtual void add_rms_norm(const Tensor& a, const Tensor& b, Tensor& sum, const Tensor& weight, float eps, Tensor& y) {
    add(a, b, sum);
    rms_norm(sum, weight, eps, y);
  }
  // The attention prologue: q = rope(rms_norm(q, q_norm)), k = rope(rms_norm(k, k_norm)) in place (norms over the
  // full projection width, rope of every head over rot_dims at positions pos0...), then kv_store(k, v) at pos0.
  virtual void qk_norm_rope_store(Tensor& q, Tensor& k, const Tensor& v, const Tensor& q_norm, const Tensor& k_norm,
                                  float eps, int n_heads, int n_kv_heads, int head_dim, int rot_dims, float theta,
                                  Tensor& k_cache, Tensor& v_cache, int64_t pos0) {
    rms_norm(q, q_norm, eps, q);
    rms_norm(k, k_norm, eps, k);
    rope(q, pos0, n_heads, head_dim, rot_dims, theta);
    rope(k, pos0, n_kv_heads, head_dim, rot_dims, theta);
    kv_store(k, v, k_cache, v_cache, pos0);
  }
  // qk_norm_rope_store, then attention(q, k_cache, v_cache, pos0, ...) into out (n_tokens, n_heads * head_dim): the
  // attention block of full-width q/k norms. Afterwards q and k hold what qk_norm_rope_store leaves or, where a
  // backend fuses the two (CUDA, one decode token), their inputs.
  virtual void qk_norm_rope_attention(Tensor& q, Tensor& k, const Tensor& v, const Tensor& q_norm, const Tensor& k_norm,
                                      float eps, int n_heads, int n_kv_heads, int head_dim, int rot_dims, float theta,
                                      Tensor& k_cache, Tensor& v_cache, int64_t pos0, float scale, int window,
                                      Tensor& out) {
    qk_norm_rope_store(q, k, v, q_norm, k_norm, eps, n_heads, n_kv_heads, head_dim, rot_dims, theta, k_cache, v_cache,
                       pos0);
    attention(q, k_cache, v_cache, pos0, n_heads, n_kv_heads, head_dim, scale, window, out);
  }
  // xn = rms_norm(x, norm_weight), then ys[i] = linear(*ws[i], xn) for every i (e.g. q, k and v from one
  // input); xn is also written to *xn_out when given. x (n_tokens, d); ws[i] (out_i, d); ys[i] (n_tokens, out_i).
  // No output may overlap x.
  virtual void rms_norm_linears(const Tensor& x, const Tensor& norm_weight, float eps,
                                std::span<const LinearWeight* const> ws, std::span<Tensor* const> ys, Tensor* xn_out);
  // residual (n_tokens, out) += linear(w, x), x (n_tokens, in) not overlapping residual (an output projection
  // added to the residual stream).
  virtual void linear_residual(const LinearWeight& w, const Tensor& x, Tensor& residual);
  // A router on a normalized input: xn = rms_norm(x, norm_weight), logits = linear(router, xn), then
  // router_topk(logits, scoring, k, renormalize) -> indices, weights. x, xn (n_tokens, d); logits
  // (n_tokens, n_experts).
  virtual void rms_norm_router(const Tensor& x, const Tensor& norm_weight, float eps, const LinearWeight& router,
                               RouterScoring scoring, int k, bool renormalize, Tensor& xn, Tensor& logits,
                               Tensor& indices, Tensor& weights);
  // An output projection into the residual stream, then the router of the MoE block after it: residual +=
  // linear(w, x), then rms_norm_router(residual, norm_weight, ...). One op so that a backend may compute the
  // router's logits inside the projection's launch (CUDA decode). x (n_tokens, in); residual, xn (n_tokens, d).
  virtual void linear_residual_norm_router(const LinearWeight& w, const Tensor& x, Tensor& residual,
                                           const Tensor& norm_weight, float eps, const LinearWeight& router,
                                           RouterScoring scoring, int k, bool renormalize, Tensor& xn, Tensor& logits,
                                           Tensor& indices, Tensor& weights);
  // ---- the fused single-token decode-MoE path (DESIGN.md section 5; gating lives in SwitchGLU) ----
  // Largest moe_intermediate_size the fused path takes on this backend by default (0: no fused path).
  virtual int64_t fused_moe_default_max_dff() const { return 0; }
  // out (1, hidden) = sum_j weights[j] * down[e_j] @ act(gate[e_j] @ x, up[e_j] @ x), e_j = indices[j], with
  // f32 intermediates and partials, the k partials summed in order j = 0..k-1, one final write.
  // gate, up (n_experts, ffn, hidden); down (n_experts, hidden, ffn); x (1, hidden); indices I32 (1, k);
  // weights F32 (1, k). Only called for weights SwitchGLU found eligible.
  virtual void fused_moe(const LinearWeight& gate, const LinearWeight& up, const LinearWeight& down, Activation act,
                         const Tensor& x, const Tensor& indices, const Tensor& weights, Tensor& out);
  // residual (1, hidden) += fused_moe(...) with the same arguments: the MoE block's output added to the residual
  // stream, rounded exactly as fused_moe then add would.
  virtual void fused_moe_add(const LinearWeight& gate, const LinearWeight& up, const LinearWeight& down, Activation act,
                             const Tensor& x, const Tensor& indices, const Tensor& weights, Tensor& residual);
  // One token's o projection, router and fused experts: linear_residual_norm_router(w, x, residual, norm_weight, eps,
  // router, scoring, k, renormalize, ...) -> indices, weights, then fused_moe_add(gate, up, down, act, its normalized
  // input, indices, weights, residual). One op so that a backend may rank the router inside the expert kernels (CUDA:
  // no router launch); the ranking and weights may round differently from the ops one by one. x (1, in); residual
  // (1, d); indices I32 (1, k), weights (1, k). Only called for experts SwitchGLU found eligible.
  virtual void linear_residual_router_fused_moe_add(const LinearWeight& w, const Tensor& x, Tensor& residual,
                                                    const Tensor& norm_weight, float eps, const LinearWeight& router,
                                                    RouterScoring scoring, int k, bool renormalize,
                                                    const LinearWeight& gate, const LinearWeight& up,
                                                    const LinearWeight& down, Activation act, Tensor& indices,
                                                    Tensor& weights);
  // logits (n_tokens, vocab) -> ids I32 (n_tokens,) on this device, without waiting for the host.
  virtual void argmax_to(const Tensor& logits, Tensor& ids) {
    const std::vector<int32_t> v = argmax(logits);
    from_host(v.data(), ids);
  }
  // A greedy step's tail: rms_norm_linears(x, norm_weight, eps, {&w}, {&logits}, nullptr), then argmax_to(logits,
  // ids). x (1, d), logits (1, w.out), ids (1,) I32.
  virtual void rms_norm_linear_argmax(const Tensor& x, const Tensor& norm_weight, float eps, const LinearWeight& w,
                                      Tensor& logits, Tensor& ids) {
    const LinearWeight* ws[] = {&w};
    Tensor* ys[] = {&logits};
    rms_norm_linears(x, norm_weight, eps, ws, ys, nullptr);
    argmax_to(logits, ids);
  }
  // Bytes free on this backend's device for weights; UINT64_MAX when the backend uses host memory (load_model
  // checks that separately).
  virtual uint64_t device_free_bytes() const { return UINT64_MAX; }
  // Waits for queued work (no-op on CPU).
  virtual void synchronize() {}

  // ---- decode graphs (optional; the CPU backend has none) ----
  // Records the ops that `record` issues, without running them, as a replayable graph. While recording, rope,
  // kv_store and attention take their position from a device-side step position that DecodeGraph::run sets, not
  // from pos0 (which is only validated), and every buffer allocated stays reserved for the graph. `ids` (1,) I32
  // is the step's input token, `next` (1,) I32 the token it writes (argmax_to). No op may wait for the host while
  // recording. The graph bakes in the addresses of every tensor the ops use (weights, KV cache, ids, next): those
  // must outlive it, and the backend too. Returns nullptr when the backend has no graphs.
  virtual std::unique_ptr<DecodeGraph> capture_decode(const std::function<void()>& record, const Tensor& ids,
                                                      const Tensor& next) {
    (void)record, (void)ids, (void)next;
    return nullptr;
  }

  // ---- ops of the qwen2_moe, qwen3_moe and dots1 blocks (CPU: cpu/bias_router_ops.cpp; CUDA: bias_ops.cu,
  // router_grouped.cu) ----
  // x (n_tokens, d) += bias (d,) on every row, in place; bias F32/F16/BF16 (a linear layer's bias).
  virtual void add_bias(Tensor& x, const Tensor& bias);
  // out (n_tokens, d) = a + sigmoid(gate[t]) * b with gate (n_tokens, 1): a shared expert b scaled by its sigmoid
  // gate (qwen2_moe), added to the routed experts' output a. out may alias a or b.
  virtual void add_sigmoid_gated(const Tensor& a, const Tensor& gate, const Tensor& b, Tensor& out);
  // Grouped sigmoid routing with a correction bias that only selects (dots1, like DeepSeek-V3's "noaux_tc"), f32:
  //   s = sigmoid(logits), c = s + correction_bias; the n_experts form n_group equal groups in index order, a
  //   group scores the sum of its two largest c, and only the topk_group best groups stay (all of them when
  //   topk_group >= n_group); the k largest c of the kept experts are selected, highest first, the lower index
  //   winning a tie (groups too); weights = s of the selected, divided by (their sum + 1e-20) when renormalize,
  //   then times scale.
  // logits (n_tokens, n_experts); correction_bias (n_experts,) F32/F16/BF16 -> indices I32 (n_tokens, k),
  // weights F32 (n_tokens, k).
  virtual void router_grouped_topk(const Tensor& logits, const Tensor& correction_bias, int n_group, int topk_group,
                                   int k, bool renormalize, float scale, Tensor& indices, Tensor& weights);
};

// "cpu" or "cuda"; throws moecel::Error naming the choices for anything else or an unavailable backend.
std::unique_ptr<Backend> make_backend(std::string_view name);

}  // namespace moecel
