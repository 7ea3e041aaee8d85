// The KV-cache check every architecture's tests run: a 5-token prefill followed by single-token decode steps must
// give the same logits (rel L2 < 1e-4, same argmax) as one full teacher-forced forward, all finite.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <span>
#include <vector>

#include "compare.h"
#include "models/model.h"

namespace moecel::test {

inline std::vector<float> to_vector(Backend& be, const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  be.to_host(t, v.data());
  return v;
}

inline void expect_decode_matches_full_forward(Model& model, Backend& be, const std::vector<int32_t>& ids) {
  const int64_t vocab = model.info().vocab_size;
  KvCache full_cache = model.make_cache(int64_t(ids.size()));
  const std::vector<float> full = to_vector(be, model.forward(ids, full_cache, true));
  ASSERT_EQ(full.size(), ids.size() * size_t(vocab));
  // Prefill 5 tokens, then one token at a time.
  KvCache cache = model.make_cache(int64_t(ids.size()));
  std::vector<float> step = to_vector(be, model.forward(std::span(ids).first(5), cache, true));
  for (size_t t = 5; t < ids.size(); ++t) {
    const std::vector<float> one = to_vector(be, model.forward(std::span(ids).subspan(t, 1), cache, false));
    step.insert(step.end(), one.begin(), one.end());
  }
  ASSERT_EQ(step.size(), full.size());
  for (size_t t = 0; t < ids.size(); ++t) {
    const float* a = step.data() + t * size_t(vocab);
    const float* b = full.data() + t * size_t(vocab);
    EXPECT_LT(rel_l2(a, b, size_t(vocab)), 1e-4) << "position " << t;
    EXPECT_EQ(std::max_element(a, a + vocab) - a, std::max_element(b, b + vocab) - b) << "position " << t;
  }
  for (float v : full) ASSERT_TRUE(std::isfinite(v));
}

}  // namespace moecel::test
