// Tests of the CPU backend's attention (backend/cpu/cpu_backend.h) against an f64 reference written from the
// op's definition: one token and several, GQA, a sliding window, a cache already holding rows, and the same bits
// whatever the thread count.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/thread_pool.h"

namespace moecel {
namespace {

struct Case {
  int n_heads, n_kv_heads, head_dim, window;
  int64_t pos0, n;
};

Tensor random_tensor(CpuBackend& be, Shape shape, std::mt19937& rng) {
  Tensor t = be.alloc(DType::kF32, std::move(shape));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int64_t i = 0; i < t.numel(); ++i) t.ptr<float>()[i] = nd(rng);
  return t;
}

// softmax(q k^T * scale) v per token and head, over rows [max(0, pos0 + t - window + 1), pos0 + t], in f64.
std::vector<double> reference(const Case& c, const Tensor& q, const Tensor& kc, const Tensor& vc, float scale) {
  const int64_t qw = int64_t(c.n_heads) * c.head_dim, kw = int64_t(c.n_kv_heads) * c.head_dim;
  std::vector<double> out(size_t(c.n * qw), 0.0);
  for (int64_t t = 0; t < c.n; ++t)
    for (int h = 0; h < c.n_heads; ++h) {
      const int64_t last = c.pos0 + t, first = c.window > 0 ? std::max<int64_t>(0, last - c.window + 1) : 0;
      const int64_t off = int64_t(h / (c.n_heads / c.n_kv_heads)) * c.head_dim;
      std::vector<double> s;
      double mx = -INFINITY, sum = 0;
      for (int64_t p = first; p <= last; ++p) {
        double d = 0;
        for (int i = 0; i < c.head_dim; ++i)
          d += double(q.ptr<float>()[t * qw + h * c.head_dim + i]) * kc.ptr<float>()[p * kw + off + i];
        s.push_back(d * scale);
        mx = std::max(mx, s.back());
      }
      for (double& v : s) sum += (v = std::exp(v - mx));
      for (int64_t p = first; p <= last; ++p)
        for (int i = 0; i < c.head_dim; ++i)
          out[size_t(t * qw + h * c.head_dim + i)] += s[size_t(p - first)] / sum * vc.ptr<float>()[p * kw + off + i];
    }
  return out;
}

TEST(CpuAttention, MatchesTheDefinitionAtAnyThreadCount) {
  const Case cases[] = {
      {16, 16, 64, 0, 0, 1},   // the first decode step
      {16, 16, 64, 0, 37, 1},  // decode over a filled cache
      {8, 2, 32, 0, 5, 1},     // GQA, one token
      {8, 2, 32, 0, 0, 23},    // GQA, a prompt
      {6, 3, 16, 4, 9, 7},     // a sliding window, heads not a multiple of the thread count
      {4, 1, 128, 16, 40, 1},  // a window shorter than the context, one KV head
  };
  const int saved = num_threads();
  for (const Case& c : cases) {
    SCOPED_TRACE(testing::Message() << "heads " << c.n_heads << "/" << c.n_kv_heads << " dim " << c.head_dim
                                    << " window " << c.window << " pos0 " << c.pos0 << " n " << c.n);
    CpuBackend be;
    std::mt19937 rng(uint32_t(c.n_heads * 100 + c.pos0 + c.n));
    const int64_t capacity = c.pos0 + c.n + 3, qw = int64_t(c.n_heads) * c.head_dim;
    Tensor q = random_tensor(be, {c.n, qw}, rng);
    Tensor kc = random_tensor(be, {capacity, int64_t(c.n_kv_heads) * c.head_dim}, rng);
    Tensor vc = random_tensor(be, {capacity, int64_t(c.n_kv_heads) * c.head_dim}, rng);
    const float scale = 1.0f / std::sqrt(float(c.head_dim));
    const std::vector<double> ref = reference(c, q, kc, vc, scale);
    std::vector<float> first;
    for (int threads : {1, 2, 3}) {
      set_num_threads(threads);
      Tensor out = be.alloc(DType::kF32, {c.n, qw});
      be.attention(q, kc, vc, c.pos0, c.n_heads, c.n_kv_heads, c.head_dim, scale, c.window, out);
      const float* o = out.ptr<float>();
      for (int64_t i = 0; i < c.n * qw; ++i)
        ASSERT_NEAR(o[i], ref[size_t(i)], 1e-5) << "threads " << threads << " element " << i;
      if (first.empty())
        first.assign(o, o + c.n * qw);
      else
        EXPECT_EQ(0, std::memcmp(first.data(), o, first.size() * 4)) << "threads " << threads;
    }
  }
  set_num_threads(saved);
}

}  // namespace
}  // namespace moecel
