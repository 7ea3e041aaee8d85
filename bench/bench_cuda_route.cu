// What routing inside an expert launch costs its blocks: a chain of `--layers` pairs of launches (PDL, one graph)
// where a producer hands an expert launch its routing two ways:
//   index    the producer's block 0 writes the k chosen experts (as the router reduction does today); each expert
//            block reads its slot's index after its wait;
//   rank     the producer's 128 blocks add their shares of 64 logits into 64-bit fixed-point words with
//            red.global.add (as an o projection with the router's share would); each expert block loads the 64 words
//            after its wait (one 16-byte load per lane of one warp) and ranks them itself (four threads per expert,
//            each counting the words above its own in a quarter of them: ties to the lower expert), the expert whose
//            rank is the block's slot being its own.
// A third mode has the producer do both and the expert blocks read the index (the atomics' cost apart).
// Either way the expert block (grid: 64 tiles x k slots, like kernel A's) then bulk-copies its 36 KB of rows from
// that expert's region and waits for them. Prints us per pair, and the blocks' median / p90 / max cycles from the
// wait's return to the words loaded (rank), the expert known and the rows landed (the last pair of the last replay).
// Checks the ranked experts against the host's ranking of the same integer sums. Built only with the CUDA backend.
// Usage: bench_cuda_route [--layers N] [--reps N] [--k K] [--keys 64|32]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <type_traits>
#include <vector>

#include "backend/cuda/bulk_copy.cuh"
#include "cuda_bench_util.cuh"

namespace {

using namespace moecel::cuda;

constexpr int kExperts = 64, kParts = 128, kTiles = 64, kThreads = 256;
constexpr int kRowBytes = 36 * 1024;  // one block's gate + up rows (OLMoE: 16 rows of each, 4-bit g64)

struct Route {
  const unsigned char* w = nullptr;     // (layers, experts, tiles, kRowBytes)
  int32_t* indices = nullptr;           // (layers, k)
  unsigned long long* words = nullptr;  // (layers, experts)
  long long* stamps = nullptr;          // (tiles * k, 3): cycles to the words loaded, the expert known, the rows landed
  int32_t* picked = nullptr;            // (k): the last layer's experts as block (0, slot) ranked them
  int k = 8, layers = 16;
};

// A part's logit share, the same on the host (an integer, so the sums are exact in any order).
__host__ __device__ inline long long share(int layer, int part, int e) {
  const unsigned h = unsigned(layer * 7919 + part * 104729 + e * 1299709) * 2654435761u;
  return (long long)(h >> 8) - (1ll << 23);
}

// Modes: 0 index, 1 rank, 2 both the producer's (the words added and the indices written) with the expert blocks
// reading the index: what the atomics cost apart from the ranking.
__global__ void __launch_bounds__(kThreads) producer_kernel(Route r, int layer, int mode) {
  pdl_wait();
  pdl_trigger();
  if (mode != 0 && threadIdx.x < kExperts) {
    atomicAdd(r.words + int64_t(layer) * kExperts + threadIdx.x,
              (unsigned long long)share(layer, blockIdx.x, threadIdx.x));
  }
  if (mode != 1 && blockIdx.x == 0 && threadIdx.x < r.k) {
    r.indices[layer * r.k + threadIdx.x] = (layer * 5 + threadIdx.x * 7) % kExperts;
  }
}

// kF32: the words ranked as floats (one compare instead of two 64-bit ones; sums within a float's rounding of each
// other then rank by expert index).
template <bool kF32>
__global__ void __launch_bounds__(kThreads) expert_kernel(Route r, int layer, bool rank) {  // rank: mode 1
  using Key = std::conditional_t<kF32, float, long long>;
  extern __shared__ float4 smem4[];
  __shared__ uint64_t bar;
  __shared__ Key w[kExperts];
  __shared__ int expert;
  const int tile = blockIdx.x, slot = blockIdx.y;
  if (threadIdx.x == 0) mbar_init(&bar, 1);
  __syncthreads();
  pdl_wait();
  pdl_trigger();
  const long long t0 = clock64();
  long long tw = 0;
  if (rank) {
    if (threadIdx.x < kExperts / 2) {  // warp 0: two words per lane, one 16-byte load
      const longlong2 v = __ldcg(reinterpret_cast<const longlong2*>(r.words + int64_t(layer) * kExperts) + threadIdx.x);
      w[2 * threadIdx.x] = Key(v.x);
      w[2 * threadIdx.x + 1] = Key(v.y);
    }
    __syncthreads();
    tw = clock64();
    // Thread (e, q) counts the words of experts q, q + 4, ... above expert e's; the four quarters (lanes
    // 4 e .. 4 e + 3 of one warp) are added by two shuffles.
    static_assert(kThreads == 4 * kExperts, "four threads per expert");
    const int e = threadIdx.x >> 2, q = threadIdx.x & 3;
    const Key mine = w[e];
    int above = 0;
#pragma unroll
    for (int i = 0; i < kExperts / 4; ++i) {
      const int j = 4 * i + q;  // the four quarters' words adjacent: no bank conflicts between them
      above += w[j] > mine || (w[j] == mine && j < e);
    }
    above += __shfl_xor_sync(0xffffffffu, above, 1);
    above += __shfl_xor_sync(0xffffffffu, above, 2);
    if (q == 0 && above == slot) expert = e;
  } else if (threadIdx.x == 0) {
    expert = __ldcg(r.indices + layer * r.k + slot);
  }
  __syncthreads();
  const long long t1 = clock64();
  if (threadIdx.x == 0) {
    mbar_arrive_expect(&bar, kRowBytes);
    const unsigned char* src = r.w + ((int64_t(layer) * kExperts + expert) * kTiles + tile) * kRowBytes;
    bulk_copy(smem4, src, kRowBytes, &bar);
  }
  mbar_wait(&bar, 0);
  const long long t2 = clock64();
  if (layer == r.layers - 1 && threadIdx.x == 0) {
    const int b = slot * kTiles + tile;
    r.stamps[3 * b] = rank ? tw - t0 : t1 - t0;
    r.stamps[3 * b + 1] = t1 - t0;
    r.stamps[3 * b + 2] = t2 - t0;
    if (tile == 0) r.picked[slot] = expert;
  }
}

void print_cycles(const char* what, std::vector<long long> v) {
  std::sort(v.begin(), v.end());
  std::printf("  %-14s median %6lld  p90 %6lld  max %6lld cycles\n", what, v[v.size() / 2], v[v.size() * 9 / 10],
              v.back());
}

}  // namespace

int main(int argc, char** argv) {
  Route r;
  r.layers = std::max(1, moecel::bench::arg_int(argc, argv, "--layers", 16));
  const int reps = moecel::bench::arg_int(argc, argv, "--reps", 50);
  r.k = std::clamp(moecel::bench::arg_int(argc, argv, "--k", 8), 1, 32);
  const size_t w_bytes = size_t(r.layers) * kExperts * kTiles * kRowBytes;
  unsigned char* w;
  CUDA_CHECK(cudaMalloc(&w, w_bytes));
  CUDA_CHECK(cudaMemset(w, 0x3c, w_bytes));
  r.w = w;
  CUDA_CHECK(cudaMalloc(&r.indices, size_t(r.layers) * r.k * 4));
  CUDA_CHECK(cudaMalloc(&r.words, size_t(r.layers) * kExperts * 8));
  CUDA_CHECK(cudaMalloc(&r.stamps, size_t(kTiles) * r.k * 3 * 8));
  CUDA_CHECK(cudaMalloc(&r.picked, size_t(r.k) * 4));
  const bool f32 = moecel::bench::arg_int(argc, argv, "--keys", 64) == 32;
  const auto expert = f32 ? expert_kernel<true> : expert_kernel<false>;
  CUDA_CHECK(cudaFuncSetAttribute(expert, cudaFuncAttributeMaxDynamicSharedMemorySize, kRowBytes));
  cudaStream_t st;
  CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  std::printf("%d pairs of launches, k = %d, %d expert blocks of %d KB, %s keys\n", r.layers, r.k, kTiles * r.k,
              kRowBytes / 1024, f32 ? "f32" : "64-bit");
  for (int mode = 0; mode < 3; ++mode) {
    const bool rank = mode == 1;
    cudaGraph_t g;
    CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    // The words start at zero in every replay (both modes, so that the memset's cost is the same).
    CUDA_CHECK(cudaMemsetAsync(r.words, 0, size_t(r.layers) * kExperts * 8, st));
    Ctx ctx;
    ctx.stream = st;
    ctx.pdl = true;
    for (int layer = 0; layer < r.layers; ++layer) {
      cudaLaunchAttribute a1, a2;
      const cudaLaunchConfig_t c1 = launch_config(ctx, dim3(kParts), dim3(kThreads), 0, a1);
      CUDA_CHECK(cudaLaunchKernelEx(&c1, producer_kernel, r, layer, mode));
      const cudaLaunchConfig_t c2 = launch_config(ctx, dim3(kTiles, r.k), dim3(kThreads), kRowBytes, a2);
      CUDA_CHECK(cudaLaunchKernelEx(&c2, expert, r, layer, rank));
    }
    CUDA_CHECK(cudaStreamEndCapture(st, &g));
    const double us = moecel::bench::graph_replay_us(st, g, reps) / r.layers;
    std::vector<long long> stamps(size_t(kTiles) * r.k * 3);
    CUDA_CHECK(cudaMemcpy(stamps.data(), r.stamps, stamps.size() * 8, cudaMemcpyDeviceToHost));
    std::vector<long long> loaded, known, landed;
    for (size_t i = 0; i < stamps.size(); i += 3) {
      loaded.push_back(stamps[i]);
      known.push_back(stamps[i + 1]);
      landed.push_back(stamps[i + 2]);
    }
    const char* names[3] = {"index", "rank", "index + words"};
    std::printf("%-13s %8.2f us per pair\n", names[mode], us);
    if (rank) print_cycles("words loaded", loaded);
    print_cycles("expert known", known);
    print_cycles("rows landed", landed);
    if (rank) {  // the host's ranking of the last layer's sums: larger first, ties to the lower expert
      std::vector<long long> sum(kExperts, 0);
      for (int e = 0; e < kExperts; ++e) {
        for (int p = 0; p < kParts; ++p) sum[e] += share(r.layers - 1, p, e);
      }
      std::vector<int> order(kExperts);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return sum[a] > sum[b]; });
      std::vector<int32_t> picked(r.k);
      CUDA_CHECK(cudaMemcpy(picked.data(), r.picked, size_t(r.k) * 4, cudaMemcpyDeviceToHost));
      int bad = 0;
      for (int s = 0; s < r.k; ++s) bad += picked[s] != order[s];
      std::printf("  ranking %s (%d of %d slots differ from the host's)\n", bad ? "WRONG" : "matches the host's", bad,
                  r.k);
      if (bad) return 1;
    }
  }
  return 0;
}
