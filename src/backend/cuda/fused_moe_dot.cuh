// The per-row arithmetic the fused decode-MoE kernels share (fused_moe.cu: registers; fused_moe_bulk.cu: bulk copies
// into shared memory): one chunk step of a set of rows, exactly as the gather path's matrix-vector kernel adds it.
#pragma once
#include <cstdint>

#include "backend/cuda/moe.cuh"
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

// Kernel A's epilogue: reduces each of the warp's 2 * RPW row sums (gate rows, then up rows) over the warp and has
// lane 0 write act[j, row0 + i] = glu(gate_i, up_i) for the rows below ffn: what the gather path's glu kernel
// computes from its two products.
template <GluAct ACT, int RPW>
__device__ __forceinline__ void write_act(float (&acc)[2 * RPW], float* act, int64_t j, int64_t ffn, int64_t row0,
                                          int lane) {
#pragma unroll
  for (int i = 0; i < 2 * RPW; ++i) acc[i] = warp_sum(acc[i]);
  if (lane == 0) {
#pragma unroll
    for (int i = 0; i < RPW; ++i)
      if (row0 + i < ffn) act[j * ffn + row0 + i] = glu_value<ACT>(acc[i], acc[RPW + i]);
  }
}

}  // namespace moecel::cuda
