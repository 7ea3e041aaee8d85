// A single-token MoE expert-block problem with random MLX-quantized experts, and its all-f32 reference
// (accumulated in double, from MLX's own dequantization of every row): what the fused and gather paths are
// checked against on the CPU (tests/model) and on CUDA (tests/backend).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "models/weights.h"
#include "quant/affine.h"
#include "random_weights.h"

namespace moecel::test {

struct MoeCase {
  int gate_bits, down_bits, group_size;
  int64_t n_experts, hidden, ffn, k;
  Activation act;
  DType sdtype;
};

struct MoeProblem {
  SwitchWeights w;  // host weights
  std::vector<float> x, route_w;
  std::vector<int32_t> idx;
};

inline MoeProblem make_moe_problem(const MoeCase& c, uint64_t seed) {
  Rng rng(seed);
  MoeProblem p;
  p.w.gate = random_quant("g", c.n_experts, c.ffn, c.hidden, c.gate_bits, c.group_size, c.sdtype, rng);
  p.w.up = random_quant("u", c.n_experts, c.ffn, c.hidden, c.gate_bits, c.group_size, c.sdtype, rng);
  p.w.down = random_quant("d", c.n_experts, c.hidden, c.ffn, c.down_bits, c.group_size, c.sdtype, rng);
  p.x.resize(static_cast<size_t>(c.hidden));
  for (float& v : p.x) v = rng.uniform(-1.0f, 1.0f) * 0.05f;
  p.idx = random_experts(1, c.k, c.n_experts, rng);
  p.route_w = random_route_weights(c.k, rng);
  return p;
}

inline double activation_ref(Activation a, double g) {
  switch (a) {
    case Activation::kSiLU: return g / (1.0 + std::exp(-g));
    case Activation::kGeLU: return 0.5 * g * (1.0 + std::tanh(0.7978845608028654 * (g + 0.044715 * g * g * g)));
    case Activation::kReLU2: return g > 0 ? g * g : 0.0;
  }
  return 0;
}

// out (hidden,) = sum_j route_w[j] * down[e_j] @ (act(gate[e_j] @ x) * (up[e_j] @ x)).
inline std::vector<float> moe_reference(const MoeProblem& p, Activation act) {
  const int64_t hidden = p.w.gate.in, ffn = p.w.gate.out;
  std::vector<double> out(static_cast<size_t>(hidden), 0.0), a(static_cast<size_t>(ffn));
  std::vector<float> row(static_cast<size_t>(std::max(hidden, ffn)));
  for (size_t j = 0; j < p.idx.size(); ++j) {
    const int64_t e = p.idx[j];
    for (int64_t r = 0; r < ffn; ++r) {
      double g = 0, u = 0;
      dequantize_row(p.w.gate, e, r, row.data());
      for (int64_t i = 0; i < hidden; ++i) g += double(row[size_t(i)]) * p.x[size_t(i)];
      dequantize_row(p.w.up, e, r, row.data());
      for (int64_t i = 0; i < hidden; ++i) u += double(row[size_t(i)]) * p.x[size_t(i)];
      a[size_t(r)] = activation_ref(act, g) * u;
    }
    for (int64_t h = 0; h < hidden; ++h) {
      dequantize_row(p.w.down, e, h, row.data());
      double d = 0;
      for (int64_t r = 0; r < ffn; ++r) d += double(row[size_t(r)]) * a[size_t(r)];
      out[size_t(h)] += double(p.route_w[j]) * d;
    }
  }
  return std::vector<float>(out.begin(), out.end());
}

// sqrt(sum (got - ref)^2 / sum ref^2)
inline double normalized_rms(const std::vector<float>& got, const std::vector<float>& ref) {
  double e = 0, n = 0;
  for (size_t i = 0; i < ref.size() && i < got.size(); ++i) {
    e += (double(got[i]) - ref[i]) * (double(got[i]) - ref[i]);
    n += double(ref[i]) * ref[i];
  }
  return std::sqrt(e / n);
}

}  // namespace moecel::test
