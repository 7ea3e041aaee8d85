// Small f32 vector primitives for the CPU backend's attention and elementwise ops, with an AVX2/FMA
// version chosen at run time and a portable fallback.
#pragma once
#include <cstdint>

namespace moecel::cpu {

// sum_i a[i] * b[i]
float dot(const float* a, const float* b, int64_t n);
// y[i] += alpha * x[i]
void axpy(float alpha, const float* x, float* y, int64_t n);

}  // namespace moecel::cpu
