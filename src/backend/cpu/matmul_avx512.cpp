// AVX-512 matmul kernels (placeholder while the AVX2 set is tuned).
#if defined(__x86_64__)
#include "backend/cpu/matmul_internal.h"

namespace moecel::cpu::detail {
void avx512_kernels(const Slice&, Kernels&) {}
}  // namespace moecel::cpu::detail
#endif
