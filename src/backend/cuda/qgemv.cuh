// Internal to the matrix-vector kernels (qgemv.cu: CUDA cores, any bits; qgemv_mma.cu: tensor cores, 4/8 bits):
// their launch arguments and the staging, fusion and epilogue steps they share.
#pragma once
#include <cstdint>

#include "backend/cuda/moe.cuh"
#include "backend/cuda/qdot.cuh"
#include "backend/cuda/qmatmul.cuh"

namespace moecel::cuda::gemv {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;

struct GemvArgs {
  WeightView w[kMaxGemvParts];  // part i: blocks [part_end[i - 1], part_end[i]) of grid.x, writing y[i]
  float* y[kMaxGemvParts];
  unsigned part_end[kMaxGemvParts];
  int n_parts = 1;
  const float* x;
  PairMap map;
  unsigned* err;
  GemvFusion f;  // the decode fusions (qmatmul.cuh); all off for a plain product
};

// Part of the launch this block works on, without indexing the parameter arrays dynamically (which would copy
// them to local memory).
struct Part {
  WeightView w;
  float* y;
  int64_t block;  // block index within the part
};

__device__ __forceinline__ Part part_of_block(const GemvArgs& a, unsigned bx) {
  if (a.n_parts > 1 && bx >= a.part_end[0]) {
    if (a.n_parts > 2 && bx >= a.part_end[1]) return {a.w[2], a.y[2], int64_t(bx - a.part_end[1])};
    return {a.w[1], a.y[1], int64_t(bx - a.part_end[0])};
  }
  return {a.w[0], a.y[0], int64_t(bx)};
}

__device__ __forceinline__ Part block_part(const GemvArgs& a) {
  return part_of_block(a, blockIdx.x);
}

// Resolves pair p to its expert; an out-of-range index fills this block's rows of y with NaN and raises the
// error flag. Returns -1 then (uniform over the block, so the caller may return before any barrier).
__device__ __forceinline__ int64_t pair_expert(const GemvArgs& a, const Part& pt, int64_t p, int rpw) {
  if (!a.map.indices) return 0;
  const int64_t e = a.map.indices[p];
  if (e >= 0 && e < pt.w.n_stack) return e;
  if (threadIdx.x == 0) raise_device_error(a.err, kErrExpertIndex);
  const int64_t row0 = (pt.block * kWarps + (threadIdx.x >> 5)) * rpw;
  if ((threadIdx.x & 31) == 0) {
    for (int64_t row = row0; row < row0 + rpw && row < pt.w.out; ++row)
      pt.y[p * pt.w.out + row] = __int_as_float(0x7fc00000);
  }
  return -1;
}

__device__ __forceinline__ const float* pair_x(const GemvArgs& a, int64_t in, int64_t p) {
  return a.x + (a.map.x_per_slot ? p : p / a.map.k) * in;
}

// Norm weights of this thread's elements i = threadIdx.x + j * kThreads (j < kNormRegs), loaded before pdl_wait:
// they are weights, and a loop of dependent global loads after the wait would sit on the step's critical path.
constexpr int kNormRegs = 8;  // all of a 2048-wide row; wider rows load the rest after the wait

__device__ __forceinline__ void load_norm(const GemvArgs& a, int64_t in, float (&nw)[kNormRegs]) {
#pragma unroll
  for (int j = 0; j < kNormRegs; ++j) {
    const int64_t i = threadIdx.x + int64_t(j) * kThreads;
    nw[j] = a.f.norm_w && i < in ? load_float(a.f.norm_w, a.f.norm_type, i) : 0.0f;
  }
}

// The staged x (padded chunk layout) becomes rms_norm(x) * weight, exactly as rms_norm_kernel computes it (the same
// thread count and order of the sum of squares); block 0 of each pair also writes it to xn_out. Ends with a barrier.
__device__ inline void normalize_staged(const GemvArgs& a, int64_t in, int64_t p, float* xs,
                                        const float (&nw)[kNormRegs]) {
  __shared__ float red[32];
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < in; i += kThreads) {
    const float v = xs[(i / kChunk) * kChunkPad + i % kChunk];
    ss = fmaf(v, v, ss);
  }
  ss = block_sum(ss, red);
  const float inv = 1.0f / sqrtf(ss / float(in) + a.f.eps);
  float* xn = a.f.xn_out && blockIdx.x == 0 ? a.f.xn_out + p * in : nullptr;
#pragma unroll
  for (int j = 0; j < kNormRegs; ++j) {
    const int64_t i = threadIdx.x + int64_t(j) * kThreads;
    if (i < in) {
      float& v = xs[(i / kChunk) * kChunkPad + i % kChunk];
      v = v * inv * nw[j];
      if (xn) xn[i] = v;
    }
  }
  for (int64_t i = threadIdx.x + int64_t(kNormRegs) * kThreads; i < in; i += kThreads) {
    float& v = xs[(i / kChunk) * kChunkPad + i % kChunk];
    v = v * inv * load_float(a.f.norm_w, a.f.norm_type, i);
    if (xn) xn[i] = v;
  }
  __syncthreads();
}

// Router epilogue: the block that finishes last runs the top-k of every token's logits (y of part 0), the whole
// block per token (block_router_topk), then resets the counter for the next launch.
__device__ inline void router_epilogue(const GemvArgs& a) {
  static_assert(kThreads == kRankThreads, "block_router_topk needs the whole block");
  __shared__ bool last;
  __shared__ RouterRankSmem rs;
  __syncthreads();  // every warp of this block has written its logits
  if (threadIdx.x == 0) {
    __threadfence();
    const unsigned total = gridDim.x * gridDim.y;
    last = atomicAdd(a.f.counter, 1u) == total - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  const RouterEpilogue& r = a.f.router;
  for (int64_t t = 0; t < gridDim.y; ++t) {
    block_router_topk(a.y[0] + t * a.w[0].out, int(a.w[0].out), r.k, r.topk_softmax, r.renormalize, r.indices + t * r.k,
                      r.weights + t * r.k, rs);
  }
  if (threadIdx.x == 0) *a.f.counter = 0u;
}

// The tensor-core kernel (qgemv_mma.cu) for 4- and 8-bit weights with group size 32, 64 or 128, when x and its
// working set fit in shared memory. Returns false, launching nothing, otherwise (a.part_end is filled here).
bool launch_gemv_mma(const Ctx& ctx, GemvArgs& a, int64_t n_pairs);
// Whether launch_gemv_mma takes this weight (the fused decode-MoE kernels ask it too, so that the fused and the
// gather paths always run the same arithmetic).
bool gemv_mma_takes(const Ctx& ctx, const WeightView& w);

}  // namespace moecel::cuda::gemv
