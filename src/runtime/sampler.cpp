// Sampler implementation: work on (id, logit) candidates so filters are plain sorts and prefix cuts.
#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"

namespace moecel {

void validate(const SamplerParams& p) {
  MOECEL_CHECK(std::isfinite(p.temperature) && p.temperature >= 0.0f, "--temperature must be >= 0, got {}",
               p.temperature);
  MOECEL_CHECK(p.top_k >= 0, "--top-k must be >= 0 (0 = off), got {}", p.top_k);
  MOECEL_CHECK(p.top_p > 0.0f && p.top_p <= 1.0f, "--top-p must be in (0, 1], got {}", p.top_p);
  MOECEL_CHECK(p.min_p >= 0.0f && p.min_p < 1.0f, "--min-p must be in [0, 1), got {}", p.min_p);
}

Sampler::Sampler(const SamplerParams& p) : params_(p), rng_(p.seed) {
  validate(p);
}

int32_t Sampler::sample(std::span<const float> logits) {
  MOECEL_CHECK(!logits.empty(), "sampler: empty logits");
  if (greedy()) return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
  struct Cand {
    int32_t id;
    float p;
  };
  std::vector<Cand> c(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) c[i] = {int32_t(i), logits[i] / params_.temperature};
  // Highest first; ties by lower id so results do not depend on the sort implementation.
  auto by_p = [](const Cand& a, const Cand& b) { return a.p > b.p || (a.p == b.p && a.id < b.id); };
  size_t keep = c.size();
  if (params_.top_k > 0 && size_t(params_.top_k) < keep) {
    keep = size_t(params_.top_k);
    std::partial_sort(c.begin(), c.begin() + long(keep), c.end(), by_p);
    c.resize(keep);
  } else {
    std::sort(c.begin(), c.end(), by_p);
  }
  const float mx = c.front().p;
  double sum = 0;
  for (Cand& x : c) sum += (x.p = std::exp(x.p - mx));
  for (Cand& x : c) x.p = float(x.p / sum);
  if (params_.top_p < 1.0f) {  // smallest prefix whose mass reaches top_p (at least one token)
    double mass = 0;
    size_t n = 0;
    while (n < c.size() && (n == 0 || mass < params_.top_p)) mass += c[n++].p;
    c.resize(n);
  }
  if (params_.min_p > 0.0f) {  // drop tokens below min_p times the top probability
    const float cut = params_.min_p * c.front().p;
    size_t n = 1;
    while (n < c.size() && c[n].p >= cut) ++n;
    c.resize(n);
  }
  double total = 0;
  for (const Cand& x : c) total += x.p;
  std::uniform_real_distribution<double> u(0.0, total);
  double r = u(rng_), acc = 0;
  for (const Cand& x : c) {
    acc += x.p;
    if (r < acc) return x.id;
  }
  return c.back().id;
}

}  // namespace moecel
