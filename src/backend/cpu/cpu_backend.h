// The CPU backend: plain, readable f32 ops (the oracle other backends are checked against), with the
// quantized products delegated to the SIMD kernels of cpu/matmul.h.
#pragma once
#include "backend/backend.h"

namespace moecel {

class CpuBackend final : public Backend {
 public:
  std::string_view name() const override { return "cpu"; }
  Device device() const override { return Device::kCpu; }

  Tensor alloc(DType dtype, Shape shape) override;
  Tensor to_device(const Tensor& host) override { return host; }
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
  void add(const Tensor& a, const Tensor& b, Tensor& out) override;
  void clamp(Tensor& x, float limit) override;
  void router_topk(const Tensor& logits, RouterScoring scoring, int k, bool renormalize, Tensor& indices,
                   Tensor& weights) override;
  void moe_weighted_sum(const Tensor& y, const Tensor& weights, Tensor& out) override;
  std::vector<int32_t> argmax(const Tensor& logits) override;
  // Not measured to lose anywhere on the CPU (the path is the gather path's row products, fused): the cap only
  // keeps the (k, ffn) intermediates small.
  int64_t fused_moe_default_max_dff() const override { return 16384; }
  void fused_moe(const LinearWeight& gate, const LinearWeight& up, const LinearWeight& down, Activation act,
                 const Tensor& x, const Tensor& indices, const Tensor& weights, Tensor& out) override;
  // Defined in bias_router_ops.cpp.
  void add_bias(Tensor& x, const Tensor& bias) override;
  void add_sigmoid_gated(const Tensor& a, const Tensor& gate, const Tensor& b, Tensor& out) override;
  void router_grouped_topk(const Tensor& logits, const Tensor& correction_bias, int n_group, int topk_group, int k,
                           bool renormalize, float scale, Tensor& indices, Tensor& weights) override;
};

}  // namespace moecel
