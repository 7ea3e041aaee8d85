// Token sampling from a row of logits: greedy, or temperature with top-k, top-p and min-p filters
// (applied in transformers' order: temperature, top-k, top-p, min-p), seeded for reproducibility.
#pragma once
#include <cstdint>
#include <random>
#include <span>

namespace moecel {

struct SamplerParams {
  float temperature = 0.0f;  // 0 = greedy
  int top_k = 0;             // 0 = off
  float top_p = 1.0f;        // 1 = off
  float min_p = 0.0f;        // 0 = off
  uint64_t seed = 0;
};

// Throws moecel::Error naming the option for out-of-range values.
void validate(const SamplerParams& p);

class Sampler {
 public:
  explicit Sampler(const SamplerParams& p);
  bool greedy() const { return params_.temperature <= 0.0f; }
  // logits (vocab_size,) -> token id
  int32_t sample(std::span<const float> logits);

 private:
  SamplerParams params_;
  std::mt19937_64 rng_;
};

}  // namespace moecel
