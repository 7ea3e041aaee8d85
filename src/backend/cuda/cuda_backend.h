// The CUDA backend (NVIDIA Hopper, sm_90a): device tensors from a caching allocator, all work on one stream,
// every op validated on the host and checked against the CPU backend by tests/backend. Plain C++ header (no
// CUDA types), so host code and tests include it without the CUDA toolkit's headers.
#pragma once
#include <memory>
#include <string>

#include "backend/backend.h"

namespace moecel {

// Number of usable CUDA devices; 0 (with the reason in *why) when there is none or the driver cannot be used.
// Never throws.
int cuda_device_count(std::string* why = nullptr);

class CudaBackend final : public Backend {
 public:
  // Throws moecel::Error ("--backend cuda: no CUDA device found (...)") when no device is usable.
  explicit CudaBackend(int device = 0);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  std::string_view name() const override { return "cuda"; }
  Device device() const override { return Device::kCuda; }

  Tensor alloc(DType dtype, Shape shape) override;
  Tensor scratch(DType dtype, Shape shape) override;  // no memset
  Tensor to_device(const Tensor& host) override;
  using Backend::to_device;
  void to_host(const Tensor& src, void* dst) override;
  void from_host(const void* src, Tensor& dst) override;

  void embedding(const LinearWeight& table, const Tensor& ids, Tensor& out) override;
  void linear(const LinearWeight& w, const Tensor& x, Tensor& y) override;
  void gather_linear(const LinearWeight& w, const Tensor& x, const Tensor& indices, Tensor& y) override;
  void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& y) override;
  void rope(Tensor& x, int64_t pos0, int n_heads, int head_dim, int rot_dims, float theta) override;
  void kv_store(const Tensor& k, const Tensor& v, Tensor& k_cache, Tensor& v_cache, int64_t pos0) override;
  void attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, int64_t pos0, int n_heads,
                 int n_kv_heads, int head_dim, float scale, int window, Tensor& out) override;
  void glu(Activation act, const Tensor& gate, const Tensor& up, Tensor& out) override;
  // Many tokens: one routing kernel and one tensor-core launch for gate and up with the activation in its epilogue.
  void gather_glu(const LinearWeight& gate, const LinearWeight& up, Activation act, const Tensor& x,
                  const Tensor& indices, Tensor& out) override;
  void add(const Tensor& a, const Tensor& b, Tensor& out) override;
  void add_rms_norm(const Tensor& a, const Tensor& b, Tensor& sum, const Tensor& weight, float eps, Tensor& y) override;
  void qk_norm_rope_attention(Tensor& q, Tensor& k, const Tensor& v, const Tensor& q_norm, const Tensor& k_norm,
                              float eps, int n_heads, int n_kv_heads, int head_dim, int rot_dims, float theta,
                              Tensor& k_cache, Tensor& v_cache, int64_t pos0, float scale, int window,
                              Tensor& out) override;
  void qk_norm_rope_store(Tensor& q, Tensor& k, const Tensor& v, const Tensor& q_norm, const Tensor& k_norm, float eps,
                          int n_heads, int n_kv_heads, int head_dim, int rot_dims, float theta, Tensor& k_cache,
                          Tensor& v_cache, int64_t pos0) override;
  void clamp(Tensor& x, float limit) override;
  void router_topk(const Tensor& logits, RouterScoring scoring, int k, bool renormalize, Tensor& indices,
                   Tensor& weights) override;
  void moe_weighted_sum(const Tensor& y, const Tensor& weights, Tensor& out) override;
  void moe_weighted_sum_add(const Tensor& y, const Tensor& weights, Tensor& residual) override;
  std::vector<int32_t> argmax(const Tensor& logits) override;
  // DESIGN.md's default cap: larger experts already fill the GPU on the gather path.
  int64_t fused_moe_default_max_dff() const override { return 8192; }
  void fused_moe(const LinearWeight& gate, const LinearWeight& up, const LinearWeight& down, Activation act,
                 const Tensor& x, const Tensor& indices, const Tensor& weights, Tensor& out) override;
  void fused_moe_add(const LinearWeight& gate, const LinearWeight& up, const LinearWeight& down, Activation act,
                     const Tensor& x, const Tensor& indices, const Tensor& weights, Tensor& residual) override;
  // One matrix-vector launch each for up to 4 tokens of quantized weights (norm, residual add and router top-k done
  // inside it); otherwise the Backend defaults.
  void rms_norm_linears(const Tensor& x, const Tensor& norm_weight, float eps, std::span<const LinearWeight* const> ws,
                        std::span<Tensor* const> ys, Tensor* xn_out) override;
  void linear_residual(const LinearWeight& w, const Tensor& x, Tensor& residual) override;
  void rms_norm_router(const Tensor& x, const Tensor& norm_weight, float eps, const LinearWeight& router,
                       RouterScoring scoring, int k, bool renormalize, Tensor& xn, Tensor& logits, Tensor& indices,
                       Tensor& weights) override;
  // Decode (up to 4 tokens, 4/8-bit o projection and router): the router's product in the o projection's launch
  // (RouterShare), then one launch for the logits, xn and the top-k.
  void linear_residual_norm_router(const LinearWeight& w, const Tensor& x, Tensor& residual, const Tensor& norm_weight,
                                   float eps, const LinearWeight& router, RouterScoring scoring, int k,
                                   bool renormalize, Tensor& xn, Tensor& logits, Tensor& indices,
                                   Tensor& weights) override;
  // One token whose o projection takes the router share's int8 kernel and whose experts take the int8 kernels A and
  // B (up to 64 experts, k <= 16), with MOECEL_CUDA_FUSED_ROUTE=1: the router ranked inside kernels A and B
  // (FusedMoeArgs::route; no router launch); otherwise the two ops.
  void linear_residual_router_fused_moe_add(const LinearWeight& w, const Tensor& x, Tensor& residual,
                                            const Tensor& norm_weight, float eps, const LinearWeight& router,
                                            RouterScoring scoring, int k, bool renormalize, const LinearWeight& gate,
                                            const LinearWeight& up, const LinearWeight& down, Activation act,
                                            Tensor& indices, Tensor& weights) override;
  void argmax_to(const Tensor& logits, Tensor& ids) override;
  void rms_norm_linear_argmax(const Tensor& x, const Tensor& norm_weight, float eps, const LinearWeight& w,
                              Tensor& logits, Tensor& ids) override;
  // cudaMemGetInfo's free bytes of this backend's device.
  uint64_t device_free_bytes() const override;
  // Waits for the stream, then throws if a kernel flagged bad input (token id / expert index out of range).
  void synchronize() override;
  // Stream capture into a CUDA graph (see Backend::capture_decode).
  std::unique_ptr<DecodeGraph> capture_decode(const std::function<void()>& record, const Tensor& ids,
                                              const Tensor& next) override;
  // Kernels in bias_ops.cu and router_grouped.cu.
  void add_bias(Tensor& x, const Tensor& bias) override;
  void add_sigmoid_gated(const Tensor& a, const Tensor& gate, const Tensor& b, Tensor& out) override;
  void router_grouped_topk(const Tensor& logits, const Tensor& correction_bias, int n_group, int topk_group, int k,
                           bool renormalize, float scale, Tensor& indices, Tensor& weights) override;

  // Bytes held by the caching allocator: handed out, and cached for reuse.
  size_t pool_live_bytes() const;
  size_t pool_cached_bytes() const;

  struct Impl;  // named by the .cpp's helper classes (decode graphs); defined there

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace moecel
