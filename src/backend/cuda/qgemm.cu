// The CUDA-core tiled product (2/3/5/6-bit, F32/F16 weights, and the fallback of qgemm_mma.cu): a block owns 64
// output rows x up to 64 (token, slot) pairs of one expert and dequantizes each 64 x 32 weight tile into shared
// memory once for all its pairs (each thread accumulates 4 rows x 4 pairs in f32). Also launch_gemm, which picks
// the kernel, and the routing kernel that groups gather pairs by expert into tiles.
// Used by: launch_linear and launch_gather_linear (qmatmul.cu).
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>

#include "backend/cuda/qmatmul.cuh"

namespace moecel::cuda {
namespace {

constexpr int kBM = 64;               // output rows per block
constexpr int kBT = kGemmTileTokens;  // pairs per block
constexpr int kBK = 32;               // slice of `in` per step (one quantized chunk: never straddles a group)
constexpr int kThreads = 256;
constexpr int kLd = 65;  // shared row length: odd, so the loader's 8-value column writes spread over banks

struct GemmArgs {
  WeightView w;
  const float* x;
  float* y;
  PairMap map;
  int64_t n_pairs;
  TileList tiles;  // tiles.order == nullptr: plain linear
  int64_t max_tiles;
};

// Values [k, k + 8) of row `row` of expert `expert`, as f32 (w = s * q + b). k is a multiple of 8 inside `in`.
template <typename ST>
struct QuantLoader {
  __device__ static void load8(const WeightView& w, int64_t expert, int64_t row, int64_t k, float* v) {
    const int64_t r = expert * w.out + row;
    const int64_t words = w.in * w.bits / 32, groups = w.in / w.group_size;
    const uint32_t* wr = static_cast<const uint32_t*>(w.w) + r * words;
    const int64_t g = k / w.group_size;  // the 8 values share a group (group_size % 8 == 0)
    const float s = to_f32(static_cast<const ST*>(w.scales)[r * groups + g]);
    const float b = w.biases ? to_f32(static_cast<const ST*>(w.biases)[r * groups + g]) : 0.0f;
    const uint32_t mask = (1u << w.bits) - 1u;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int64_t bit = (k + j) * w.bits;
      const int64_t wi = bit >> 5;
      const int sh = int(bit & 31);
      uint32_t q = __ldg(wr + wi) >> sh;
      if (sh + w.bits > 32) q |= __ldg(wr + wi + 1) << (32 - sh);  // the value spills into the next word
      v[j] = fmaf(s, float(q & mask), b);
    }
  }
};

template <typename WT>
struct DenseLoader {
  __device__ static void load8(const WeightView& w, int64_t expert, int64_t row, int64_t k, float* v) {
    const WT* wr = static_cast<const WT*>(w.w) + (expert * w.out + row) * w.in;
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = k + j < w.in ? to_f32(wr[k + j]) : 0.0f;  // dense `in` may be odd
  }
};

// Preconditions (checked by launch_gemm): blockDim.x == kThreads; quantized weights have in % 32 == 0 and
// group_size % 32 == 0; every pair id in the tile list is < n_pairs.
template <class Loader>
__global__ void __launch_bounds__(kThreads) gemm_kernel(GemmArgs a) {
  __shared__ float ws[kBK][kLd];  // ws[kk][m]: weight of row row0 + m at column k0 + kk
  __shared__ float xs[kBK][kLd];  // xs[kk][t]: x of pair t of the tile at column k0 + kk
  __shared__ int pair_of[kBT];
  const int tid = threadIdx.x;
  const int tx = tid & 15, ty = tid >> 4;       // compute: rows tx + 16 i, pairs ty + 16 j
  const int lr = tid >> 2, lv = (tid & 3) * 8;  // load: row / pair lr, columns lv .. lv + 7
  const int64_t in = a.w.in, out = a.w.out;
  const int64_t row0 = int64_t(blockIdx.x) * kBM;
  const bool routed = a.tiles.order != nullptr;
  const int64_t n_tiles = routed ? min(int64_t(*a.tiles.n_tiles), a.max_tiles) : (a.n_pairs + kBT - 1) / kBT;

  for (int64_t tile = blockIdx.y; tile < n_tiles; tile += gridDim.y) {
    int64_t expert = 0, start = tile * kBT, count = min(int64_t(kBT), a.n_pairs - tile * kBT);
    if (routed) {
      expert = a.tiles.expert[tile];
      start = a.tiles.start[tile];
      count = a.tiles.count[tile];
    }
    __syncthreads();  // the previous tile's stores have read pair_of
    if (tid < kBT) pair_of[tid] = tid < count ? (routed ? a.tiles.order[start + tid] : int(start + tid)) : -1;
    __syncthreads();

    const int lpair = pair_of[lr];
    const float* xrow = lpair >= 0 ? a.x + (a.map.x_per_slot ? int64_t(lpair) : lpair / a.map.k) * in : nullptr;
    const int64_t lrow = row0 + lr;
    float acc[4][4] = {};
    for (int64_t k0 = 0; k0 < in; k0 += kBK) {
      float wv[8], xv[8];
      if (lrow < out) {
        Loader::load8(a.w, expert, lrow, k0 + lv, wv);
      } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) wv[j] = 0.0f;
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) xv[j] = xrow && k0 + lv + j < in ? xrow[k0 + lv + j] : 0.0f;
      __syncthreads();  // the previous step's reads of ws / xs are done
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        ws[lv + j][lr] = wv[j];
        xs[lv + j][lr] = xv[j];
      }
      __syncthreads();
#pragma unroll 8
      for (int kk = 0; kk < kBK; ++kk) {
        float wr[4], xr[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) wr[i] = ws[kk][tx + 16 * i];
#pragma unroll
        for (int j = 0; j < 4; ++j) xr[j] = xs[kk][ty + 16 * j];
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(wr[i], xr[j], acc[i][j]);
      }
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int pair = pair_of[ty + 16 * j];
      if (pair < 0) continue;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int64_t row = row0 + tx + 16 * i;
        if (row < out) a.y[int64_t(pair) * out + row] = acc[i][j];
      }
    }
  }
}

// One block groups the n_pairs (token, slot) pairs by expert: order[] lists pair ids expert by expert, and the
// tile list cuts each expert's run into tiles of at most kBT pairs. A pair with an out-of-range expert index
// gets a NaN output row, is left out of every tile and raises kErrExpertIndex.
// Preconditions: dynamic shared memory 2 * n_experts ints; n_pairs < 2^31; tile arrays hold max_tiles >=
// ceil(n_pairs / kBT) + min(n_experts, n_pairs) entries.
__global__ void route_kernel(const int32_t* indices, int64_t n_pairs, int n_experts, int32_t* order, int32_t* t_expert,
                             int32_t* t_start, int32_t* t_count, int32_t* n_tiles, float* y, int64_t out,
                             unsigned* err) {
  extern __shared__ int route_smem[];
  int* count = route_smem;
  int* fill = route_smem + n_experts;
  for (int e = threadIdx.x; e < n_experts; e += blockDim.x) count[e] = 0;
  __syncthreads();
  for (int64_t p = threadIdx.x; p < n_pairs; p += blockDim.x) {
    const int32_t e = indices[p];
    if (e >= 0 && e < n_experts) {
      atomicAdd(&count[e], 1);
    } else {
      raise_device_error(err, kErrExpertIndex);
      for (int64_t r = 0; r < out; ++r) y[p * out + r] = __int_as_float(0x7fc00000);
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int pos = 0, t = 0;
    for (int e = 0; e < n_experts; ++e) {
      fill[e] = pos;
      const int c = count[e];
      for (int s = 0; s < c; s += kBT) {
        t_expert[t] = e;
        t_start[t] = pos + s;
        t_count[t] = min(kBT, c - s);
        ++t;
      }
      pos += c;
    }
    *n_tiles = t;
  }
  __syncthreads();
  // Order inside an expert's run depends on atomics, but each output value is computed from its own pair only,
  // so results do not.
  for (int64_t p = threadIdx.x; p < n_pairs; p += blockDim.x) {
    const int32_t e = indices[p];
    if (e >= 0 && e < n_experts) order[atomicAdd(&fill[e], 1)] = int32_t(p);
  }
}

template <class Loader>
void launch_typed(const Ctx& ctx, dim3 grid, const GemmArgs& a) {
  gemm_kernel<Loader><<<grid, kThreads, 0, ctx.stream>>>(a);
  CUDA_CHECK_LAUNCH();
}

int64_t max_tiles_for(int64_t n_experts, int64_t n_pairs) {
  return (n_pairs + kBT - 1) / kBT + std::min(n_experts, n_pairs);
}

}  // namespace

void launch_gemm_simt(const Ctx& ctx, const WeightView& w, const float* x, const PairMap& map, int64_t n_pairs,
                      const TileList* tiles, int64_t max_tiles, float* y) {
  if (n_pairs == 0 || w.out == 0) return;
  CUDA_REQUIRE(w.in > 0 && n_pairs > 0 && n_pairs < (int64_t(1) << 31), "gemm: bad in / pair count");
  GemmArgs a{w, x, y, map, n_pairs, tiles ? *tiles : TileList{}, max_tiles};
  const int64_t row_blocks = (w.out + kBM - 1) / kBM;
  const int64_t tile_blocks = tiles ? max_tiles : (n_pairs + kBT - 1) / kBT;
  CUDA_REQUIRE(row_blocks < (int64_t(1) << 31), "gemm: too many output rows");
  const dim3 grid{unsigned(row_blocks), unsigned(std::min<int64_t>(std::max<int64_t>(tile_blocks, 1), 65535))};
  if (w.bits != 0) {
    CUDA_REQUIRE(w.in % kBK == 0 && w.group_size > 0 && w.group_size % kBK == 0,
                 "gemm: quantized rows need in and group_size multiples of 32");
    CUDA_REQUIRE(w.bits >= 2 && w.bits <= 8, "gemm: unsupported bits " + std::to_string(w.bits));
    switch (w.stype) {
      case FloatType::kF32: launch_typed<QuantLoader<float>>(ctx, grid, a); break;
      case FloatType::kF16: launch_typed<QuantLoader<__half>>(ctx, grid, a); break;
      case FloatType::kBF16: launch_typed<QuantLoader<__nv_bfloat16>>(ctx, grid, a); break;
    }
    return;
  }
  switch (w.wtype) {
    case FloatType::kF32: launch_typed<DenseLoader<float>>(ctx, grid, a); break;
    case FloatType::kF16: launch_typed<DenseLoader<__half>>(ctx, grid, a); break;
    case FloatType::kBF16: launch_typed<DenseLoader<__nv_bfloat16>>(ctx, grid, a); break;
  }
}

namespace {

// MOECEL_CUDA_MMA: the tensor-core kernel's precision, or nothing for the CUDA-core kernel (0). Read on every call
// (a getenv per launch is nothing next to a prefill GEMM), so tests can switch it.
std::optional<MmaPrecision> mma_mode() {
  const char* env = std::getenv("MOECEL_CUDA_MMA");
  const std::string mode = env ? env : "";
  CUDA_REQUIRE(mode.empty() || mode == "0" || mode == "1" || mode == "fast",
               "MOECEL_CUDA_MMA must be 0 (CUDA cores), 1 (tensor cores, the default) or fast (tensor cores, x "
               "rounded to bf16); got '" +
                   mode + "'");
  if (mode == "0") return std::nullopt;
  return mode == "fast" ? MmaPrecision::kBf16X : MmaPrecision::kSplitX;
}

}  // namespace

void launch_gemm(const Ctx& ctx, const WeightView& w, const float* x, const PairMap& map, int64_t n_pairs,
                 const TileList* tiles, int64_t max_tiles, float* y, void* scratch) {
  if (const auto precision = mma_mode()) {
    if (launch_gemm_mma(ctx, w, x, map, n_pairs, tiles, max_tiles, y, *precision, scratch)) return;
  }
  launch_gemm_simt(ctx, w, x, map, n_pairs, tiles, max_tiles, y);
}

bool gemm_glu_applies(const Ctx& ctx, const WeightView& gate, const WeightView& up, const float* x) {
  const auto precision = mma_mode();
  return precision && *precision == MmaPrecision::kSplitX && mma_glu_supported(ctx, gate, up, x);
}

bool launch_gemm_parts(const Ctx& ctx, std::span<const WeightView> ws, std::span<float* const> ys, const float* x,
                       int64_t n_tokens, void* scratch) {
  for (const WeightView& w : ws)  // launch_linear would run this one elsewhere: keep its arithmetic
    if (linear_prefers_gemv(w, n_tokens)) return false;
  const auto precision = mma_mode();
  return precision && launch_gemm_mma_parts(ctx, ws, ys, x, n_tokens, *precision, scratch);
}

size_t route_scratch_bytes(int64_t n_experts, int64_t n_pairs) {
  return size_t(n_pairs + 3 * max_tiles_for(n_experts, n_pairs) + 1) * sizeof(int32_t);
}

TileList launch_route(const Ctx& ctx, const WeightView& w, const int32_t* indices, int64_t n_pairs, float* y,
                      void* scratch, int64_t* max_tiles) {
  CUDA_REQUIRE(w.n_stack >= 1 && w.n_stack <= 4096, "gather: at most 4096 experts are supported");
  CUDA_REQUIRE(n_pairs > 0 && n_pairs < (int64_t(1) << 31), "gather: bad pair count");
  const int64_t mt = max_tiles_for(w.n_stack, n_pairs);
  int32_t* base = static_cast<int32_t*>(scratch);
  TileList t;
  int32_t* order = base;
  int32_t* t_expert = order + n_pairs;
  int32_t* t_start = t_expert + mt;
  int32_t* t_count = t_start + mt;
  int32_t* n_tiles = t_count + mt;
  const size_t smem = 2 * size_t(w.n_stack) * sizeof(int);
  route_kernel<<<1, 1024, smem, ctx.stream>>>(indices, n_pairs, int(w.n_stack), order, t_expert, t_start, t_count,
                                              n_tiles, y, w.out, ctx.error_flag);
  CUDA_CHECK_LAUNCH();
  t.order = order;
  t.expert = t_expert;
  t.start = t_start;
  t.count = t_count;
  t.n_tiles = n_tiles;
  *max_tiles = mt;
  return t;
}

}  // namespace moecel::cuda
