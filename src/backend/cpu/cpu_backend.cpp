// CPU backend ops. Everything accumulates in f32; loops are kept plain so this file reads as the spec
// of each op. Work is split over the thread pool where a decode step spends real time.
#include "backend/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "backend/cpu/fused_moe.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/matmul_internal.h"
#include "backend/cpu/vec.h"
#include "backend/op_checks.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "quant/affine.h"

namespace moecel {

Tensor CpuBackend::alloc(DType dtype, Shape shape) {
  return make_host_tensor(dtype, std::move(shape));
}

void CpuBackend::to_host(const Tensor& src, void* dst) {
  std::memcpy(dst, src.data, src.nbytes());
}

void CpuBackend::from_host(const void* src, Tensor& dst) {
  std::memcpy(dst.data, src, dst.nbytes());
}

void CpuBackend::embedding(const LinearWeight& table, const Tensor& ids, Tensor& out) {
  check_f32_dtype(out, "embedding output");
  MOECEL_CHECK(ids.dtype == DType::kI32, "embedding: ids must be I32");
  const int64_t n = ids.numel();
  check_rows(out, n, table.in, "embedding output");
  const int32_t* id = ids.ptr<int32_t>();
  for (int64_t t = 0; t < n; ++t) {
    MOECEL_CHECK(id[t] >= 0 && id[t] < table.out, "token id {} is outside the vocabulary [0, {})", id[t], table.out);
    dequantize_row(table, 0, id[t], out.ptr<float>() + t * table.in);
  }
}

void CpuBackend::linear(const LinearWeight& w, const Tensor& x, Tensor& y) {
  check_f32_dtype(x, "linear input");
  check_f32_dtype(y, "linear output");
  const int64_t n = x.numel() / std::max<int64_t>(1, w.in);
  check_rows(x, n, w.in, w.name.c_str());
  check_rows(y, n, w.out, w.name.c_str());
  cpu::linear(w, 0, x.ptr<float>(), n, w.in, y.ptr<float>(), w.out);
}

void CpuBackend::gather_linear(const LinearWeight& w, const Tensor& x, const Tensor& indices, Tensor& y) {
  check_f32_dtype(x, "gather_linear input");
  check_f32_dtype(y, "gather_linear output");
  MOECEL_CHECK(indices.dtype == DType::kI32 && indices.ndim() == 2, "gather_linear: indices must be I32 (n_tokens, k)");
  const int64_t n = indices.dim(0), k = indices.dim(1);
  const bool per_slot = k > 1 && x.numel() == n * k * w.in;  // else one x row shared by the k slots
  if (!per_slot) check_rows(x, n, w.in, w.name.c_str());
  check_rows(y, n * k, w.out, w.name.c_str());
  cpu::gather_linear(w, x.ptr<float>(), per_slot, indices.ptr<int32_t>(), n, k, y.ptr<float>());
}

void CpuBackend::rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& y) {
  const int64_t d = weight.numel();
  const int64_t n = x.numel() / d;
  check_rows(x, n, d, "rms_norm input");
  check_rows(y, n, d, "rms_norm output");
  std::vector<float> wf(static_cast<size_t>(d));
  for (int64_t i = 0; i < d; ++i) wf[size_t(i)] = load_float(weight.data, weight.dtype, i);
  for (int64_t t = 0; t < n; ++t) {
    const float* xr = x.ptr<float>() + t * d;
    float* yr = y.ptr<float>() + t * d;
    double ss = 0;
    for (int64_t i = 0; i < d; ++i) ss += double(xr[i]) * xr[i];
    const float inv = 1.0f / std::sqrt(float(ss / double(d)) + eps);
    for (int64_t i = 0; i < d; ++i) yr[i] = xr[i] * inv * wf[size_t(i)];
  }
}

void CpuBackend::rope(Tensor& x, int64_t pos0, int n_heads, int head_dim, int rot_dims, float theta) {
  const int64_t width = int64_t(n_heads) * head_dim;
  const int64_t n = x.numel() / width;
  check_rows(x, n, width, "rope input");
  MOECEL_CHECK(rot_dims % 2 == 0 && rot_dims <= head_dim, "rope: bad rotary dims {}", rot_dims);
  const int half = rot_dims / 2;
  std::vector<double> inv_freq(static_cast<size_t>(half));
  for (int i = 0; i < half; ++i) inv_freq[size_t(i)] = std::pow(double(theta), -2.0 * i / rot_dims);
  for (int64_t t = 0; t < n; ++t) {
    const double pos = double(pos0 + t);
    for (int i = 0; i < half; ++i) {
      // f32 angle like the references (transformers computes pos * inv_freq in f32).
      const float ang = float(pos) * float(inv_freq[size_t(i)]);
      const float c = std::cos(ang), s = std::sin(ang);
      for (int h = 0; h < n_heads; ++h) {
        float* v = x.ptr<float>() + t * width + int64_t(h) * head_dim;
        const float a = v[i], b = v[i + half];
        v[i] = a * c - b * s;
        v[i + half] = b * c + a * s;
      }
    }
  }
}

void CpuBackend::kv_store(const Tensor& k, const Tensor& v, Tensor& k_cache, Tensor& v_cache, int64_t pos0) {
  const int64_t width = k_cache.dim(-1);
  const int64_t n = k.numel() / width;
  MOECEL_CHECK(pos0 >= 0 && pos0 + n <= k_cache.dim(0), "context length {} exceeds the KV cache size {}", pos0 + n,
               k_cache.dim(0));
  std::memcpy(k_cache.ptr<float>() + pos0 * width, k.data, size_t(n * width) * 4);
  std::memcpy(v_cache.ptr<float>() + pos0 * width, v.data, size_t(n * width) * 4);
}

void CpuBackend::attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, int64_t pos0, int n_heads,
                           int n_kv_heads, int head_dim, float scale, int window, Tensor& out) {
  const int64_t q_width = int64_t(n_heads) * head_dim, kv_width = int64_t(n_kv_heads) * head_dim;
  const int64_t n = q.numel() / q_width;
  MOECEL_CHECK(n_heads % n_kv_heads == 0, "attention: n_heads {} not a multiple of n_kv_heads {}", n_heads, n_kv_heads);
  const int group = n_heads / n_kv_heads;
  // Heads [h0, h1) of token t. They walk the cache rows together, position by position, so each row is read
  // once and in order (a row's heads are adjacent); per head the arithmetic and its order are those of one head
  // alone.
  auto heads = [&](int64_t t, int h0, int h1) {
    const int64_t last = pos0 + t;  // causal: attend to [first, last]
    const int64_t first = window > 0 ? std::max<int64_t>(0, last - window + 1) : 0;
    const int64_t len = last - first + 1, nh = h1 - h0;
    const float* qt = q.ptr<float>() + t * q_width;
    float* ot = out.ptr<float>() + t * q_width;
    auto kv_off = [&](int h) { return int64_t(h / group) * head_dim; };
    std::vector<float> scores(size_t(nh * len)), mx(size_t(nh), -INFINITY), sum(size_t(nh), 0.0f);  // (nh, len)
    for (int64_t p = first; p <= last; ++p) {
      const float* krow = k_cache.ptr<float>() + p * kv_width;
      for (int h = h0; h < h1; ++h) {
        const float s = cpu::dot(qt + int64_t(h) * head_dim, krow + kv_off(h), head_dim) * scale;
        scores[size_t((h - h0) * len + (p - first))] = s;
        mx[size_t(h - h0)] = std::max(mx[size_t(h - h0)], s);
      }
    }
    for (int64_t i = 0; i < nh; ++i)
      for (int64_t p = 0; p < len; ++p) {
        float& s = scores[size_t(i * len + p)];
        sum[size_t(i)] += (s = std::exp(s - mx[size_t(i)]));
      }
    std::fill(ot + int64_t(h0) * head_dim, ot + int64_t(h1) * head_dim, 0.0f);
    for (int64_t p = first; p <= last; ++p) {
      const float* vrow = v_cache.ptr<float>() + p * kv_width;
      for (int h = h0; h < h1; ++h) {
        const float pw = scores[size_t((h - h0) * len + (p - first))] / sum[size_t(h - h0)];
        cpu::axpy(pw, vrow + kv_off(h), ot + int64_t(h) * head_dim, head_dim);
      }
    }
  };
  // One token: its heads split over the threads. Several: a token (all heads) per task, handed out in turn,
  // since later tokens attend to more rows.
  if (n == 1)
    parallel_for(n_heads, 1, [&](int64_t b, int64_t e) { heads(0, int(b), int(e)); });
  else
    cpu::detail::run_tasks(n, [&](int64_t t) { heads(t, 0, n_heads); });
}

void CpuBackend::glu(Activation act, const Tensor& gate, const Tensor& up, Tensor& out) {
  const int64_t n = gate.numel();
  const float* g = gate.ptr<float>();
  const float* u = up.ptr<float>();
  float* o = out.ptr<float>();
  for (int64_t i = 0; i < n; ++i) o[i] = cpu::glu_activation(act, g[i]) * u[i];
}

void CpuBackend::add(const Tensor& a, const Tensor& b, Tensor& out) {
  MOECEL_CHECK(a.numel() == b.numel() && a.numel() == out.numel(), "add: shapes {} and {} differ", shape_str(a.shape),
               shape_str(b.shape));
  const float* x = a.ptr<float>();
  const float* y = b.ptr<float>();
  float* o = out.ptr<float>();
  for (int64_t i = 0; i < a.numel(); ++i) o[i] = x[i] + y[i];
}

void CpuBackend::clamp(Tensor& x, float limit) {
  float* p = x.ptr<float>();
  for (int64_t i = 0; i < x.numel(); ++i) p[i] = std::clamp(p[i], -limit, limit);
}

void CpuBackend::router_topk(const Tensor& logits, RouterScoring scoring, int k, bool renormalize, Tensor& indices,
                             Tensor& weights) {
  const int64_t n = logits.dim(0), n_experts = logits.dim(1);
  MOECEL_CHECK(k >= 1 && k <= n_experts, "router: top-k {} must be in [1, {}]", k, n_experts);
  std::vector<float> score(static_cast<size_t>(n_experts));
  std::vector<int32_t> order(static_cast<size_t>(n_experts));
  for (int64_t t = 0; t < n; ++t) {
    const float* l = logits.ptr<float>() + t * n_experts;
    std::copy(l, l + n_experts, score.begin());
    if (scoring == RouterScoring::kSoftmax) {
      const float mx = *std::max_element(score.begin(), score.end());
      float sum = 0;
      for (float& s : score) sum += (s = std::exp(s - mx));
      for (float& s : score) s /= sum;
    }
    std::iota(order.begin(), order.end(), 0);
    // Highest score first; the lower expert index wins a tie.
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
      return score[size_t(a)] > score[size_t(b)] || (score[size_t(a)] == score[size_t(b)] && a < b);
    });
    int32_t* idx = indices.ptr<int32_t>() + t * k;
    float* w = weights.ptr<float>() + t * k;
    for (int j = 0; j < k; ++j) {
      idx[j] = order[size_t(j)];
      w[j] = score[size_t(order[size_t(j)])];
    }
    if (scoring == RouterScoring::kTopKSoftmax) {
      const float mx = w[0];
      float sum = 0;
      for (int j = 0; j < k; ++j) sum += (w[j] = std::exp(w[j] - mx));
      for (int j = 0; j < k; ++j) w[j] /= sum;
    }
    if (renormalize) {
      float sum = 0;
      for (int j = 0; j < k; ++j) sum += w[j];
      for (int j = 0; j < k; ++j) w[j] /= sum;
    }
  }
}

void CpuBackend::moe_weighted_sum(const Tensor& y, const Tensor& weights, Tensor& out) {
  const int64_t n = weights.dim(0), k = weights.dim(1);
  const int64_t h = out.numel() / n;
  check_rows(y, n * k, h, "moe_weighted_sum input");
  for (int64_t t = 0; t < n; ++t) {
    float* o = out.ptr<float>() + t * h;
    std::fill(o, o + h, 0.0f);
    for (int64_t j = 0; j < k; ++j) {
      cpu::axpy(weights.ptr<float>()[t * k + j], y.ptr<float>() + (t * k + j) * h, o, h);
    }
  }
}

void CpuBackend::fused_moe(const LinearWeight& gate, const LinearWeight& up, const LinearWeight& down, Activation act,
                           const Tensor& x, const Tensor& indices, const Tensor& weights, Tensor& out) {
  const int64_t k = indices.numel();
  MOECEL_CHECK(indices.dtype == DType::kI32 && weights.dtype == DType::kF32 && weights.numel() == k,
               "fused_moe: indices must be I32 and weights F32 with the same count");
  check_rows(x, 1, gate.in, "fused_moe input");
  check_rows(out, 1, gate.in, "fused_moe output");
  cpu::fused_moe_decode(gate, up, down, act, x.ptr<float>(), indices.ptr<int32_t>(), weights.ptr<float>(), k,
                        out.ptr<float>());
}

std::vector<int32_t> CpuBackend::argmax(const Tensor& logits) {
  const int64_t v = logits.dim(-1), n = logits.numel() / v;
  std::vector<int32_t> out(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) {
    const float* l = logits.ptr<float>() + t * v;
    out[size_t(t)] = int32_t(std::max_element(l, l + v) - l);
  }
  return out;
}

}  // namespace moecel
