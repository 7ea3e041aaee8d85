// Logit comparisons shared by the model tests: relative L2 error of one row against a reference row.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>

namespace moecel::test {

// ||a - b|| / ||b|| in double precision.
inline double rel_l2(const float* a, const float* b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

}  // namespace moecel::test
