// The per-row arithmetic the fused decode-MoE kernels share (fused_moe.cu: registers; fused_moe_bulk.cu: bulk copies
// into shared memory): one chunk step of a set of rows, exactly as the gather path's matrix-vector kernel adds it.
#pragma once
#include <cstdint>

#include "backend/cuda/qdot.cuh"

namespace moecel::cuda {

__device__ __forceinline__ bool valid_expert(int32_t e, int64_t n) {
  return e >= 0 && e < n;
}

// acc[i] += row i's chunk c . xs (staged vector x_of(i), with its chunk sums), in the gather path's order. Rows
// with the same vector (x_of(i) == x_of(0) for every i with SHARED) read the chunk's sum once.
template <int BITS, int R, bool SHARED = false, class XOf>
__device__ __forceinline__ void dot_step(const uint32_t (&wd)[R][BITS], const float (&sc)[R], const float (&bi)[R],
                                         int64_t c, XOf x_of, float (&acc)[R]) {
  float shared_sum = 0.0f;
  if constexpr (SHARED) shared_sum = staged_xsum(x_of(0) + c * kChunkPad);
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const float* xc = x_of(i) + c * kChunkPad;
    const float xsum = SHARED ? shared_sum : staged_xsum(xc);
    acc[i] = chunk_fma(sc[i], bi[i], chunk_qx<BITS>(wd[i], xc, xsum), xsum, acc[i]);
  }
}

}  // namespace moecel::cuda
