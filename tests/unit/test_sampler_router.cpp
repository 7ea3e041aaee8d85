// The sampler (greedy, temperature, top-k, top-p, min-p, seeding, option checks) and the CPU router
// (softmax over all experts then top-k, top-k then softmax, renormalization, ties), checked against values
// computed here by hand.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "runtime/sampler.h"

namespace moecel {
namespace {

TEST(Sampler, GreedyTakesTheFirstMaximum) {
  Sampler s(SamplerParams{});
  std::vector<float> l = {0.1f, 2.0f, -1.0f, 2.0f};
  EXPECT_TRUE(s.greedy());
  EXPECT_EQ(s.sample(l), 1);
}

TEST(Sampler, FollowsTheSoftmaxDistribution) {
  SamplerParams p;
  p.temperature = 1.0f;
  p.seed = 42;
  Sampler s(p);
  std::vector<float> l = {std::log(0.25f), std::log(0.75f)};
  int ones = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) ones += s.sample(l);
  EXPECT_NEAR(double(ones) / n, 0.75, 0.015);
}

TEST(Sampler, TemperatureSharpens) {
  SamplerParams p;
  p.temperature = 0.5f;  // p ~ exp(2 * logit): 0.25/0.75 becomes 0.1/0.9
  p.seed = 1;
  Sampler s(p);
  std::vector<float> l = {std::log(0.25f), std::log(0.75f)};
  int ones = 0;
  for (int i = 0; i < 20000; ++i) ones += s.sample(l);
  EXPECT_NEAR(ones / 20000.0, 0.9, 0.015);
}

TEST(Sampler, FiltersKeepOnlyAllowedTokens) {
  std::vector<float> l = {std::log(0.5f), std::log(0.3f), std::log(0.15f), std::log(0.05f)};
  auto seen = [&](SamplerParams p) {
    p.temperature = 1.0f;
    Sampler s(p);
    std::map<int, int> count;
    for (int i = 0; i < 4000; ++i) ++count[s.sample(l)];
    return count;
  };
  SamplerParams k2;
  k2.top_k = 2;
  auto c = seen(k2);
  EXPECT_EQ(c.size(), 2u);
  EXPECT_TRUE(c.count(0) && c.count(1));
  SamplerParams p1;
  p1.top_p = 0.75f;  // 0.5 + 0.3 reaches 0.75: tokens 0 and 1
  c = seen(p1);
  EXPECT_EQ(c.size(), 2u);
  SamplerParams p2;
  p2.top_p = 0.4f;  // the first token alone reaches 0.4
  c = seen(p2);
  EXPECT_EQ(c.size(), 1u);
  EXPECT_EQ(c.begin()->first, 0);
  SamplerParams m;
  m.min_p = 0.2f;  // keeps p >= 0.1: tokens 0, 1, 2
  c = seen(m);
  EXPECT_EQ(c.size(), 3u);
  EXPECT_FALSE(c.count(3));
}

TEST(Sampler, SameSeedSameSequence) {
  SamplerParams p;
  p.temperature = 1.0f;
  p.seed = 7;
  std::vector<float> l = {0.0f, 0.5f, 1.0f, 0.2f, -0.3f};
  Sampler a(p), b(p);
  std::vector<int> xa, xb;
  for (int i = 0; i < 100; ++i) {
    xa.push_back(a.sample(l));
    xb.push_back(b.sample(l));
  }
  EXPECT_EQ(xa, xb);
  p.seed = 8;
  Sampler c(p);
  std::vector<int> xc;
  for (int i = 0; i < 100; ++i) xc.push_back(c.sample(l));
  EXPECT_NE(xa, xc);
}

TEST(Sampler, RejectsBadOptions) {
  auto bad = [](SamplerParams p, const char* needle) {
    try {
      validate(p);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  SamplerParams p;
  p.temperature = -1;
  bad(p, "--temperature");
  p = {};
  p.top_p = 0;
  bad(p, "--top-p");
  p = {};
  p.min_p = 1;
  bad(p, "--min-p");
  p = {};
  p.top_k = -2;
  bad(p, "--top-k");
}

struct RouterOut {
  std::vector<int32_t> idx;
  std::vector<float> w;
};

RouterOut route(const std::vector<float>& logits, int n_experts, int k, RouterScoring scoring, bool renorm) {
  CpuBackend be;
  const int64_t n = int64_t(logits.size()) / n_experts;
  Tensor l = be.alloc(DType::kF32, {n, n_experts});
  be.from_host(logits.data(), l);
  Tensor idx = be.alloc(DType::kI32, {n, k}), w = be.alloc(DType::kF32, {n, k});
  be.router_topk(l, scoring, k, renorm, idx, w);
  RouterOut r{std::vector<int32_t>(size_t(n * k)), std::vector<float>(size_t(n * k))};
  be.to_host(idx, r.idx.data());
  be.to_host(w, r.w.data());
  return r;
}

TEST(Router, SoftmaxOverAllExpertsThenTopK) {
  std::vector<float> l = {1.0f, 3.0f, 0.0f, 2.0f};
  double z = std::exp(1.0) + std::exp(3.0) + std::exp(0.0) + std::exp(2.0);
  RouterOut r = route(l, 4, 2, RouterScoring::kSoftmax, false);
  EXPECT_EQ(r.idx, (std::vector<int32_t>{1, 3}));
  EXPECT_NEAR(r.w[0], std::exp(3.0) / z, 1e-6);
  EXPECT_NEAR(r.w[1], std::exp(2.0) / z, 1e-6);
  r = route(l, 4, 2, RouterScoring::kSoftmax, true);
  EXPECT_NEAR(r.w[0], std::exp(3.0) / (std::exp(3.0) + std::exp(2.0)), 1e-6);
  EXPECT_NEAR(r.w[0] + r.w[1], 1.0, 1e-6);
}

TEST(Router, TopKThenSoftmax) {
  std::vector<float> l = {1.0f, 3.0f, 0.0f, 2.0f, /* second token */ 5.0f, 4.0f, 4.5f, -1.0f};
  RouterOut r = route(l, 4, 2, RouterScoring::kTopKSoftmax, false);
  EXPECT_EQ(r.idx, (std::vector<int32_t>{1, 3, 0, 2}));
  EXPECT_NEAR(r.w[0], 1.0 / (1.0 + std::exp(-1.0)), 1e-6);
  EXPECT_NEAR(r.w[2], 1.0 / (1.0 + std::exp(-0.5)), 1e-6);
}

TEST(Router, TiesGoToTheLowerIndexAndBadKIsAnError) {
  RouterOut r = route({0.5f, 2.0f, 2.0f, 2.0f}, 4, 2, RouterScoring::kSoftmax, false);
  EXPECT_EQ(r.idx, (std::vector<int32_t>{1, 2}));
  EXPECT_THROW(route({0.5f, 2.0f}, 2, 3, RouterScoring::kSoftmax, false), Error);
}

}  // namespace
}  // namespace moecel
