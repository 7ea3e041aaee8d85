// Random MLX affine-quantized expert weights and routing for tests of the MoE paths (CPU tests and the CUDA
// parity tests): uniformly random codes, scales and biases that keep weights in about [-0.6, 1], and k distinct
// experts per token, like a router picks them.
#pragma once
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "core/half.h"
#include "core/tensor.h"
#include "quant/qweight.h"

namespace moecel::test {

struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 1) {}
  uint64_t next() {
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    return s * 2685821657736338717ull;
  }
  uint32_t u32() { return uint32_t(next() >> 32); }
  float uniform(float lo, float hi) { return lo + (hi - lo) * float(next() >> 40) * (1.0f / 16777216.0f); }
  int64_t below(int64_t n) { return int64_t(next() % uint64_t(n)); }
};

inline void store_float(Tensor& t, int64_t i, float v) {
  switch (t.dtype) {
    case DType::kF16: t.ptr<uint16_t>()[i] = f32_to_f16(v); break;
    case DType::kBF16: t.ptr<uint16_t>()[i] = f32_to_bf16(v); break;
    default: t.ptr<float>()[i] = v; break;
  }
}

inline Tensor random_tensor(DType dtype, Shape shape, Rng& rng, float lo = -1.0f, float hi = 1.0f) {
  Tensor t = make_host_tensor(dtype, std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) store_float(t, i, rng.uniform(lo, hi));
  return t;
}

// (n_stack, out, in) quantized with `bits` and `group_size`, scales and biases of sdtype.
inline LinearWeight random_quant(const std::string& name, int64_t n_stack, int64_t out, int64_t in, int bits,
                                 int group_size, DType sdtype, Rng& rng) {
  Tensor w = make_host_tensor(DType::kU32, {n_stack, out, in * bits / 32});
  for (int64_t i = 0; i < w.numel(); ++i) w.ptr<uint32_t>()[i] = rng.u32();
  const float qmax = float((1 << bits) - 1);
  Tensor s = random_tensor(sdtype, {n_stack, out, in / group_size}, rng, 0.5f / qmax, 1.5f / qmax);
  Tensor b = random_tensor(sdtype, {n_stack, out, in / group_size}, rng, -0.6f, -0.4f);
  return LinearWeight::quantized_from(name, w, s, b, QuantSpec{bits, group_size}, true);
}

// k distinct experts out of n_experts for each of n_tokens tokens, (n_tokens * k) ids.
inline std::vector<int32_t> random_experts(int64_t n_tokens, int64_t k, int64_t n_experts, Rng& rng) {
  std::vector<int32_t> out, perm(static_cast<size_t>(n_experts));
  for (int64_t t = 0; t < n_tokens; ++t) {
    std::iota(perm.begin(), perm.end(), 0);
    for (int64_t j = 0; j < k; ++j) {
      std::swap(perm[size_t(j)], perm[size_t(j + rng.below(n_experts - j))]);
      out.push_back(perm[size_t(j)]);
    }
  }
  return out;
}

// Positive routing weights summing to 1.
inline std::vector<float> random_route_weights(int64_t k, Rng& rng) {
  std::vector<float> w(static_cast<size_t>(k));
  float sum = 0;
  for (float& v : w) sum += (v = rng.uniform(0.05f, 1.0f));
  for (float& v : w) v /= sum;
  return w;
}

}  // namespace moecel::test
