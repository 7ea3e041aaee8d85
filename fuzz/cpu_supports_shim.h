// Force-included into the fuzz build only when the compiler's __builtin_cpu_supports rejects feature names the
// CPU backend asks for (clang 14 does not know "f16c"): unknown names are answered from CPUID instead. The
// product builds (GCC, newer clang) never see this file.
#pragma once
#include <cpuid.h>
#include <string.h>

static inline bool moecel_fuzz_cpu_supports(const char* f) {
  if (strcmp(f, "f16c") == 0) {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
  }
  if (strcmp(f, "avx2") == 0) return __builtin_cpu_supports("avx2");
  if (strcmp(f, "fma") == 0) return __builtin_cpu_supports("fma");
  if (strcmp(f, "avx512f") == 0) return __builtin_cpu_supports("avx512f");
  if (strcmp(f, "avx512bw") == 0) return __builtin_cpu_supports("avx512bw");
  if (strcmp(f, "avx512vl") == 0) return __builtin_cpu_supports("avx512vl");
  if (strcmp(f, "avx512dq") == 0) return __builtin_cpu_supports("avx512dq");
  if (strcmp(f, "avx512vnni") == 0) return __builtin_cpu_supports("avx512vnni");
  return false;  // a feature this shim does not know: take the portable path
}
#define __builtin_cpu_supports(f) moecel_fuzz_cpu_supports(f)
