// How fast a short burst of weight copies streams, as kernel A's: a graph of PDL kernels, each step's blocks copying
// their own tile of a fresh region (regions rotate over a buffer several times the L2) into shared memory with bulk
// copies, in two halves ("gate" and "up"), then a token sum so the data is used. Modes:
//   once     both halves issued at once, one barrier
//   staged   the second half issued once the first has landed (kernel A's order)
//   l2pf     as staged, with the second half requested into L2 (cp.async.bulk.prefetch.L2) together with the first
//   empty    no copies (the step's fixed cost)
//   ldgsts   both halves by every thread's 16-byte cp.async copies (LDGSTS) instead of the bulk-copy unit
//   ldg      both halves by every thread's 16-byte loads into registers (summed; nothing staged)
//   mixed    the first half by bulk copies, the second by LDGSTS, at once
// (the last three: whether the bulk-copy unit, rather than DRAM or L2, bounds how fast an SM takes in a burst).
// All copies go out after pdl_wait, as kernel A's (its experts come from the kernel before). Prints us per step
// and the bytes per us beyond the empty step. With --resident 1 every step copies the same region instead, which
// then stays in L2: how fast the same bursts land from L2. Built only with the CUDA backend.
// Usage: bench_cuda_burst [--steps N] [--reps N] [--resident 0|1]
#include <cuda_runtime.h>

#include <cstdio>

#include "backend/cuda/bulk_copy.cuh"
#include "backend/cuda/cuda_common.cuh"
#include "cuda_bench_util.cuh"

namespace {

using namespace moecel::cuda;

constexpr int kThreads = 256;

// Modes ldgsts (4), ldg (5) and mixed (6) of burst_kernel: the block's tile [src, src + 2 half) moved by every
// thread's 16-byte copies or loads (mixed: the first half by one bulk copy on bar). Returns a token sum of the data.
__device__ float thread_burst(int mode, unsigned char* tile, const unsigned char* src, unsigned half, uint64_t* bar) {
  const unsigned from = mode == 6 ? half : 0u, n16 = (2 * half - from) / 16;
  if (mode == 6 && threadIdx.x == 0) {
    mbar_arrive_expect(bar, half);
    bulk_copy(tile, src, half, bar);
  }
  float s = 0.0f;
  if (mode == 5) {  // 8 loads in flight per thread, nothing staged
    constexpr int kU = 8;
    const float4* g4 = reinterpret_cast<const float4*>(src);
    for (unsigned i0 = threadIdx.x; i0 < n16; i0 += kU * kThreads) {
      float4 v[kU];
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const unsigned i = i0 + u * kThreads;
        v[u] = i < n16 ? __ldcg(g4 + i) : make_float4(0.f, 0.f, 0.f, 0.f);
      }
#pragma unroll
      for (int u = 0; u < kU; ++u) s += v[u].x + v[u].y + v[u].z + v[u].w;
    }
    return s;
  }
  for (unsigned i = threadIdx.x; i < n16; i += kThreads) {
    const unsigned dst = unsigned(__cvta_generic_to_shared(tile + from + 16 * i));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src + from + 16 * i) : "memory");
  }
  asm volatile("cp.async.wait_all;" ::: "memory");
  if (mode == 6) mbar_wait(bar, 0);
  __syncthreads();
  const float* f = reinterpret_cast<const float*>(tile);
  for (unsigned i = threadIdx.x; i < 2 * half / 4; i += 97 * kThreads) s += f[i];
  return s;
}

// Block b of step s copies half0 = [base, base + half) and half1 = [base + half, base + 2 half) of its tile.
__global__ void __launch_bounds__(kThreads) burst_kernel(const unsigned char* w, int64_t region_bytes, int n_regions,
                                                         int step, unsigned half, int mode, float* out) {
  extern __shared__ float4 smem4[];
  __shared__ uint64_t bars[2];
  unsigned char* tile = reinterpret_cast<unsigned char*>(smem4);
  if (threadIdx.x < 2) mbar_init(&bars[threadIdx.x], 1);
  __syncthreads();
  pdl_wait();
  pdl_trigger();
  const unsigned char* src = w + int64_t(step % n_regions) * region_bytes + int64_t(blockIdx.x) * 2 * half;
  if (mode == 3) {  // empty
    if (threadIdx.x == 0) out[blockIdx.x] = float(step);
    return;
  }
  if (mode >= 4) {  // ldgsts, ldg, mixed
    const float v = thread_burst(mode, tile, src, half, &bars[0]);
    if (v == 12345.0f) out[blockIdx.x] = v;
    if (threadIdx.x == 0) out[blockIdx.x] = float(step);
    return;
  }
  if (threadIdx.x == 0) {
    if (mode == 0) {
      mbar_arrive_expect(&bars[0], 2 * half);
      bulk_copy(tile, src, half, &bars[0]);
      bulk_copy(tile + half, src + half, half, &bars[0]);
    } else {
      mbar_arrive_expect(&bars[0], half);
      bulk_copy(tile, src, half, &bars[0]);
      if (mode == 2) bulk_prefetch_l2(src + half, half);
    }
  }
  mbar_wait(&bars[0], 0);
  if (mode != 0 && threadIdx.x == 0) {
    mbar_arrive_expect(&bars[1], half);
    bulk_copy(tile + half, src + half, half, &bars[1]);
  }
  if (mode != 0) mbar_wait(&bars[1], 0);
  // A token use of the data: each thread sums a few words.
  const float* f = reinterpret_cast<const float*>(tile);
  float s = 0.0f;
  for (unsigned i = threadIdx.x; i < 2 * half / 4; i += 97 * kThreads) s += f[i];
  if (s == 12345.0f) out[blockIdx.x] = s;
  if (threadIdx.x == 0) out[blockIdx.x] = float(step);
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = moecel::bench::arg_int(argc, argv, "--steps", 64);
  const int reps = moecel::bench::arg_int(argc, argv, "--reps", 20);
  const bool resident = moecel::bench::arg_int(argc, argv, "--resident", 0) != 0;
  int sms = 0, l2 = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
  const int64_t region = 40ll << 20;  // bytes per step's region (>= the largest burst)
  const int n_regions = resident ? 1 : int((8ll * l2 + region - 1) / region);  // else a rotation over ~8x the L2
  unsigned char* w;
  float* out;
  CUDA_CHECK(cudaMalloc(&w, size_t(region) * n_regions));
  CUDA_CHECK(cudaMemset(w, 0, size_t(region) * n_regions));
  CUDA_CHECK(cudaMalloc(&out, 4096 * sizeof(float)));
  cudaStream_t st;
  CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  std::printf("%d SMs, L2 %d MB, %d regions of %lld MB, %d steps per graph, %d replays\n", sms, l2 >> 20, n_regions,
              (long long)(region >> 20), steps, reps);
  std::printf("%-7s %6s %8s %9s %12s %10s\n", "mode", "blocks", "tile_KB", "burst_MB", "us_per_step", "GB/s_extra");
  const char* names[] = {"once", "staged", "l2pf", "empty", "ldgsts", "ldg", "mixed"};
  auto run = [&](int mode, int blocks, unsigned half) -> double {
    const size_t smem = 2 * size_t(half);
    CUDA_CHECK(cudaFuncSetAttribute(burst_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    return moecel::bench::chain_step_us(
        st, steps, reps, dim3(blocks), kThreads, true, nullptr, nullptr,
        [&](const cudaLaunchConfig_t& cfg, int s, const float*, float*) {
          CUDA_CHECK(cudaLaunchKernelEx(&cfg, burst_kernel, static_cast<const unsigned char*>(w), region, n_regions, s,
                                        half, mode, out));
        },
        smem);
  };
  // Kernel A's shape: 512 blocks (4 per SM) of 2 x 18 KB; the same bytes in fewer, larger blocks; half the bytes.
  const struct {
    int blocks;
    unsigned half_kb;
  } shapes[] = {{512, 18}, {256, 36}, {128, 72}, {512, 9}, {132, 36}};
  for (const auto& sh : shapes) {
    const unsigned half = sh.half_kb * 1024;
    const double empty = run(3, sh.blocks, half);
    for (int mode : {0, 1, 2, 4, 5, 6}) {
      const double us = run(mode, sh.blocks, half);
      const double mb = double(sh.blocks) * 2 * half / 1e6;
      std::printf("%-7s %6d %8u %9.1f %12.3f %10.0f\n", names[mode], sh.blocks, 2 * sh.half_kb, mb, us,
                  mb * 1e6 / 1e3 / (us - empty));
    }
    std::printf("%-7s %6d %8u %9.1f %12.3f\n", "empty", sh.blocks, 2 * sh.half_kb, 0.0, empty);
  }
  return 0;
}
