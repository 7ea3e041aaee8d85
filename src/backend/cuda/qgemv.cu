// Matrix-vector kernels (decode and other few-token products): one warp per output row, 8 rows per
// 256-thread block, grid (ceil(out / 8), n_pairs). The block stages its x row in shared memory; lanes stride
// the row's packed words (a quantized lane step is one 32-value chunk = exactly `bits` words, 16-byte loads
// for 4 and 8 bits), accumulate in f32 and reduce with warp shuffles.
// Used by: launch_linear and launch_gather_linear (qmatmul.cu).
#include <cstdint>

#include "backend/cuda/qdot.cuh"
#include "backend/cuda/qmatmul.cuh"

namespace moecel::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;

struct GemvArgs {
  WeightView w;
  const float* x;
  float* y;
  PairMap map;
  unsigned* err;
};

// Resolves pair p to its expert; an out-of-range index fills this block's rows of y with NaN and raises the
// error flag. Returns -1 then (uniform over the block, so the caller may return before any barrier).
__device__ __forceinline__ int64_t pair_expert(const GemvArgs& a, int64_t p) {
  if (!a.map.indices) return 0;
  const int64_t e = a.map.indices[p];
  if (e >= 0 && e < a.w.n_stack) return e;
  if (threadIdx.x == 0) raise_device_error(a.err, kErrExpertIndex);
  const int64_t row = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if ((threadIdx.x & 31) == 0 && row < a.w.out) a.y[p * a.w.out + row] = __int_as_float(0x7fc00000);
  return -1;
}

__device__ __forceinline__ const float* pair_x(const GemvArgs& a, int64_t p) {
  return a.x + (a.map.x_per_slot ? p : p / a.map.k) * a.w.in;
}

// Preconditions (checked by launch_gemv): blockDim.x == kThreads; w.in % 32 == 0; w.group_size % 32 == 0;
// w.w 16-byte aligned; dynamic shared memory (in / 32) * kChunkPad floats.
template <int BITS, typename ST>
__global__ void __launch_bounds__(kThreads) qgemv_kernel(GemvArgs a) {
  extern __shared__ float4 smem4[];
  float* xs = reinterpret_cast<float*>(smem4);
  const int64_t p = blockIdx.y;
  const int64_t expert = pair_expert(a, p);
  if (expert < 0) return;
  const int64_t in = a.w.in, out = a.w.out, n_chunks = in / kChunk;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * kWarps + warp;
  const bool live = row < out;
  const int64_t r = expert * out + (live ? row : 0);  // row of the flattened (n_stack * out, ...) weight
  const int64_t groups = in / a.w.group_size;
  const int chunks_per_group = a.w.group_size / kChunk;
  const uint32_t* wrow = static_cast<const uint32_t*>(a.w.w) + r * n_chunks * BITS;
  const ST* srow = static_cast<const ST*>(a.w.scales) + r * groups;
  const ST* brow = a.w.biases ? static_cast<const ST*>(a.w.biases) + r * groups : nullptr;
  // The lane's first kPrefetch chunks (words, scale, bias) are loaded before x is staged, so their latency
  // overlaps the staging; they are consumed first, in the same order as the loop below (same sums).
  constexpr int kPrefetch = 2;
  uint32_t pw[kPrefetch][BITS];
  float ps[kPrefetch], pb[kPrefetch];
#pragma unroll
  for (int k = 0; k < kPrefetch; ++k) {
    const int64_t c = lane + 32 * k;
    if (live && c < n_chunks) {
      load_chunk<BITS>(wrow + c * BITS, pw[k]);
      const int64_t g = c / chunks_per_group;
      ps[k] = to_f32(srow[g]);
      pb[k] = brow ? to_f32(brow[g]) : 0.0f;
    }
  }
  stage_chunks(pair_x(a, p), in, xs);
  __syncthreads();
  if (!live) return;

  float acc = 0.0f;
#pragma unroll
  for (int k = 0; k < kPrefetch; ++k) {
    const int64_t c = lane + 32 * k;
    if (c < n_chunks) {
      float xsum;
      const float qx = chunk_dot<BITS>(pw[k], xs + c * kChunkPad, xsum);
      acc = chunk_fma(ps[k], pb[k], qx, xsum, acc);
    }
  }
  for (int64_t c = lane + 32 * kPrefetch; c < n_chunks; c += 32) {
    uint32_t wd[BITS];
    load_chunk<BITS>(wrow + c * BITS, wd);
    const int64_t g = c / chunks_per_group;
    const float s = to_f32(srow[g]);
    const float b = brow ? to_f32(brow[g]) : 0.0f;
    float xsum;
    const float qx = chunk_dot<BITS>(wd, xs + c * kChunkPad, xsum);
    acc = chunk_fma(s, b, qx, xsum, acc);
  }
  acc = warp_sum(acc);
  if (lane == 0) a.y[p * out + row] = acc;
}

// Dense weights. Preconditions: blockDim.x == kThreads; dynamic shared memory `in` floats (16-byte aligned);
// vec only when in * sizeof(WT) % 16 == 0 and w.w is 16-byte aligned (then every row is).
template <typename WT>
__global__ void __launch_bounds__(kThreads) dense_gemv_kernel(GemvArgs a, bool vec) {
  extern __shared__ float4 smem4[];
  float* xs = reinterpret_cast<float*>(smem4);
  const int64_t p = blockIdx.y;
  const int64_t expert = pair_expert(a, p);
  if (expert < 0) return;
  const int64_t in = a.w.in, out = a.w.out;
  const float* x = pair_x(a, p);
  for (int64_t i = threadIdx.x; i < in; i += kThreads) xs[i] = x[i];
  __syncthreads();

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * kWarps + warp;
  if (row >= out) return;
  const WT* wrow = static_cast<const WT*>(a.w.w) + (expert * out + row) * in;
  float acc = 0.0f;
  if (vec) {
    constexpr int kV = 16 / int(sizeof(WT));  // values per 16-byte load: 4 (F32) or 8 (F16/BF16)
    const int64_t n_vec = in / kV;
    for (int64_t c = lane; c < n_vec; c += 32) {
      const uint4 raw = __ldg(reinterpret_cast<const uint4*>(wrow) + c);
      const WT* wv = reinterpret_cast<const WT*>(&raw);
#pragma unroll
      for (int u = 0; u < kV; u += 4) {
        const float4 xv = *reinterpret_cast<const float4*>(xs + c * kV + u);
        acc = fmaf(to_f32(wv[u]), xv.x, acc);
        acc = fmaf(to_f32(wv[u + 1]), xv.y, acc);
        acc = fmaf(to_f32(wv[u + 2]), xv.z, acc);
        acc = fmaf(to_f32(wv[u + 3]), xv.w, acc);
      }
    }
  } else {
    for (int64_t i = lane; i < in; i += 32) acc = fmaf(to_f32(wrow[i]), xs[i], acc);
  }
  acc = warp_sum(acc);
  if (lane == 0) a.y[p * out + row] = acc;
}

template <class Kernel, class... Args>
void launch(const Ctx& ctx, Kernel kernel, dim3 grid, size_t smem, const Args&... args) {
  if (smem > 48 * 1024) {
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  }
  kernel<<<grid, kThreads, smem, ctx.stream>>>(args...);
  CUDA_CHECK_LAUNCH();
}

template <int BITS>
void launch_quant(const Ctx& ctx, dim3 grid, size_t smem, const GemvArgs& a) {
  switch (a.w.stype) {
    case FloatType::kF32: launch(ctx, qgemv_kernel<BITS, float>, grid, smem, a); break;
    case FloatType::kF16: launch(ctx, qgemv_kernel<BITS, __half>, grid, smem, a); break;
    case FloatType::kBF16: launch(ctx, qgemv_kernel<BITS, __nv_bfloat16>, grid, smem, a); break;
  }
}

}  // namespace

bool launch_gemv(const Ctx& ctx, const WeightView& w, const float* x, const PairMap& map, int64_t n_pairs, float* y) {
  if (n_pairs == 0 || w.out == 0) return true;
  CUDA_REQUIRE(w.in > 0 && n_pairs > 0 && n_pairs <= 65535, "gemv: bad in / pair count");
  const bool quant = w.bits != 0;
  const size_t smem = quant ? size_t(w.in / kChunk) * kChunkPad * sizeof(float) : size_t(w.in) * sizeof(float);
  if (smem > size_t(ctx.max_smem_optin)) return false;  // x does not fit: the tiled kernel takes it
  const dim3 grid{unsigned((w.out + kWarps - 1) / kWarps), unsigned(n_pairs)};
  CUDA_REQUIRE((w.out + kWarps - 1) / kWarps < (int64_t(1) << 31), "gemv: too many output rows");
  const GemvArgs a{w, x, y, map, ctx.error_flag};
  if (quant) {
    CUDA_REQUIRE(w.in % kChunk == 0 && w.group_size % kChunk == 0 && w.group_size > 0,
                 "gemv: quantized rows need in and group_size multiples of 32");
    CUDA_REQUIRE(reinterpret_cast<uintptr_t>(w.w) % 16 == 0, "gemv: packed weight not 16-byte aligned");
    switch (w.bits) {
      case 2: launch_quant<2>(ctx, grid, smem, a); break;
      case 3: launch_quant<3>(ctx, grid, smem, a); break;
      case 4: launch_quant<4>(ctx, grid, smem, a); break;
      case 5: launch_quant<5>(ctx, grid, smem, a); break;
      case 6: launch_quant<6>(ctx, grid, smem, a); break;
      case 8: launch_quant<8>(ctx, grid, smem, a); break;
      default: CUDA_REQUIRE(false, "gemv: unsupported bits " + std::to_string(w.bits));
    }
    return true;
  }
  const size_t wsize = w.wtype == FloatType::kF32 ? 4 : 2;
  const bool vec = (size_t(w.in) * wsize) % 16 == 0 && reinterpret_cast<uintptr_t>(w.w) % 16 == 0;
  switch (w.wtype) {
    case FloatType::kF32: launch(ctx, dense_gemv_kernel<float>, grid, smem, a, vec); break;
    case FloatType::kF16: launch(ctx, dense_gemv_kernel<__half>, grid, smem, a, vec); break;
    case FloatType::kBF16: launch(ctx, dense_gemv_kernel<__nv_bfloat16>, grid, smem, a, vec); break;
  }
  return true;
}

}  // namespace moecel::cuda
