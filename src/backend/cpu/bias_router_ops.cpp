// CPU backend ops of the qwen2_moe, qwen3_moe and dots1 blocks: a linear layer's bias, the sigmoid-gated shared
// expert add, and grouped sigmoid routing with a selection-only correction bias. Plain f32 loops: the spec of each
// op that the CUDA kernels (bias_ops.cu, router_grouped.cu) are checked against.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/op_checks.h"
#include "core/error.h"
#include "quant/affine.h"

namespace moecel {
namespace {

float sigmoid(float x) {
  return 1.0f / (1.0f + std::exp(-x));
}

// Indices [0, n) ordered by score, highest first, the lower index winning a tie (NaN ranks last).
void order_by_score(const std::vector<float>& score, std::vector<int32_t>& order) {
  order.resize(score.size());
  std::iota(order.begin(), order.end(), 0);
  auto key = [&](int32_t i) { return std::isnan(score[size_t(i)]) ? -INFINITY : score[size_t(i)]; };
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return key(a) > key(b); });
}

}  // namespace

void CpuBackend::add_bias(Tensor& x, const Tensor& bias) {
  check_f32_dtype(x, "add_bias input");
  MOECEL_CHECK(is_float(bias.dtype) && bias.ndim() == 1, "add_bias: bias must be a float vector, got {} {}",
               dtype_name(bias.dtype), shape_str(bias.shape));
  const int64_t d = bias.numel();
  MOECEL_CHECK(d > 0 && x.numel() % d == 0, "add_bias: input {} is not rows of the bias width {}", shape_str(x.shape),
               d);
  std::vector<float> b(static_cast<size_t>(d));
  for (int64_t i = 0; i < d; ++i) b[size_t(i)] = load_float(bias.data, bias.dtype, i);
  float* p = x.ptr<float>();
  for (int64_t r = 0; r < x.numel() / d; ++r) {
    for (int64_t i = 0; i < d; ++i) p[r * d + i] += b[size_t(i)];
  }
}

void CpuBackend::add_sigmoid_gated(const Tensor& a, const Tensor& gate, const Tensor& b, Tensor& out) {
  const int64_t n = check_sigmoid_gated(a, gate, b, out);
  const int64_t d = a.numel() / n;
  for (int64_t t = 0; t < n; ++t) {
    const float s = sigmoid(gate.ptr<float>()[t]);
    const float* x = a.ptr<float>() + t * d;
    const float* y = b.ptr<float>() + t * d;
    float* o = out.ptr<float>() + t * d;
    for (int64_t i = 0; i < d; ++i) o[i] = x[i] + s * y[i];
  }
}

void CpuBackend::router_grouped_topk(const Tensor& logits, const Tensor& correction_bias, int n_group, int topk_group,
                                     int k, bool renormalize, float scale, Tensor& indices, Tensor& weights) {
  check_f32_dtype(logits, "router logits");
  check_f32_dtype(weights, "router weights");
  MOECEL_CHECK(logits.ndim() == 2, "router: logits must be (n_tokens, n_experts), got {}", shape_str(logits.shape));
  MOECEL_CHECK(indices.dtype == DType::kI32, "router: indices must be I32, got {}", dtype_name(indices.dtype));
  const int64_t n = logits.dim(0), n_experts = logits.dim(1);
  MOECEL_CHECK(is_float(correction_bias.dtype) && correction_bias.numel() == n_experts,
               "router: correction bias must be a float vector of {} experts, got {} {}", n_experts,
               dtype_name(correction_bias.dtype), shape_str(correction_bias.shape));
  MOECEL_CHECK(n_group >= 1 && n_experts % n_group == 0, "router: {} experts do not split into {} groups", n_experts,
               n_group);
  MOECEL_CHECK(topk_group >= 1, "router: topk_group must be at least 1, got {}", topk_group);
  const int64_t group_size = n_experts / n_group, kept_groups = std::min(topk_group, n_group);
  MOECEL_CHECK(k >= 1 && k <= kept_groups * group_size, "router: top-k {} must be in [1, {}] ({} of {} groups kept)", k,
               kept_groups * group_size, kept_groups, n_group);
  MOECEL_CHECK(indices.numel() == n * k && weights.numel() == n * k,
               "router: indices and weights must hold {} x {} values", n, k);
  std::vector<float> bias(static_cast<size_t>(n_experts)), s(bias.size()), c(bias.size());
  for (int64_t e = 0; e < n_experts; ++e) bias[size_t(e)] = load_float(correction_bias.data, correction_bias.dtype, e);
  std::vector<float> group_score(static_cast<size_t>(n_group));
  std::vector<int32_t> group_order, order;
  for (int64_t t = 0; t < n; ++t) {
    const float* l = logits.ptr<float>() + t * n_experts;
    for (int64_t e = 0; e < n_experts; ++e) {
      s[size_t(e)] = sigmoid(l[e]);
      c[size_t(e)] = s[size_t(e)] + bias[size_t(e)];
    }
    std::vector<float> choice = c;
    if (topk_group < n_group) {
      for (int g = 0; g < n_group; ++g) {  // sum of the group's two largest choice scores
        const float* cg = c.data() + g * group_size;
        float a = -INFINITY, b = -INFINITY;
        for (int64_t i = 0; i < group_size; ++i) {
          if (cg[i] > a) {
            b = a;
            a = cg[i];
          } else if (cg[i] > b) {
            b = cg[i];
          }
        }
        group_score[size_t(g)] = group_size >= 2 ? a + b : a;
      }
      order_by_score(group_score, group_order);
      for (int j = topk_group; j < n_group; ++j) {  // dropped groups can never be selected
        const int64_t g = group_order[size_t(j)];
        std::fill(choice.begin() + g * group_size, choice.begin() + (g + 1) * group_size, -INFINITY);
      }
    }
    order_by_score(choice, order);
    int32_t* idx = indices.ptr<int32_t>() + t * k;
    float* w = weights.ptr<float>() + t * k;
    float sum = 0;
    for (int j = 0; j < k; ++j) {
      idx[j] = order[size_t(j)];
      w[j] = s[size_t(idx[j])];
      sum += w[j];
    }
    for (int j = 0; j < k; ++j) {
      if (renormalize) w[j] /= sum + 1e-20f;
      w[j] *= scale;
    }
  }
}

}  // namespace moecel
