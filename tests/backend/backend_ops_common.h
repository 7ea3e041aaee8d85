// Shared pieces of the CUDA-vs-CPU op tests (test_backend_ops.cpp, test_mma_ops.cpp): error thresholds, OLMoE
// dimensions, random host tensors and weights, normalized MSE, and the CudaOps fixture (one CUDA backend for the
// whole binary; every test skips with "no CUDA device" without a GPU).
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <tuple>
#include <vector>

#include "../model/random_weights.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "core/error.h"
#include "core/half.h"
#include "quant/qweight.h"

namespace moecel::ops_test {

// Thresholds (normalized MSE). f32 rounding differences in a 2048-long dot product give ~1e-11; a single
// wrong row or mis-decoded value in a row of 2048 gives >= 1e-4, so these leave room on both sides.
constexpr double kExact = 0.0;          // add, clamp, argmax, router indices, embedding: bit-identical
constexpr double kElementwise = 1e-10;  // glu, rope, rms_norm, moe_weighted_sum, router weights
constexpr double kMatmul = 1e-7;        // linear, gather_linear (f32 dots of up to 2048 terms, other order)
constexpr double kAttention = 1e-8;     // online vs two-pass softmax in f32

// OLMoE-1B-7B dimensions.
constexpr int64_t kHidden = 2048, kExperts = 64, kTopK = 8, kFfn = 1024;
constexpr int kHeads = 16, kHeadDim = 128;

using test::Rng;
using test::store_float;

inline Tensor host_random(DType dtype, Shape shape, Rng& rng, float lo = -1.0f, float hi = 1.0f) {
  Tensor t = make_host_tensor(dtype, std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) store_float(t, i, rng.uniform(lo, hi));
  return t;
}

inline Tensor host_i32(Shape shape, const std::vector<int32_t>& v) {
  Tensor t = make_host_tensor(DType::kI32, std::move(shape));
  EXPECT_EQ(size_t(t.numel()), v.size());
  std::memcpy(t.data, v.data(), v.size() * 4);
  return t;
}

// Packed words are uniformly random (every code equally likely); w = s * q + b stays in about [-0.6, 1].
inline LinearWeight make_quant(int64_t n_stack, int64_t out, int64_t in, int bits, int group_size, DType sdtype,
                               Rng& rng) {
  const Shape lead = n_stack > 0 ? Shape{n_stack} : Shape{};
  auto shape = [&](int64_t cols) {
    Shape s = lead;
    s.push_back(out);
    s.push_back(cols);
    return s;
  };
  Tensor w = make_host_tensor(DType::kU32, shape(in * bits / 32));
  for (int64_t i = 0; i < w.numel(); ++i) w.ptr<uint32_t>()[i] = rng.u32();
  const float qmax = float((1 << bits) - 1);
  Tensor s = host_random(sdtype, shape(in / group_size), rng, 0.5f / qmax, 1.5f / qmax);
  Tensor b = host_random(sdtype, shape(in / group_size), rng, -0.6f, -0.4f);
  return LinearWeight::quantized_from("test.q", w, s, b, QuantSpec{bits, group_size}, n_stack > 0);
}

inline LinearWeight make_dense(int64_t n_stack, int64_t out, int64_t in, DType dtype, Rng& rng) {
  Shape s = n_stack > 0 ? Shape{n_stack, out, in} : Shape{out, in};
  return LinearWeight::dense_from("test.dense", host_random(dtype, s, rng), n_stack > 0);
}

using test::random_experts;

inline double nmse(const std::vector<float>& got, const std::vector<float>& ref) {
  EXPECT_EQ(got.size(), ref.size());
  double err = 0, norm = 0;
  for (size_t i = 0; i < ref.size() && i < got.size(); ++i) {
    const double d = double(got[i]) - double(ref[i]);
    err += d * d;
    norm += double(ref[i]) * double(ref[i]);
  }
  return err / std::max(norm, 1e-30);  // NaN in `got` propagates and fails every <= check
}

inline std::string dtype_str(DType t) {
  return std::string(dtype_name(t));
}

// ---- fixture ----

class CudaOps : public ::testing::Test {
 public:
  void SetUp() override {
    std::string why;
    if (cuda_device_count(&why) == 0) GTEST_SKIP() << "no CUDA device (" << why << ")";
    if (!backend_) backend_ = std::make_unique<CudaBackend>();
  }
  CudaBackend& cu() { return *backend_; }

  template <class T = float>
  std::vector<T> down(const Tensor& t) {
    std::vector<T> v(static_cast<size_t>(t.numel()));
    if (t.device == Device::kCuda) {
      cu().to_host(t, v.data());
    } else {
      std::memcpy(v.data(), t.data, t.nbytes());
    }
    return v;
  }

  CpuBackend cpu;  // the oracle

  // Drops the shared backend before the CUDA runtime shuts down at exit.
  static void release() { backend_.reset(); }

 private:
  static inline std::unique_ptr<CudaBackend> backend_;  // one device context for the whole binary
};

// A host F32 tensor's values.
inline std::vector<float> host_vec(const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  std::memcpy(v.data(), t.data, t.nbytes());
  return v;
}

inline std::vector<int32_t> host_i32_vec(const Tensor& t) {
  std::vector<int32_t> v(static_cast<size_t>(t.numel()));
  std::memcpy(v.data(), t.data, t.nbytes());
  return v;
}

// A tensor of backend `be` copied to the host.
template <class T>
std::vector<T> dev_vec(CudaBackend& be, const Tensor& t) {
  std::vector<T> v(static_cast<size_t>(t.numel()));
  be.to_host(t, v.data());
  return v;
}

}  // namespace moecel::ops_test
