// Dot products of MLX affine-quantized rows with f32 vectors, the building blocks of the matrix-vector kernels
// (qgemv.cu) and the fused decode-MoE kernels (fused_moe.cu). A lane works on 32-value chunks: chunk c of a row
// is `BITS` packed words; with w = s * q + b per group, a chunk contributes s * sum(q x) + b * sum(x).
// Sharing these keeps every path's per-row arithmetic identical, so the fused path matches the gather path.
#pragma once
#include <cstdint>

#include "backend/cuda/cuda_common.cuh"

namespace moecel::cuda {

constexpr int kChunk = 32;  // values per quantized lane step; a chunk never straddles a group (group_size % 32 == 0)

// Chunk c of a row starts at word c * BITS of a row that starts at a multiple of BITS words (in % 32 == 0),
// so with a 16-byte aligned base the BITS words are 16-byte aligned for 4/8 bits and 8-byte aligned for 2/6.
template <int BITS>
__device__ __forceinline__ void load_chunk(const uint32_t* p, uint32_t (&wd)[BITS]) {
  if constexpr (BITS % 4 == 0) {
#pragma unroll
    for (int i = 0; i < BITS / 4; ++i) {
      const uint4 v = __ldg(reinterpret_cast<const uint4*>(p) + i);
      wd[4 * i] = v.x;
      wd[4 * i + 1] = v.y;
      wd[4 * i + 2] = v.z;
      wd[4 * i + 3] = v.w;
    }
  } else if constexpr (BITS % 2 == 0) {
#pragma unroll
    for (int i = 0; i < BITS / 2; ++i) {
      const uint2 v = __ldg(reinterpret_cast<const uint2*>(p) + i);
      wd[2 * i] = v.x;
      wd[2 * i + 1] = v.y;
    }
  } else {
#pragma unroll
    for (int i = 0; i < BITS; ++i) wd[i] = __ldg(p + i);
  }
}

// Value j (compile-time after unrolling) of a chunk, as the float 1 + q_j / 2^BITS: q's bits (bits
// [j * BITS, (j + 1) * BITS) of the words, little endian) moved to the top of the mantissa of 1.0f. That is one
// shift and one LOP3 per value, with no conversion instruction and no subtraction (the 2^23 + q form needed an
// FADD per value to remove the 2^23); chunk_qx removes the 1 once per chunk instead.
template <int BITS>
__device__ __forceinline__ float chunk_value(const uint32_t (&wd)[BITS], int j) {
  constexpr uint32_t kMask = (1u << BITS) - 1u;
  constexpr int kTop = 23 - BITS;  // q lands in mantissa bits [23 - BITS, 23)
  const int bit = j * BITS, w = bit >> 5, sh = bit & 31;
  uint32_t v;
  if (sh + BITS > 32) {  // spills into the next word (3, 5 and 6 bits)
    v = ((wd[w] >> sh) | (wd[w + 1 < BITS ? w + 1 : BITS - 1] << (32 - sh))) << kTop;
  } else {
    v = sh >= kTop ? wd[w] >> (sh - kTop) : wd[w] << (kTop - sh);
  }
  // (v & mask) | 1.0f in one LOP3: written out because the compiler otherwise spends two, one per immediate.
  uint32_t f;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(f) : "r"(v), "n"(kMask << kTop), "r"(0x3F800000u));
  return __uint_as_float(f);
}

// sum_j q_j * x_j over one chunk, given xsum = sum_j x_j of the same chunk: the loop sums (1 + q_j / 2^BITS) x_j
// = xsum + qx / 2^BITS (one FFMA per value), then qx = (that - xsum) * 2^BITS (the scaling is exact).
template <int BITS>
__device__ __forceinline__ float chunk_qx(const uint32_t (&wd)[BITS], const float* xc, float xsum) {
  float d = 0.0f;
#pragma unroll
  for (int j = 0; j < kChunk; j += 4) {
    const float4 xv = *reinterpret_cast<const float4*>(xc + j);
    d = fmaf(chunk_value<BITS>(wd, j), xv.x, d);
    d = fmaf(chunk_value<BITS>(wd, j + 1), xv.y, d);
    d = fmaf(chunk_value<BITS>(wd, j + 2), xv.z, d);
    d = fmaf(chunk_value<BITS>(wd, j + 3), xv.w, d);
  }
  return (d - xsum) * float(1u << BITS);
}

// sum_j x_j over one chunk (the bias term: w = s*q + b gives s*sum(q x) + b*sum(x)), in one fixed order.
__device__ __forceinline__ float chunk_xsum(const float* xc) {
  float xs = 0.0f;
#pragma unroll
  for (int j = 0; j < kChunk; j += 4) {
    const float4 xv = *reinterpret_cast<const float4*>(xc + j);
    xs += (xv.x + xv.y) + (xv.z + xv.w);
  }
  return xs;
}

// Floats per chunk of a vector staged in shared memory: 4 pad floats put the float4 reads of 8 consecutive lanes
// (chunks 144 bytes apart) in distinct banks; the first of them holds the chunk's sum (stage_xsums).
constexpr int kChunkPad = 36;

// Stages x (in floats, in % 32 == 0) into xs in the padded chunk layout (chunk c at xs + c * kChunkPad); every
// thread of the block takes part (blockDim.x a multiple of 32). With float4 loads, each thread's
// loads are all issued before its stores: a plain loop would be a chain of dependent global-load latencies. UNROLL
// float4 loads per thread are in flight at once (one round trip for UNROLL * 4 * blockDim.x floats).
template <int UNROLL = 4>
__device__ __forceinline__ void stage_chunks(const float* x, int64_t in, float* xs) {
  if ((reinterpret_cast<uintptr_t>(x) & 15) != 0) {
    for (int64_t i = threadIdx.x; i < in; i += int64_t(blockDim.x)) xs[(i / kChunk) * kChunkPad + i % kChunk] = x[i];
    return;
  }
  constexpr int kUnroll = UNROLL;
  const int64_t n4 = in / 4;
  const float4* x4 = reinterpret_cast<const float4*>(x);
  for (int64_t base = threadIdx.x; base < n4; base += int64_t(int64_t(blockDim.x)) * kUnroll) {
    float4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i4 = base + int64_t(u) * int64_t(blockDim.x);
      if (i4 < n4) v[u] = x4[i4];
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i4 = base + int64_t(u) * int64_t(blockDim.x);
      if (i4 < n4) {
        const int64_t i = i4 * 4;  // a float4 never straddles a chunk; chunk starts are 16-byte aligned (144 B)
        *reinterpret_cast<float4*>(xs + (i / kChunk) * kChunkPad + i % kChunk) = v[u];
      }
    }
  }
}

// A staged vector keeps each chunk's sum in the chunk's first pad float, written once per block by
// stage_xsums (every row that reads the chunk needs it: one sum per chunk instead of one per row and chunk).
__device__ __forceinline__ float staged_xsum(const float* xc) {
  return xc[kChunk];
}

// Writes the sums of chunks [0, n_chunks) of a staged vector; the caller puts a barrier before (the values are
// staged) and after (rows read the sums). Every kernel computes them here, so they are identical everywhere.
__device__ __forceinline__ void stage_xsums(float* xs, int64_t n_chunks) {
  for (int64_t c = threadIdx.x; c < n_chunks; c += int64_t(blockDim.x)) {
    float* xc = xs + c * kChunkPad;
    xc[kChunk] = chunk_xsum(xc);
  }
}

// One chunk's contribution to a row's dot product, in the order every kernel uses.
__device__ __forceinline__ float chunk_fma(float s, float b, float qx, float xsum, float acc) {
  return fmaf(s, qx, fmaf(b, xsum, acc));
}

}  // namespace moecel::cuda
