// The op interface that models call. Models never touch a device API: they allocate activations and
// run ops through a Backend. The CPU backend is the plain f32 oracle; the CUDA backend implements the same
// ops (plus fused entry points) and must agree with it.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
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

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;
  virtual Device device() const = 0;

  // ---- memory ----
  virtual Tensor alloc(DType dtype, Shape shape) = 0;  // zero-initialized, on this device
  virtual Tensor to_device(const Tensor& host) = 0;    // a host tensor (e.g. mmap'd weight) on this device
  virtual void to_host(const Tensor& src, void* dst) = 0;        // copies src.nbytes() bytes
  virtual void from_host(const void* src, Tensor& dst) = 0;      // copies dst.nbytes() bytes
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
  virtual void attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, int64_t pos0,
                         int n_heads, int n_kv_heads, int head_dim, float scale, int window, Tensor& out) = 0;
  // out = act(gate) * up, all (n, width)
  virtual void glu(Activation act, const Tensor& gate, const Tensor& up, Tensor& out) = 0;
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
  // logits (n_tokens, vocab) -> the argmax of each row (lowest index on ties)
  virtual std::vector<int32_t> argmax(const Tensor& logits) = 0;
  // Waits for queued work (no-op on CPU).
  virtual void synchronize() {}
};

// "cpu" or "cuda"; throws moecel::Error naming the choices for anything else or an unavailable backend.
std::unique_ptr<Backend> make_backend(std::string_view name);

}  // namespace moecel
